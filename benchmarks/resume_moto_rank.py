"""One torchrun rank of :mod:`benchmarks.resume_moto` (run as a file by torchrun, not imported).

Ravex is imported from ``BENCH_RAVEX_TREE`` (another checkout, for the "before" figures), the
request counting from this checkout's ``benchmarks.util``. Each billed ``FsspecStorage`` call is
counted from before ``ravex.activate()``; the counts are written to ``BENCH_OUT/rank-<r>.json``
at three moments: when ``activate()`` returns (the step chosen: rank 0 checked it, the others
guessed it), when this process's first ``optimizer.step()`` returns (the step agreed on, read and
restored: Ravex reads it before the first forward pass), and at exit (the whole run: its
checkpoints and Ravex's exit work, which runs at threading's exit hook, before ``atexit``'s).
The counts live in a closure: Ravex saves and restores the script's carried globals.

A tiny DDP loop (gloo, CPU): ``Embedding(32, 16) + Linear(16, 32)``, AdamW, ``BENCH_ITERS``
iterations of a ``for`` over ``range``, a checkpoint every ``BENCH_EVERY`` steps.
"""

import atexit
import json
import os
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if sys.path and os.path.abspath(sys.path[0] or ".") == HERE:  # run as a file: benchmarks/ would shadow
    del sys.path[0]  # top-level names (util, state, report) for every import that follows
TREE = os.environ.get("BENCH_RAVEX_TREE") or REPO


def _bookkeeping() -> tuple:
    """The counting, installed now, and ``(mark, at_exit)``. Its state lives in this closure, not
    in the script's globals: Ravex saves a loop's carried variables and the globals the code
    after it reads, and would put run 1's counts back into run 2."""
    out, rank = os.environ["BENCH_OUT"], int(os.environ["RANK"])
    counts: Counter = Counter()
    marks: dict = {}
    lock = count_requests(counts, kind)

    def mark(name: str, **extra: object) -> None:
        if name not in marks:
            with lock:
                marks[name] = dict(counts)
            marks.update({f"{name}_{k}": v for k, v in extra.items()})

    def at_exit() -> None:
        mark("exit")
        doc = {"rank": rank, "ravex": ravex.__file__, "marks": marks}
        with open(os.path.join(out, f"rank-{rank}.json"), "w") as fh:
            json.dump(doc, fh)

    return mark, at_exit


def kind(key: str) -> str:
    """What a key is: a manifest, a chunk object, else its path with step numbers as ``<n>``."""
    if "/rank-" in key:
        return "manifest"
    parts = key.strip("/").split("/")
    if parts[0] == "objects":
        return "objects"
    return "/".join("<n>" if p.isdigit() else p for p in parts) or "/"


sys.path.insert(0, TREE)
import ravex  # noqa: E402  (from TREE: its submodules follow the package, whatever comes later on sys.path)

sys.path.insert(0, REPO)
from benchmarks.util import count_requests  # noqa: E402

mark, at_exit = _bookkeeping()
atexit.register(at_exit)  # registered before Ravex starts: runs after Ravex's exit work (atexit is LIFO)

storage = {"url": os.environ["BENCH_URL"], "endpoint": os.environ["BENCH_ENDPOINT"], "region": "us-east-1",
           "path_style": True, "access_key": "bench", "secret_key": "bench"}
ravex.activate(storage=storage, checkpoint_every=int(os.environ.get("BENCH_EVERY", "4")))
mark("activate")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(1337 + dist.get_rank())
VOCAB, BLOCK, BATCH = 32, 8, 4
data = torch.randint(0, VOCAB, (2000,), generator=torch.Generator().manual_seed(3))
model = DDP(nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

for it in range(int(os.environ["BENCH_ITERS"])):
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
    x = torch.stack([data[i:i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])
    loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    mark("first_step", iter=it)

dist.barrier()
dist.destroy_process_group()
