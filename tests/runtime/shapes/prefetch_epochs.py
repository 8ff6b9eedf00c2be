"""An image-classification trainer's shape: the epoch loop in the main script, the epoch's
loop in a function of the user's module (shape_trainer.train_one_epoch) over a prefetching
generator of that module, an update counter and a running mean carried through the epoch,
and the epochs' results appended to a list, each epoch evaluated over a loader of its own. The
checkpoint is taken while the prefetcher draws the batch ahead and the function waits on its
``for``; at an epoch's end (the prefetcher drained the loader), at the next epoch's head, not
in the evaluation that comes first. As timm's ``train.py``, it logs every update to a file
(``logging.FileHandler``, which appends) and appends each epoch's row to ``summary.csv``."""

from probe import done_step, entry, finish, say  # noqa: F401

entry()

import logging  # noqa: E402

import torch  # noqa: E402
from shape_trainer import evaluate, train_one_epoch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

torch.manual_seed(0)
x = torch.randn(96, 8, generator=torch.Generator().manual_seed(1))
y = torch.randint(0, 4, (96,), generator=torch.Generator().manual_seed(2))
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
val_loader = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=8)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
log = logging.getLogger("train")
log.addHandler(logging.FileHandler("train.log"))
log.setLevel(logging.INFO)
log.propagate = False
num_updates = 0
results = []
for epoch in range(3):
    num_updates, mean = train_one_epoch(epoch, model, loader, opt, num_updates)
    results.append(mean)
    with open("summary.csv", mode="a") as summary:
        summary.write(f"{epoch},{mean.hex()}\n")
    say(f"EPOCH {epoch} {num_updates} {len(results)} {[r.hex() for r in results]} {evaluate(model, val_loader)}")
finish(model=model.state_dict(), optimizer=opt.state_dict(), num_updates=num_updates)
