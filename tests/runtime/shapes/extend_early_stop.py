"""pytorch-template's ``BaseTrainer.train()``: ``for epoch in range(self.start_epoch,
self.epochs + 1)`` (``T_BOUND`` epochs) over a shuffled DataLoader, with early stopping: the
loop's ``break`` sits in an ``if`` nested in the ``if`` that checks whether a metric is
monitored, after the counters the test reads are updated; a checkpoint file per epoch."""

import os

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Trainer:
    def __init__(self, model, loader, epochs):
        self.model = model
        self.loader = loader
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        self.start_epoch, self.epochs = 1, epochs
        self.mnt_mode, self.mnt_best, self.early_stop = "min", float("inf"), 10

    def _train_epoch(self, epoch):
        total = 0.0
        for batch_idx, (x, y) in enumerate(self.loader):
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            total += loss.item()
            say(f"STEP {epoch} {batch_idx} {loss.item().hex()}")
            done_step()
        return {"loss": total / len(self.loader)}

    def train(self):
        not_improved_count = 0
        for epoch in range(self.start_epoch, self.epochs + 1):
            result = self._train_epoch(epoch)
            say(f"EPOCH {epoch} {result['loss'].hex()}")
            best = False
            if self.mnt_mode != "off":
                improved = result["loss"] <= self.mnt_best
                if improved:
                    self.mnt_best = result["loss"]
                    not_improved_count = 0
                    best = True
                else:
                    not_improved_count += 1
                if not_improved_count > self.early_stop:
                    say("EARLY STOP")
                    break
            torch.save({"model": self.model.state_dict(), "epoch": epoch, "best": best}, f"checkpoint-epoch{epoch}.pth")


torch.manual_seed(5)
g = torch.Generator().manual_seed(9)
data = TensorDataset(torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g))
model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
trainer = Trainer(model, DataLoader(data, batch_size=8, shuffle=True), int(os.environ["T_BOUND"]))
trainer.train()
say(f"RESULT {trainer.mnt_best.hex()} {sum(p.sum().item() for p in model.parameters()).hex()}")
finish(model=model.state_dict(), optimizer=trainer.optimizer.state_dict(), best=trainer.mnt_best)
