"""pytorch/examples mnist's ending: ``main()`` runs ``for epoch in range(1, E + 1)`` over a
shuffled DataLoader, saves the model per epoch into the user's own file, keeps the best test
accuracy and prints it after the loop. ``T_BOUND`` is ``E``."""

import os

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def train(model, loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        say(f"STEP {epoch} {batch_idx} {loss.item().hex()}")
        done_step()


def test(model, loader):
    model.eval()
    with torch.no_grad():
        return sum(model(x).argmax(dim=1).eq(y).sum().item() for x, y in loader)


def main():
    epochs = int(os.environ["T_BOUND"])
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(5)
    train_set = TensorDataset(torch.randn(80, 10, generator=g), torch.randint(0, 3, (80,), generator=g))
    test_set = TensorDataset(torch.randn(30, 10, generator=g), torch.randint(0, 3, (30,), generator=g))
    train_loader = DataLoader(train_set, batch_size=8, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=10)
    model = nn.Sequential(nn.Linear(10, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    best = 0
    for epoch in range(1, epochs + 1):
        train(model, train_loader, optimizer, epoch)
        correct = test(model, test_loader)
        say(f"EPOCH {epoch} {correct}")
        best = max(best, correct)
        torch.save(model.state_dict(), f"model_epoch_{epoch}.pt")
    say(f"RESULT {epoch} {best} {sum(p.sum().item() for p in model.parameters()).hex()}")
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), best=best)


if __name__ == "__main__":
    main()
