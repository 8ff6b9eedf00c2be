"""minGPT's ``Trainer.run()`` (shape_trainer.Trainer): one ``iter()`` over a DataLoader whose
sampler draws with replacement without end, taken above a ``while True`` that fetches with
``next()``, counts ``iter_num`` and breaks at ``max_iters`` (``T_BOUND``). A finished run's
iterator is mid-epoch: a rerun with a larger bound draws the batches after the ones it consumed."""

import os

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from shape_trainer import Trainer  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402


def report(trainer):
    say(f"STEP {trainer.iter_num} {trainer.loss.item().hex()}")
    done_step()


torch.manual_seed(3)
g = torch.Generator().manual_seed(11)
data = TensorDataset(torch.randn(50, 6, generator=g), torch.randint(0, 3, (50,), generator=g))
model = nn.Sequential(nn.Linear(6, 12), nn.Dropout(0.1), nn.ReLU(), nn.Linear(12, 3))
trainer = Trainer(model, data, int(os.environ["T_BOUND"]), report)
trainer.run()
say(f"RESULT {trainer.iter_num} {sum(p.sum().item() for p in model.parameters()).hex()}")
finish(model=model.state_dict(), optimizer=trainer.optimizer.state_dict(), iter_num=trainer.iter_num)
