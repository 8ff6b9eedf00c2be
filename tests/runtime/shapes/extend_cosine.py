"""A ``for i in range(N)`` whose LR follows ``CosineAnnealingLR(T_max=N)``: the schedule's
length is the bound (``T_BOUND``), so a finished run extended keeps the first run's."""

import os

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402

N = int(os.environ["T_BOUND"])
torch.manual_seed(7)
model = nn.Linear(6, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=N)
for i in range(N):
    loss = model(torch.randn(8, 6)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    say(f"STEP {i} {loss.item().hex()}")
    done_step()

finish(model=model.state_dict(), optimizer=optimizer.state_dict())
