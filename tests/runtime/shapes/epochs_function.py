"""pytorch/examples mnist's shape: ``main()`` runs ``for epoch in range(1, E + 1)``:
``train()`` over ``enumerate(train_loader)``, ``test()`` over a second loader, a StepLR
``scheduler.step()`` and a ``torch.save`` of the model into the user's own file per epoch."""

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.optim.lr_scheduler import StepLR  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

EPOCHS = 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.dropout = nn.Dropout(0.25)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(self.dropout(F.relu(self.fc1(x)))), dim=1)


def train(model, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        say(f"STEP {epoch} {batch_idx} {loss.item().hex()}")
        done_step()


def test(model, test_loader, epoch):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            correct += model(data).argmax(dim=1).eq(target).sum().item()
    say(f"TEST {epoch} {correct}/{len(test_loader.dataset)}")


def main():
    torch.manual_seed(1)
    g = torch.Generator().manual_seed(5)
    train_set = TensorDataset(torch.randn(160, 20, generator=g), torch.randint(0, 4, (160,), generator=g))
    test_set = TensorDataset(torch.randn(60, 20, generator=g), torch.randint(0, 4, (60,), generator=g))
    train_loader = DataLoader(train_set, batch_size=16, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=30)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, EPOCHS + 1):
        train(model, train_loader, optimizer, epoch)
        test(model, test_loader, epoch)
        scheduler.step()
        torch.save(model.state_dict(), f"model_epoch_{epoch}.pt")
    finish(model=model.state_dict(), optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict())


if __name__ == "__main__":
    main()
