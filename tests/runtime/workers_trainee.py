"""A training loop whose DataLoader workers augment each sample from their own RNG streams
(torch, ``random`` and numpy, as seeded by the DataLoader), run as a subprocess by
test_workers.py and test_lookahead.py. A resumed worker that starts from another seed or another
point of its streams, a batch dealt to another worker, or a batch skipped, changes the losses.

Environment: ``T_ENTRY`` ``activate`` or ``none`` (plain torch, the reference); ``T_WORKERS``
(default 2); ``T_PERSISTENT`` ``1`` for ``persistent_workers=True``; ``T_GENERATOR`` ``1`` for a
DataLoader generator of its own; ``T_OUT`` where to write the final state; ``T_BLOCK_AT``
``step:<n>`` or ``epoch:<e>``: flush, print ``BLOCKED`` and wait there to be killed. ``T_AHEAD``:
how the loop draws its batches: ``""`` from the DataLoader; ``1`` through a generator that keeps
the next batch ready; ``2`` through a queue of two; ``next`` through a prefetcher object whose
``next()`` returns a batch and fetches the one after it (``while batch is not None``);
``accelerate`` through Accelerate's prepared DataLoader. ``T_NO_LOOKAHEAD=1`` turns Ravex's
look-ahead rule off (the witness must then say the resume diverged).

Prints ``LOSS <float.hex>`` per step.
"""

import os
import sys

if os.environ.get("T_ENTRY") == "activate":
    import ravex

    ravex.activate()

import collections
import random

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

EPOCHS = 3
BLOCK_AT = os.environ.get("T_BLOCK_AT", "")
AHEAD = os.environ.get("T_AHEAD", "")

if os.environ.get("T_NO_LOOKAHEAD") == "1":
    import ravex.runtime.state.plan

    ravex.runtime.state.plan.held = lambda st: 0


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


def one_ahead(loader):
    """Yield each batch once the next one is fetched, as a device prefetcher does."""
    it = iter(loader)
    try:
        ready = next(it)
    except StopIteration:
        return
    for batch in it:
        yield ready
        ready = batch
    yield ready


def queued(loader, depth):
    queue = collections.deque()
    for batch in loader:
        queue.append(batch)
        if len(queue) > depth:
            yield queue.popleft()
    while queue:
        yield queue.popleft()


class Prefetcher:
    """``next()`` returns the batch fetched before and fetches the one after it (None at the end)."""

    def __init__(self, loader):
        self.it = iter(loader)
        self.preload()

    def preload(self):
        self.ready = next(self.it, None)

    def next(self):
        batch = self.ready
        if batch is not None:
            self.preload()
        return batch


WRAP = {"1": one_ahead, "2": lambda loader: queued(loader, 2)}


def main() -> None:
    torch.manual_seed(0)
    random.seed(0)  # the streams the dataset draws from without workers
    np.random.seed(0)
    generator = torch.Generator().manual_seed(5) if os.environ.get("T_GENERATOR") == "1" else None
    loader = DataLoader(Augmented(), batch_size=2, shuffle=True, generator=generator,
                        num_workers=int(os.environ.get("T_WORKERS", "2")),
                        persistent_workers=os.environ.get("T_PERSISTENT") == "1")
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if AHEAD == "accelerate":
        from accelerate import Accelerator

        model, opt, loader = Accelerator(cpu=True).prepare(model, opt, loader)
    step = 0
    for epoch in range(EPOCHS):
        if AHEAD == "next":
            prefetcher = Prefetcher(loader)
            batch = prefetcher.next()
            while batch is not None:
                train(model, opt, *batch)
                step += 1
                if BLOCK_AT == f"step:{step}":
                    block()
                batch = prefetcher.next()
        else:
            for x, y in WRAP.get(AHEAD, lambda loader: loader)(loader):
                train(model, opt, x, y)
                step += 1
                if BLOCK_AT == f"step:{step}":
                    block()
        if BLOCK_AT == f"epoch:{epoch}":
            block()
    out = os.environ.get("T_OUT")
    if out:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, out)
    say(f"STEPS {step}")  # the loop's own counter: carried across a resume, it ends at every step taken
    say("FINISHED")


def train(model, opt, x, y) -> None:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    say(f"LOSS {loss.item().hex()}")


def block() -> None:
    rv = sys.modules.get("ravex")
    if rv is not None:
        rv.flush()
    say("BLOCKED")
    sys.stdin.read()  # the test SIGKILLs us here


if __name__ == "__main__":
    main()
