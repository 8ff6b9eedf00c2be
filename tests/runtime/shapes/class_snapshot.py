"""minGPT-ddp's shape in one process: the trainer class in its own module rebinds its epoch
variable (``epoch += 1``) and keeps a snapshot of its own of the finished training, which it
loads itself when it starts (shape_trainer.SnapshotTrainer). ``T_OWN_SNAPSHOTS=1``: one every
two epochs too, and an evaluation after each epoch, as minGPT-ddp."""

import os

from probe import entry, finish

entry()

import torch  # noqa: E402
from shape_trainer import SnapshotTrainer  # noqa: E402
from torch import nn  # noqa: E402

VOCAB, BLOCK = 20, 5
torch.manual_seed(11)
data = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(4))
pairs = [(data[i:i + BLOCK], data[i + 1:i + 1 + BLOCK]) for i in range(0, 48, 1)]
model = nn.Sequential(nn.Embedding(VOCAB, 12), nn.Dropout(0.1), nn.Linear(12, VOCAB))
if os.environ.get("T_OWN_SNAPSHOTS"):  # minGPT-ddp's: a snapshot every 2 epochs, an evaluation after each
    trainer = SnapshotTrainer(model, pairs, max_epochs=4, save_every=2, evaluate=pairs[:8])
else:
    trainer = SnapshotTrainer(model, pairs, max_epochs=4)
trainer.train()
finish(model=model.state_dict(), optimizer=trainer.optimizer.state_dict())
