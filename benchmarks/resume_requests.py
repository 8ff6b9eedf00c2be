"""Storage requests per rank to find and load the resume step, counted:
``python -m benchmarks.resume_requests [--ranks 8 64 1024] [--steps 3] [--json PATH]``.

Issue 24 items 2 and 7. A store is written by ``W`` in-process ranks (``--steps`` complete
multi-rank steps, each rank a sharded array, a share of replicated ones and its per-rank
section, as :mod:`benchmarks.ranks` writes them), then each simulated rank opens a fresh
``ZarrBackend`` over a request-counting storage and makes the backend calls the runtime
(``ravex/runtime/restoring/reading.py``) makes at a resume, in its order:

* ``before`` (the path before the hand-over): every rank ``complete_steps()`` (lists
  ``steps/``, reads every rank's manifest of every step), ``read_step`` of the newest (every
  manifest again where the cache of 256 dropped them); rank 0 also drops partial steps
  (``discard_incomplete_above``).
* ``after`` (``resume: auto``, several ranks): rank 0 ``resume_candidates`` (the newest step
  checked first, its manifests read in parallel and pinned; older ones named from listings),
  drops partial steps, ``hand_over`` (packs what it read, no request); every other rank
  ``newest_step_guess`` + ``peek_step`` (its own manifest, for its loop position), then
  ``take_over`` of rank 0's payload (what the runtime broadcasts) and ``read_step``.
* ``step`` (``resume: 200``, the newest step but one, which forks a timeline): rank 0
  ``resume_point`` checks the step and finds the newest; every other rank
  ``resume_point(follow=True)`` (the timelines listed, nothing read), then as ``after``. The
  fork itself (rank 0 writes one timeline document, each rank lists ``timelines/`` once more
  after the agreement) is not run.
* ``fork`` (``resume: auto`` on a forked timeline): ``main`` forked at step 200, one step
  written there, then as ``after``.

The collectives (``agree_on_steps``, ``broadcast_bytes``) cost no storage request and are not
run here. Chunk objects a rank reads for its own shard are the same before and after and are
not counted. Every rank other than 0 does the same thing, so rank 0 and ``--sample`` other
ranks (first, middle, last) are run and the total is ``rank 0 + (W - 1) x`` their mean.
Requests are counted as an object store bills them: a read GET; a listing one LIST per 1000
names returned (``list_dir`` as a delimited listing, ``walk`` as a recursive one); ``exists``
and ``size`` one HEAD.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np

import ravex.format.store as store_module
from ravex.format import open_store
from ravex.format.storage import LocalStorage
from ravex.saving.zarr import ZarrBackend

from .ranks import _state

RUN = "bench-resume"
MODES = ("before", "after", "step", "fork")
NAMED = 200  # mode ``step``: ``resume: 200``, the newest step but one of the 3 written


class CountingStorage:
    """A :class:`~ravex.format.storage.Storage` that counts the requests an object store
    would bill for each call, into ``counts`` (shared, reset by the harness per rank)."""

    def __init__(self, inner: Any, counts: Counter[str]) -> None:
        self._inner = inner
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _lists(self, n: int) -> None:
        self._counts["LIST"] += max(1, math.ceil(n / 1000))

    def read(self, key: str) -> bytes:
        self._counts["GET"] += 1
        self._counts["GET manifest" if "/rank-" in key else "GET other"] += 1
        data: bytes = self._inner.read(key)
        return data

    def read_range(self, key: str, start: int, end: int) -> bytes:
        self._counts["GET"] += 1
        self._counts["GET other"] += 1
        data: bytes = self._inner.read_range(key, start, end)
        return data

    def read_into(self, key: str, out: memoryview) -> int:
        self._counts["GET"] += 1
        self._counts["GET other"] += 1
        n: int = self._inner.read_into(key, out)
        return n

    def list_dir(self, prefix: str) -> list[str]:
        names: list[str] = self._inner.list_dir(prefix)
        self._lists(len(names))
        return names

    def walk(self, prefix: str) -> Iterator[Any]:
        found = list(self._inner.walk(prefix))
        self._lists(len(found))
        return iter(found)

    def write(self, key: str, data: Any) -> None:
        self._counts["PUT"] += 1
        self._inner.write(key, data)

    def write_pending(self, key: str, data: Any) -> Any:
        self._counts["PUT"] += 1
        return self._inner.write_pending(key, data)

    def create(self, key: str, data: Any) -> bool:
        self._counts["PUT"] += 1
        made: bool = self._inner.create(key, data)
        return made

    def exists(self, key: str) -> bool:
        self._counts["HEAD"] += 1
        found: bool = self._inner.exists(key)
        return found

    def size(self, key: str) -> int:
        self._counts["HEAD"] += 1
        n: int = self._inner.size(key)
        return n


def _settings(url: str) -> Any:
    return SimpleNamespace(storage=SimpleNamespace(url=url, storage_options=dict), backend="zarr",
                           compression="none", delta=False, chunk_tables=False, keep_last=None,
                           keep_every=None, skip_unchanged=False, full_stage_every=1, local=None)


def _write(path: str, world: int, steps: int) -> None:
    store = open_store(path, create=True)
    for rank in range(world):
        with store.writer(rank=rank, world_size=world, run=RUN, threads=1) as w:
            for s in range(steps):
                w.commit(100 * (s + 1), _tree(rank, world))


def _tree(rank: int, world: int) -> dict[str, Any]:
    replicated = [np.ones((64, 16), dtype=np.float32) * i for i in range(4)]
    return _state(rank, world, 4, 16, 2, replicated)


def _fork(path: str, world: int) -> None:
    """Fork the store's ``main`` at its newest step but one (as ``resume: <step>`` does) and
    commit one step there: a plain rerun then continues the fork (mode ``fork``)."""
    store = open_store(path)
    at = store.complete_steps()[-2]
    fork = store.fork(at, run=RUN + "-fork")
    for rank in range(world):
        with fork.writer(rank=rank, world_size=world, run=RUN + "-fork", threads=1) as w:
            w.commit(at + 50, _tree(rank, world))


def _rank(path: str, rank: int, world: int, mode: str, payload: bytes | None,
          counts: Counter[str]) -> tuple[dict[str, int], bytes | None, int]:
    """One rank's resume calls over a fresh backend; its request counts, rank 0's payload, the step."""
    counts.clear()
    backend = ZarrBackend(_settings(path), rank, world)
    try:
        if mode == "before":
            step = sorted(backend.complete_steps(), reverse=True)[0]
        elif mode == "step":  # resume: <the newest step but one>: rank 0 checks it, the others follow
            step = backend.resume_point(NAMED, follow=rank != 0)
        elif rank == 0:  # after, fork: the newest step checked first
            step = backend.resume_candidates()[0]
        else:
            guess = backend.newest_step_guess(rank)
            assert guess is not None
            step = guess
        if mode != "before" and rank != 0:
            backend.peek_step(step, rank, world)
            assert payload is not None
            backend.take_over(payload)
        loaded = backend.read_step(step, rank, world)
        assert loaded is not None and loaded.reader is not None
        if rank == 0:
            if mode != "step":  # resuming an older step drops nothing: the run writes a fork
                backend.discard_incomplete_above(backend.latest_step())
            payload = backend.hand_over(step) if mode != "before" else None
        return dict(counts), payload, step
    finally:
        backend.close()


def measure(path: str, world: int, mode: str, sample: int) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    real = store_module.open_storage
    store_module.open_storage = lambda url, *a, **k: CountingStorage(LocalStorage(url), counts)  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        zero, payload, step = _rank(path, 0, world, mode, None, counts)
        others = sorted({1, world // 2, world - 1})[:sample] if world > 1 else []
        rows = []
        for r in others:
            row, _, got = _rank(path, r, world, mode, payload, counts)
            assert got == step, (r, got, step)
            rows.append(row)
        seconds = time.perf_counter() - t0
    finally:
        store_module.open_storage = real  # type: ignore[assignment]
    kinds = sorted({k for row in [zero, *rows] for k in row})
    other = {k: statistics.mean(row.get(k, 0) for row in rows) for k in kinds} if rows else {}
    total = {k: zero.get(k, 0) + (world - 1) * other.get(k, 0) for k in kinds}
    requests = lambda row: sum(v for k, v in row.items() if k in ("GET", "LIST", "HEAD"))  # noqa: E731
    return {
        "ranks": world, "mode": mode, "step": step, "rank0": zero, "other_rank": other,
        "rank0_requests": requests(zero), "other_rank_requests": requests(other),
        "total_requests": requests(total), "payload_bytes": len(payload or b""),
        "sim_seconds": round(seconds, 2), "sampled_ranks": len(rows) + 1,
    }


def checkpoint(path: str, world: int) -> dict[str, Any]:
    """One rank's requests for one more checkpoint (step ``10**6``, all of its chunks new):
    what ``W`` ranks multiply at every checkpoint; rank 0 also notes the step complete later."""
    counts: Counter[str] = Counter()
    real = store_module.open_storage
    store_module.open_storage = lambda url, *a, **k: CountingStorage(LocalStorage(url), counts)  # type: ignore[assignment]
    try:
        store = open_store(path)
        counts.clear()
        with store.writer(rank=1, world_size=world, run=RUN, threads=1, delta=False) as w:
            w.commit(10**6, _tree(1, world))
        return {"ranks": world, "rank1_commit": dict(counts)}
    finally:
        store_module.open_storage = real  # type: ignore[assignment]


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of RESULTS.md."""
    lines = ["| W | path | rank 0 | each other rank | job total | GET manifest / other rank | "
             "LIST / other rank | rank 0's broadcast |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        o = r["other_rank"]
        lines.append(f"| {r['ranks']} | {r['mode']} | {r['rank0_requests']:,} | {r['other_rank_requests']:,.0f} | "
                     f"{r['total_requests']:,.0f} | {o.get('GET manifest', 0):,.0f} | {o.get('LIST', 0):,.0f} | "
                     f"{r['payload_bytes'] / 1024:,.0f} KiB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 1024])
    ap.add_argument("--steps", type=int, default=3, help="complete steps in the store")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--sample", type=int, default=3, help="ranks other than 0 run (first, middle, last)")
    ap.add_argument("--checkpoint", action="store_true", help="also count one rank's commit of a step")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    results = []
    for world in args.ranks:
        temp = tempfile.mkdtemp(prefix="ravex-resume-requests-")
        try:
            path = os.path.join(temp, "store")
            t0 = time.perf_counter()
            _write(path, world, args.steps)
            print(f"W={world}: store written in {time.perf_counter() - t0:.1f} s", flush=True)
            for mode in sorted(set(args.modes), key=MODES.index):
                if mode == "fork":  # last: the fork changes the store the other modes read
                    _fork(path, world)
                results.append(measure(path, world, mode, args.sample))
                print(json.dumps(results[-1]), flush=True)
            if args.checkpoint:
                print(json.dumps(checkpoint(path, world)), flush=True)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
    print(table(results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "resume_requests", "steps": args.steps, "results": results}, fh, indent=2)
            fh.write("\n")
    return results


if __name__ == "__main__":
    main()
