"""A real multi-rank training loop, launched by the tests with ``torchrun`` (gloo, CPU).

``ravex.activate()`` runs first, before ``init_process_group``, as a user would write it.
DDP (or FSDP2 ``fully_shard``), a shuffled ``DistributedSampler``, dropout, AdamW and a
per-step LR scheduler; every rank seeds its RNGs differently, so a rank that got another
rank's RNG back would diverge. Environment:

``T_ENTRY``   ``activate`` or ``none`` (plain torch: the reference)
``T_MODE``    ``ddp`` (default) or ``fsdp``
``T_EPOCHS``  epochs (default 2); 64 samples, batch 4: 16 // world steps per epoch... per rank
``T_OUT``     rank 0 writes the final full state there (torch.save of plain tensors)
``T_BLOCK_AT``  ``<step>``: every rank flushes ravex after that step, prints
              ``BLOCKED <rank>`` and waits forever; the test SIGKILLs the job
``T_BLOCK_RANKS``  with ``T_BLOCK_AT``: only these ranks (default all) wait; the others print
              ``BLOCKED`` and train on, into the next all-reduce (a node killed there fails
              them, as a cluster's surviving nodes fail)
``T_BLOCK_IN_WRITE``  ``<n>``: rank ``T_BLOCK_RANK`` (default 1) stops its writer inside
              its n-th checkpoint after the first object, printing ``IN-WRITE <rank>``
``T_WAIT_SIGNAL_AT``  ``<step>``: after that step the ranks in ``T_WAIT_SIGNAL_RANKS``
              (default all) print ``WAITING <rank> <pid>`` and go on only once they caught
              SIGTERM (the test sends it); the other ranks train on (and block in DDP)
``T_STEP_SECONDS``  simulated compute per step (for time-based checkpoints)
``T_SKEW``    ``<seconds>``: rank 1 calls ``ravex.activate()`` that much later than rank 0,
              so per-rank clocks would disagree on when a time-based checkpoint is due
``T_FIND_UNUSED``  ``1``: ``DDP(find_unused_parameters=True)`` (DDP then never rebuilds its
              gradient buckets; see test_ddp's 4-rank test)
``T_REWRAP_AT``  ``<step>``: after that step, wrap the model in a fresh DDP (what a restarted
              process has), without Ravex
``T_SCHED``   ``step``: a ``StepLR`` instead of ``OneCycleLR`` (whose total steps follow the
              world size, so a run resumed at another world size could not step it to the end)
``T_LOG_BATCHES``  ``1``: print ``BATCH <rank> <epoch> <step> <i,j,...>``, the sample indices of
              each step's batch

Prints ``LOSS <rank> <step> <float.hex>`` per step, ``RESTORED <rank> <step>`` after the
first step of a resumed run, and ``FINISHED <rank>``.
"""

import json
import os
import signal
import sys
import threading
import time

ENTRY = os.environ.get("T_ENTRY", "none")
if os.environ.get("T_SKEW") and os.environ.get("RANK") == "1":
    time.sleep(float(os.environ["T_SKEW"]))  # a late start, not a synchronisation
if ENTRY == "activate":
    import ravex

    ravex.activate()

import random  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

MODE = os.environ.get("T_MODE", "ddp")
EPOCHS = int(os.environ.get("T_EPOCHS", "2"))
BLOCK_AT = int(os.environ.get("T_BLOCK_AT", "0") or 0)
WAIT_AT = int(os.environ.get("T_WAIT_SIGNAL_AT", "0") or 0)
STEP_SECONDS = float(os.environ.get("T_STEP_SECONDS", "0") or 0)
FIND_UNUSED = os.environ.get("T_FIND_UNUSED") == "1"
REWRAP_AT = int(os.environ.get("T_REWRAP_AT", "0") or 0)
LOG_BATCHES = os.environ.get("T_LOG_BATCHES") == "1"
BLOCK_RANKS = os.environ.get("T_BLOCK_RANKS")


def say(line: str) -> None:
    """One write per line: the ranks share a pipe, and a single write below PIPE_BUF is atomic."""
    os.write(1, (line + "\n").encode())


def install_write_block(n: int, rank: int) -> None:
    from ravex.format.storage import LocalStorage

    seen: set[str] = set()
    never = threading.Event()
    original, original_pending = LocalStorage.write, LocalStorage.write_pending

    def write(self, key, data):
        original(self, key, data)
        if key.startswith("steps/") and key.endswith(f"/rank-{rank}.json"):
            seen.add(key.split("/")[1])
        elif key.startswith("objects/") and len(seen) == n - 1:
            say(f"IN-WRITE {rank}")
            never.wait()

    def write_pending(self, key, data):  # chunk objects: fsync'd and renamed at publish
        handle = original_pending(self, key, data)
        if len(seen) == n - 1:
            say(f"IN-WRITE {rank}")
            never.wait()
        return handle

    LocalStorage.write = write
    LocalStorage.write_pending = write_pending


