"""minGPT's shape: the training loop is ``Trainer.run()`` in a module of its own
(shape_trainer.py), its counter on ``self``; the main script's callback samples from the
model (drawing from the RNG) and saves it every few iterations, iteration 0 included."""

import os

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from shape_trainer import Trainer  # noqa: E402
from torch import nn  # noqa: E402

VOCAB, BLOCK = 24, 6
torch.manual_seed(1337)
data = torch.randint(0, VOCAB, (400,), generator=torch.Generator().manual_seed(3))


class Pairs(torch.utils.data.Dataset):
    def __len__(self):
        return len(data) - BLOCK - 1

    def __getitem__(self, i):
        return data[i:i + BLOCK], data[i + 1:i + 1 + BLOCK]


model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Dropout(0.1), nn.Linear(16, VOCAB))


def on_batch_end(trainer):
    say(f"STEP {trainer.iter_num} {trainer.loss.item().hex()}")
    done_step()
    if trainer.iter_num % 10 == 0:
        with torch.no_grad():
            probs = torch.softmax(model(torch.zeros(1, 1, dtype=torch.long))[0, -1], -1)
            sample = torch.multinomial(probs, 5, replacement=True)
        say(f"SAMPLE {trainer.iter_num} {sample.tolist()}")
        torch.save(model.state_dict(), "model.pt")


trainer = Trainer(model, Pairs(), max_iters=34, callback=on_batch_end)
if os.environ.get("T_OUT"):
    trainer.run()
    finish(model=model.state_dict(), optimizer=trainer.optimizer.state_dict(), iter_num=trainer.iter_num)
else:  # as minGPT's chargpt.py ends: nothing after the training
    trainer.run()
