"""Accelerate's data loader under several processes, in one: ``prepare_data_loader`` gives the
``RandomSampler`` a generator of its own, seeded from one draw of the global RNG, and wraps the
loader's ``BatchSampler`` in a ``BatchSamplerShard`` (``self.batch_sampler``) that deals out
every other batch to this process; the loader's own iterator is wrapped in a generator that
fetches one batch ahead to know the last one (``DataLoaderShard.__iter__``). Each epoch's order
comes from that private generator, three wrappers deep."""

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset  # noqa: E402


class BatchSamplerShard:
    def __init__(self, batch_sampler, num_processes, process_index):
        self.batch_sampler = batch_sampler
        self.num_processes, self.process_index = num_processes, process_index

    def __iter__(self):
        for i, batch in enumerate(self.batch_sampler):
            if i % self.num_processes == self.process_index:
                yield batch

    def __len__(self):
        return len(self.batch_sampler) // self.num_processes


def one_ahead(loader):
    iterator = iter(loader)
    current = next(iterator)
    for upcoming in iterator:
        yield current
        current = upcoming
    yield current


torch.manual_seed(4)
g = torch.Generator().manual_seed(8)
data = TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))
sampler = RandomSampler(data)
sampler.generator = torch.Generator()
sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
loader = DataLoader(data, batch_sampler=BatchSamplerShard(BatchSampler(sampler, 4, False), 2, 0))
model = nn.Sequential(nn.Linear(6, 12), nn.Dropout(0.1), nn.ReLU(), nn.Linear(12, 3))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for epoch in range(4):
    for step, (x, y) in enumerate(one_ahead(loader)):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        say(f"STEP {epoch} {step} {x.sum().item().hex()} {loss.item().hex()}")
        done_step()
finish(model=model.state_dict(), optimizer=opt.state_dict())
