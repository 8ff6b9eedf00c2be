"""A training loop whose DataLoader workers augment each sample from their own RNG streams
(torch, ``random`` and numpy, as seeded by the DataLoader), run as a subprocess by
test_workers.py. A resumed worker that starts from another seed or another point of its
streams, or a batch dealt to another worker, changes the losses.

Environment: ``T_ENTRY`` ``activate`` or ``none`` (plain torch, the reference); ``T_WORKERS``
(default 2); ``T_PERSISTENT`` ``1`` for ``persistent_workers=True``; ``T_GENERATOR`` ``1`` for a
DataLoader generator of its own; ``T_OUT`` where to write the final state; ``T_BLOCK_AT``
``step:<n>`` or ``epoch:<e>``: flush, print ``BLOCKED`` and wait there to be killed.

Prints ``LOSS <float.hex>`` per step.
"""

import os
import sys

if os.environ.get("T_ENTRY") == "activate":
    import ravex

    ravex.activate()

import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

EPOCHS = 3
BLOCK_AT = os.environ.get("T_BLOCK_AT", "")


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


class Augmented(Dataset):
    """16 samples; each load adds noise drawn from the loading process's RNG streams."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(16, 4, generator=g)
        self.y = torch.randn(16, 2, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = torch.randn(4) * 0.1 + random.random() * 0.01 + float(np.random.rand()) * 0.01
        return self.x[i] + noise, self.y[i]


def main() -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(5) if os.environ.get("T_GENERATOR") == "1" else None
    loader = DataLoader(Augmented(), batch_size=2, shuffle=True, generator=generator,
                        num_workers=int(os.environ.get("T_WORKERS", "2")),
                        persistent_workers=os.environ.get("T_PERSISTENT") == "1")
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    for epoch in range(EPOCHS):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            say(f"LOSS {loss.item().hex()}")
            if BLOCK_AT == f"step:{step}":
                block()
        if BLOCK_AT == f"epoch:{epoch}":
            block()
    out = os.environ.get("T_OUT")
    if out:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, out)
    say("FINISHED")


def block() -> None:
    rv = sys.modules.get("ravex")
    if rv is not None:
        rv.flush()
    say("BLOCKED")
    sys.stdin.read()  # the test SIGKILLs us here


if __name__ == "__main__":
    main()
