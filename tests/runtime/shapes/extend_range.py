"""A module-level ``for i in range(N)``, ``N`` from the command line (``T_BOUND``), a running
total carried across iterations, and the result printed after the loop from it."""

import os

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402

N = int(os.environ["T_BOUND"])
torch.manual_seed(7)
model = nn.Linear(6, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
total = 0.0
for i in range(N):
    x = torch.randn(8, 6)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    total += loss.item()
    say(f"STEP {i} {loss.item().hex()}")
    done_step()

say(f"RESULT {i} {total.hex()} {sum(p.sum().item() for p in model.parameters()).hex()}")
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), total=total)
