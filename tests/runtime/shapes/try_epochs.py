"""word_language_model's shape: the module-level epoch loop inside ``try:`` (Ctrl-C ends
training early), the best model saved by epoch, and after the ``try`` the script loads the
best model back and evaluates it."""

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

torch.manual_seed(3)
x = torch.randn(40, 6)
y = (x.sum(1) > 0).long()
model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Dropout(0.1), nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
best = None


def train():
    model.train()
    for i in range(0, 40, 8):
        loss = F.cross_entropy(model(x[i:i + 8]), y[i:i + 8])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        say(f"STEP {i} {loss.item().hex()}")
        done_step()


try:
    for epoch in range(1, 5):
        train()
        model.eval()
        with torch.no_grad():
            val = F.cross_entropy(model(x), y).item()
        say(f"EVAL {epoch} {val.hex()}")
        if best is None or val < best:
            torch.save(model.state_dict(), "best.pt")
            best = val
except KeyboardInterrupt:
    say("interrupted")

model.load_state_dict(torch.load("best.pt", weights_only=True))
with torch.no_grad():
    say(f"FINAL {F.cross_entropy(model(x), y).item().hex()}")
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), best=best)
