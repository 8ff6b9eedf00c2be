"""Many ranks, one store: ``python -m benchmarks.ranks [--ranks 64] [--rows 64] [--cols 4096]``.

Each simulated rank is a process (forked, so imports are paid once) that writes its part of
one sharded step into one local store, exactly as a rank of a real job would: its rows of
every sharded array as whole chunks (``ravex.format.writing.reshard``), its share of a replicated
state (written once in total, split by ``ravex.saving.ranks.assign``), its own RNG-sized
per-rank array, then ``rank-<r>.json``. No process waits on another; a barrier only lines up
the start. Reported:

* ``complete_s``: start -> the slowest rank's manifest is durable (the step is complete)
* per-rank commit seconds (min/median/max), manifest bytes (min/median/max, total)
* ``refs_s``: one ``write_refs`` of the complete step (rank 0's job)
* ``agree_s``: every rank at once finding the newest complete step (what each rank does
  before the small collectives of a resume: list ``steps/``, read the newest step's W
  manifests, merge them) -- the slowest rank's time; and ``read_shard_s``: every rank
  reading back its own rows of the sharded arrays.
* ``agree_collective_s``: ``ravex.runtime.distributed.collectives.agree_on_steps`` itself (a broadcast of 67 int64s
  and a MIN all-reduce of 64 int8s) over gloo on this host, median of ``--agree-repeats``
  per rank, at ``--agree-ranks`` processes (default 8: gloo's 64-process rendezvous on 2
  cores measures the scheduler, not the collective).

On a 2-core VM 64 processes contend for 2 cores: the figures are upper bounds of the
format's own costs (listing, manifests, merge), not of a 64-node job.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from ravex.format import ArrayShard, open_store, write_refs
from ravex.format.writing.reshard import aligned_chunk_rows, read_rows, shard_of, shard_rows
from ravex.runtime.distributed.collectives import agree_on_steps
from ravex.saving.ranks import assign

STEP = 100
RUN = "bench-ranks"


def _state(rank: int, world: int, rows: int, cols: int, n_sharded: int, replicated: list[np.ndarray]) -> dict:
    tree: dict[str, Any] = {"sharded": {}, "replicated": {}}
    n = rows * world
    for i in range(n_sharded):
        shape = (n, cols)
        mine = shard_rows(n, world, rank)
        local = np.full((mine.stop - mine.start, cols), rank + i, dtype=np.float32)
        tree["sharded"][f"w{i}"] = shard_of(local, shape, world, rank, aligned_chunk_rows(shape, world, 4))
    plan = assign([(a.shape, a.dtype.itemsize) for a in replicated], world)
    for i, arr in enumerate(replicated):
        chunk_rows, (lo, hi) = plan[i][rank]
        tree["replicated"][f"r{i}"] = ArrayShard(arr[lo:hi], arr.shape, lo if hi > lo else 0, chunk_rows)
    tree[f"rank-{rank}"] = {"rng": np.random.default_rng(rank).integers(0, 255, 5056, dtype=np.uint8),
                            "yielded": rank}
    return tree


def _writer(rank: int, args: argparse.Namespace, barrier: Any, out: Any) -> None:
    store = open_store(args.store)
    replicated = [np.ones((args.rep_rows, args.cols), dtype=np.float32) * i for i in range(args.replicated)]
    tree = _state(rank, args.ranks, args.rows, args.cols, args.sharded, replicated)
    barrier.wait()
    started = time.time()
    with store.writer(rank=rank, world_size=args.ranks, run=RUN, threads=2) as w:
        stats = w.commit(STEP, tree)
    out.put(("write", rank, started, time.time(), stats.manifest_bytes, stats.new_bytes))


def _resumer(rank: int, args: argparse.Namespace, barrier: Any, out: Any) -> None:
    store = open_store(args.store)
    barrier.wait()
    t0 = time.time()
    latest = store.latest_step()
    t1 = time.time()
    reader = store.open_step(latest)
    for i in range(args.sharded):
        read_rows(reader, f"sharded/w{i}", args.ranks, rank)
    out.put(("resume", rank, t0, t1, time.time(), latest))


def _agreer(rank: int, args: argparse.Namespace, barrier: Any, out: Any) -> None:
    """The resume agreement collective itself (gloo, this host): broadcast + MIN all-reduce."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=args.agree_ranks)
    steps = list(range(STEP, STEP - 100 * 10, -10))  # more candidates than the 64 exchanged
    times = []
    for _ in range(args.agree_repeats):
        dist.barrier()
        t0 = time.perf_counter()
        agreed, run_id = agree_on_steps(steps, rank, args.agree_ranks)
        times.append(time.perf_counter() - t0)
    assert agreed[0] == STEP and run_id
    dist.destroy_process_group()
    out.put(("agree", rank, statistics.median(times)))


def _spawn(target: Any, args: argparse.Namespace, n: int | None = None) -> list[tuple]:
    ctx = mp.get_context("fork")
    n = n or args.ranks
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, args, barrier, out)) for r in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a simulated rank failed (exit {p.exitcode})")
    return results


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--rows", type=int, default=64, help="rows per rank of each sharded array")
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--sharded", type=int, default=4, help="sharded arrays")
    ap.add_argument("--replicated", type=int, default=8, help="replicated arrays (written once in total)")
    ap.add_argument("--rep-rows", type=int, default=256)
    ap.add_argument("--store", default=None, help="store folder (default: a temporary one)")
    ap.add_argument("--agree-ranks", type=int, default=8,
                    help="processes for the gloo resume-agreement collective (0: skip)")
    ap.add_argument("--agree-repeats", type=int, default=20)
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    temp = None
    if args.store is None:
        temp = tempfile.mkdtemp(prefix="ravex-ranks-")
        args.store = os.path.join(temp, "store")
    try:
        open_store(args.store, create=True)
        writes = _spawn(_writer, args)
        start = min(w[2] for w in writes)
        complete = max(w[3] for w in writes) - start
        store = open_store(args.store)
        info = store.step_info(STEP)
        assert info.complete, info.problem
        t0 = time.perf_counter()
        write_refs(store, STEP)
        refs_s = time.perf_counter() - t0
        manifests = [w[4] for w in writes]
        resumes = _spawn(_resumer, args)
        assert all(r[5] == STEP for r in resumes)
        agree = _spawn(_agreer, args, args.agree_ranks) if args.agree_ranks > 1 else []
        result = {
            "ranks": args.ranks,
            "logical_bytes": args.sharded * args.rows * args.ranks * args.cols * 4
            + args.replicated * args.rep_rows * args.cols * 4,
            "new_bytes_total": sum(w[5] for w in writes),
            "complete_s": complete,
            "commit_s": _spread([w[3] - w[2] for w in writes]),
            "manifest_bytes": {**_spread([float(m) for m in manifests]), "total": sum(manifests)},
            "refs_s": refs_s,
            "refs_bytes": os.path.getsize(os.path.join(args.store, "steps", str(STEP), "refs.json")),
            "agree_s": _spread([r[3] - r[2] for r in resumes]),
            "read_shard_s": _spread([r[4] - r[3] for r in resumes]),
            "agree_collective_s": ({"ranks": args.agree_ranks, **_spread([a[2] for a in agree])}
                                   if agree else None),
            "objects": sum(len(files) for _, _, files in os.walk(os.path.join(args.store, "objects"))),
        }
        text = json.dumps(result, indent=2)
        print(text)
        if args.json:
            with open(args.json, "w") as fh:
                fh.write(text + "\n")
        return result
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