def install_failing_storage(rank: int) -> None:
    """This rank's chunk writes fail with EIO (its disk broke; the other ranks' did not)."""
    import errno

    from ravex.format.storage import LocalStorage

    def write_pending(self, key, data):
        raise OSError(errno.EIO, os.strerror(errno.EIO), key)

    LocalStorage.write_pending = write_pending


def caught_sigterm() -> threading.Event:
    """Set when SIGTERM arrives; the handler installed before (ravex's) still runs."""
    caught = threading.Event()
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        caught.set()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
    return caught


class Noisy(Dataset):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randn(n, 4, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i] + torch.randn(16) * 0.01, self.y[i]  # global (per-rank) RNG


class Indexed(Noisy):
    """The same samples, each with its index (the tests count which ones were seen)."""

    def __getitem__(self, i: int):
        return (*super().__getitem__(i), i)


def full(value):
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: full(v) for k, v in value.items()}
    if isinstance(value, list):
        return [full(v) for v in value]
    return value


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get("T_BLOCK_IN_WRITE") and rank == int(os.environ.get("T_BLOCK_RANK", "1")):
        install_write_block(int(os.environ["T_BLOCK_IN_WRITE"]), rank)
    if os.environ.get("T_FAIL_RANK") == str(rank):
        install_failing_storage(rank)
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts them anyway)
    model = nn.Sequential(nn.Linear(16, 33), nn.ReLU(), nn.Dropout(0.2), nn.Linear(33, 4))
    torch.manual_seed(100 + rank)  # then every rank its own stream
    random.seed(100 + rank)
    np.random.seed(100 + rank)
    if MODE == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
        net = model
    else:
        net = nn.parallel.DistributedDataParallel(model, find_unused_parameters=FIND_UNUSED)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
    data = Indexed() if LOG_BATCHES else Noisy()
    sampler = DistributedSampler(data, shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    if os.environ.get("T_SCHED") == "step":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
    else:
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-2, total_steps=len(loader) * EPOCHS)
    loss_fn = nn.MSELoss()
    waiters = os.environ.get("T_WAIT_SIGNAL_RANKS", ",".join(map(str, range(world))))
    caught = caught_sigterm() if WAIT_AT and str(rank) in waiters.split(",") else None
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for batch in loader:
            x, y = batch[0], batch[1]
            opt.zero_grad()
            scale = 1.0 + 0.001 * random.random() + 0.001 * float(np.random.rand())
            loss = loss_fn(net(x) * scale, y)
            loss.backward()
            opt.step()
            sched.step()
            step = ravex.step() if ENTRY == "activate" else sched.last_epoch
            if ENTRY == "activate" and ravex.status()["resumed"] and not getattr(main, "said", 0):
                main.said = 1
                say(f"RESTORED {rank} {ravex.status()['resumed_from']}")
            say(f"LOSS {rank} {step} {loss.item().hex()}")
            if LOG_BATCHES:
                say(f"BATCH {rank} {epoch} {step} {','.join(map(str, batch[2].tolist()))}")
            if step == REWRAP_AT:
                net = nn.parallel.DistributedDataParallel(model, find_unused_parameters=FIND_UNUSED)
            if STEP_SECONDS:
                time.sleep(STEP_SECONDS)  # simulated compute
            if caught is not None and step == WAIT_AT:
                say(f"WAITING {rank} {os.getpid()}")
                while not caught.wait(1.0):  # the handler sets it; the timeout only re-checks
                    pass
            if step == BLOCK_AT:
                ravex.flush()
                say(f"BLOCKED {rank}")
                if BLOCK_RANKS is None or str(rank) in BLOCK_RANKS.split(","):
                    threading.Event().wait()  # the test SIGKILLs the job here
    state = {"model": full(model.state_dict()), "opt": full(opt.state_dict()), "sched": sched.state_dict()}
    out = os.environ.get("T_OUT")
    if out and rank == 0:
        torch.save(state, out)
    dist.barrier()
    say(f"FINISHED {rank}")
    if ENTRY == "activate":
        ravex.flush()
        say(f"BREAKER {rank} {json.dumps(ravex.status()['breaker'])}")
    dist.destroy_process_group()
    if ENTRY != "activate":
        # The plain-torch reference: nothing runs at exit. On a loaded machine a gloo thread
        # now and then outlives the process group and aborts the interpreter's teardown
        # ("terminate called without an active exception", SIGABRT after FINISHED), failing
        # a reference whose results are all out.
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
