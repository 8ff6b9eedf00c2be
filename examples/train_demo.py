"""A small, real training script: a tiny CNN on synthetic images.

Dropout, AdamW, a cosine LR schedule with warm-up, a shuffled DataLoader — and not one
line about checkpointing. Two ways to make it crash-proof:

    ravex enable                      # once per environment
    echo "checkpoint_every: 10" > ravex.yaml
    python examples/train_demo.py     # kill it any time; run it again: it resumes

or, explicitly, ``python examples/train_demo.py --activate`` (or ``DEMO_ACTIVATE=1``),
which calls ``ravex.activate()`` first.

``--digest-out FILE`` writes a SHA-256 of the final parameters, so two runs can be
compared bit for bit (scripts/demo.sh does).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--activate", action="store_true", help="call ravex.activate() first")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--digest-out", help="write the final parameters' SHA-256 here")
    return p.parse_args()


args = parse_args()
if args.activate or os.environ.get("DEMO_ACTIVATE") == "1":
    import ravex

    ravex.activate()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def synthetic_images(n: int = 512) -> TensorDataset:
    """Ten classes of 16x16 blobs: learnable, deterministic, no download."""
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (n,), generator=g)
    centres = torch.rand(10, 2, generator=g) * 12 + 2
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    c = centres[labels]
    images = torch.exp(-((yy - c[:, 0, None, None]) ** 2 + (xx - c[:, 1, None, None]) ** 2) / 8)
    images = images + 0.3 * torch.randn(n, 16, 16, generator=g)
    return TensorDataset(images.unsqueeze(1), labels)


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.3), nn.Linear(32 * 4 * 4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def main() -> None:
    torch.manual_seed(42)
    loader = DataLoader(synthetic_images(), batch_size=32, shuffle=True, num_workers=args.workers)
    model = TinyCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    total = args.epochs * len(loader)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=total, pct_start=0.2)
    loss_fn = nn.CrossEntropyLoss()
    ravex = sys.modules.get("ravex")  # only to label the lines; training does not need it

    for epoch in range(args.epochs):
        model.train()
        for images, labels in loader:
            opt.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            opt.step()
            sched.step()
            step = f"step {ravex.step():4d}" if ravex is not None else "step"
            print(f"epoch {epoch} {step} loss {loss.item():.6f} lr {sched.get_last_lr()[0]:.2e}",
                  flush=True)

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    print(f"final parameters sha256 {digest.hexdigest()}", flush=True)
    if args.digest_out:
        with open(args.digest_out, "w") as fh:
            fh.write(digest.hexdigest() + "\n")


if __name__ == "__main__":
    main()
