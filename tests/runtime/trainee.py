"""A real training loop, run as a subprocess by the resume tests.

Dropout, AdamW, a per-step LR scheduler and a per-epoch one, a shuffled DataLoader.
Environment:

``T_ENTRY``     ``activate`` (calls ``ravex.activate()``), ``enable`` (relies on the .pth
                autoloader) or ``none`` (plain torch, the reference)
``T_WORKERS``   DataLoader workers (0 or 2)
``T_EPOCHS``    epochs (default 3)
``T_FROZEN``    ``1``: a fine-tune, ~95% of the parameters frozen (a frozen trunk, AdamW on
                the head only)
``T_COMPILE``   a ``torch.compile`` backend (``eager``): train the model compiled with it
``T_OUT``       where to write the final state (torch.save of plain dicts)
``T_BLOCK_AT``  ``step:<n>`` or ``epoch:<e>``: after that point, flush ravex, print
                ``BLOCKED`` and block reading stdin, so the test can SIGKILL a process that
                is known to be exactly there (no sleeps)
``T_BLOCK_IN_WRITE``  ``<n>``: block the background writer halfway through the n-th
                checkpoint's objects, print ``IN-WRITE``; the test kills it there

Prints ``LOSS <float.hex>`` per step and ``EPOCH <e> DONE`` per epoch.
"""

import os
import sys

ENTRY = os.environ.get("T_ENTRY", "none")
if ENTRY == "activate":
    import ravex

    ravex.activate()

import random  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

WORKERS = int(os.environ.get("T_WORKERS", "0"))
EPOCHS = int(os.environ.get("T_EPOCHS", "3"))
BLOCK_AT = os.environ.get("T_BLOCK_AT", "")
FROZEN = os.environ.get("T_FROZEN") == "1"
COMPILE = os.environ.get("T_COMPILE")


def say(line: str) -> None:
    """One write per line: the writer thread prints too, and a single small write is atomic
    where two ``print`` calls interleave ("LOSS ...IN-WRITE ..." hid a kill marker once)."""
    os.write(1, (line + "\n").encode())


def block(reason: str) -> None:
    rv = sys.modules.get("ravex")
    if rv is not None:
        rv.flush()
    say(f"BLOCKED {reason}")
    sys.stdin.read()  # the test SIGKILLs us here


def install_write_block(n: int) -> None:
    """Stop the writer thread inside the n-th commit: after its first object, or before its
    manifest if every chunk was small enough to be inlined. Prints ``IN-WRITE``."""
    import threading

    from ravex.format.storage import LocalStorage

    done: set[str] = set()  # steps whose manifest is written (refs.json may follow it)
    never = threading.Event()
    original_put = LocalStorage.write
    original_pending = LocalStorage.write_pending

    def put(self, key, data):
        step = key.split("/")[1] if key.startswith("steps/") else None
        if step in done:  # an extra file of a finished commit
            return original_put(self, key, data)
        armed = len(done) == n - 1
        if armed and step is not None:
            say(f"IN-WRITE before manifest {key}")
            never.wait()
        original_put(self, key, data)
        if step is not None and key.endswith("/rank-0.json"):
            done.add(step)
        elif armed:
            say(f"IN-WRITE after {key}")
            never.wait()

    def put_pending(self, key, data):  # chunk objects: fsync'd and renamed at publish
        handle = original_pending(self, key, data)
        if len(done) == n - 1:
            say(f"IN-WRITE after {key}")
            never.wait()
        return handle

    LocalStorage.write = put
    LocalStorage.write_pending = put_pending


class Noisy(Dataset):
    """Synthetic regression data with a random augmentation per sample."""

    def __init__(self, n: int = 96) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randn(n, 4, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if WORKERS:  # workers: index-seeded noise (test_workers.py covers the workers' own streams)
            noise = torch.randn(16, generator=torch.Generator().manual_seed(i)) * 0.01
        else:  # main process: the global RNG, which Ravex restores
            noise = torch.randn(16) * 0.01
        return self.x[i] + noise, self.y[i]


def main() -> None:
    if os.environ.get("T_BLOCK_IN_WRITE"):
        install_write_block(int(os.environ["T_BLOCK_IN_WRITE"]))
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    trunk = [nn.Linear(16, 64), nn.ReLU(), *([nn.Linear(64, 64), nn.ReLU()] if FROZEN else [])]
    model = nn.Sequential(*trunk, nn.Dropout(0.2), nn.Linear(64, 4))
    if FROZEN:
        nn.Sequential(*trunk).requires_grad_(False)
    net = torch.compile(model, backend=COMPILE) if COMPILE else model
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-2, total_steps=12 * EPOCHS)
    loader = DataLoader(Noisy(), batch_size=8, shuffle=True, num_workers=WORKERS)
    loss_fn = nn.MSELoss()
    step = 0
    for epoch in range(EPOCHS):
        for x, y in loader:
            opt.zero_grad()
            # python and numpy RNG in the step too: they must be restored as well
            scale = 1.0 + 0.001 * random.random() + 0.001 * float(np.random.rand())
            loss = loss_fn(net(x) * scale, y)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            say(f"LOSS {loss.item().hex()}")
            if BLOCK_AT == f"step:{step}":
                block(BLOCK_AT)
        say(f"EPOCH {epoch} DONE")
        if BLOCK_AT == f"epoch:{epoch}":
            block(BLOCK_AT)
    out = os.environ.get("T_OUT")
    if out:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict()}, out)
    say("FINISHED")


if __name__ == "__main__":
    main()
