"""minGPT's ``Trainer.run()``: one ``iter()`` over a DataLoader whose sampler draws with
replacement without end, taken above a ``while True`` that fetches with ``next()``, counts
``iter_num`` and breaks at ``max_iters`` (``T_BOUND``). A finished run's iterator is mid-epoch:
a rerun with a larger bound draws the batches after the ones it consumed."""

import os

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler, TensorDataset  # noqa: E402


class Trainer:
    def __init__(self, model, dataset, max_iters):
        self.model = model
        self.dataset = dataset
        self.max_iters = max_iters
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)

    def run(self):
        sampler = RandomSampler(self.dataset, replacement=True, num_samples=int(1e10))
        train_loader = DataLoader(self.dataset, sampler=sampler, batch_size=4)
        self.iter_num = 0
        data_iter = iter(train_loader)
        while True:
            try:
                batch = next(data_iter)
            except StopIteration:
                data_iter = iter(train_loader)
                batch = next(data_iter)
            x, y = batch
            loss = F.cross_entropy(self.model(x), y)
            self.model.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            say(f"STEP {self.iter_num} {x.sum().item().hex()} {loss.item().hex()}")
            done_step()
            self.iter_num += 1
            if self.max_iters is not None and self.iter_num >= self.max_iters:
                break


torch.manual_seed(3)
g = torch.Generator().manual_seed(11)
data = TensorDataset(torch.randn(50, 6, generator=g), torch.randint(0, 3, (50,), generator=g))
model = nn.Sequential(nn.Linear(6, 12), nn.Dropout(0.1), nn.ReLU(), nn.Linear(12, 3))
trainer = Trainer(model, data, int(os.environ["T_BOUND"]))
trainer.run()
say(f"RESULT {trainer.iter_num} {sum(p.sum().item() for p in model.parameters()).hex()}")
finish(model=model.state_dict(), optimizer=trainer.optimizer.state_dict(), iter_num=trainer.iter_num)
