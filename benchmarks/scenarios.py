"""``python -m benchmarks runtime|scenarios``: the issue's scenarios (a)-(g), through the runtime.

Where the format suite times the writer on a state handed to it, this one drives what a
user runs: ``ravex.activate()`` on live training objects and ``ravex.checkpoint()`` /
``ravex.flush()``, side by side with the peers on the same state in the same run.

(a) stall of a full checkpoint of a dense model + AdamW, and time to durable
(b) fine-tuning with 90% of the parameters frozen: bytes and stall of a checkpoint
(c) sparse embedding table (SparseAdam), ~1% of rows (Zipf-like) changed per interval
(d) ten successive checkpoints of (b): bytes on storage vs ten ``torch.save`` files
(e) load / resume against ``torch.load``
(f) per-step overhead of the patches between checkpoints on a small model
(g) bf16 state with and without compression
(i) (c)'s table: CPU a checkpoint takes, chunk tables against JSON chunk maps (``sparse_cpu.py``)

Repetitions are interleaved and rotated as in the format suite; figures are medians and
ratios. The machine is shared: absolute seconds are context, ratios are the figures.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp

from . import contenders as C
from . import limits as L
from . import state as S
from .active import Active, free
from .format_bench import _rotated
from .state import SparseTable
from .util import GIB, MIB, Timed, apparent_size, du, remove

warnings.filterwarnings("ignore", message="torch.distributed is disabled")

RUNTIME = ("a_stall", "e_load", "f_patch_overhead")
SCENARIOS = ("b_frozen", "c_sparse", "d_ten_checkpoints", "g_bf16", "i_sparse_cpu")


@dataclass
class Config:
    size_mib: float = 1024  # (a), (e): dense fp32 model + AdamW
    frozen_mib: float = 512  # (b), (d): the same model 90% frozen (its full-AdamW size)
    bf16_mib: float = 512  # (g)
    sparse_rows: int = 1 << 20  # (c): rows x dim fp32, plus SparseAdam's two moments
    sparse_dim: int = 64
    sparse_sweep_rows: int = 1 << 16  # (c) chunk-size sweep on a smaller table, same row size
    sparse_sweep_chunks: tuple[int, ...] = (16 * MIB, 64 << 10, 16 << 10, 8 << 10, 4 << 10, 2 << 10, 1 << 10)
    intervals: int = 10  # (b)/(d) checkpoints; (c) uses min(intervals, 4)
    reps: int = 3
    a_reps: int = 5  # (a) is the headline: more repetitions
    a_pairs: int = 15  # (a) background write against the disk: Ravex and the disk's ways, a second apart
    e_reps: int = 7  # (e) loads are cheap and swing with the VM's memory (fresh pages): more of them
    overhead_pairs: int = 40  # (f) interleaved off/on blocks
    overhead_steps: int = 100  # (f) steps per block
    scratch: str = "/tmp"
    settle: bool = True  # os.sync() before each timed write, as the format suite does (not in --quick)
    sections: tuple[str, ...] = RUNTIME + SCENARIOS
    log: Any = print


def _t(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _np_arrays(tree: Any) -> list[np.ndarray]:
    return [v for v in S.flatten(S.to_numpy_tree(tree)).values() if isinstance(v, np.ndarray)]


def _touched_like(arrays: list[np.ndarray]) -> list[np.ndarray]:
    dst = [np.empty_like(a) for a in arrays]
    for d in dst:
        d.reshape(-1).view(np.uint8)[:] = 0  # faulted in: reused buffers, as Ravex's Stager keeps
    return dst


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _median_ci95(xs: list[float], draws: int = 2000) -> tuple[float, float]:
    """A bootstrap 95% interval of the median of ``xs`` (fixed seed: the same figures give the
    same interval). (f)'s per-pair ratios spread +-30%: its median alone cannot show 1%."""
    if not xs:
        return float("nan"), float("nan")
    rng = np.random.default_rng(0)
    meds = np.median(rng.choice(np.asarray(xs), size=(draws, len(xs)), replace=True), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def _r(x: float, n: int = 4) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, n)


def dcp_async(state: Any, path: str) -> tuple[float, float]:
    """``dcp.async_save`` single process (``no_dist=True``, torch 2.13 takes it without a process
    group), files fsync'd: (seconds until it returned, seconds until the future resolved)."""
    t0 = time.perf_counter()
    fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True), no_dist=True)
    blocking = time.perf_counter() - t0
    done = getattr(fut, "upload_completion", fut)
    done.result()
    return blocking, time.perf_counter() - t0


# ---- (a) stall of a full checkpoint -----------------------------------------------------------

#: The disk written as a content-addressed store would be at best: 4 MiB objects from 4
#: threads, each handed to the disk as soon as written, fsync'd together at the end.
DISK_OBJECTS = "disk: 4 MiB objects x4, early writeback"
DISK_ONE_FILE = "disk: one file + fsync"
#: Past the page cache (where the file system takes O_DIRECT), as Ravex writes large objects:
#: one stream, and 4 MiB objects from 8 threads (the fastest way found on this VM's disk:
#: 0.34-0.39 s per GiB against 0.39-0.57 s for 16 MiB objects from 4 threads, 13:11 UTC 2026-12-04).
DISK_DIRECT = "disk: one file, O_DIRECT + fsync"
DISK_OBJECTS_DIRECT = "disk: 4 MiB objects x8, O_DIRECT"


def per_round_fraction(ravex_bg: list[float], disk: dict[str, list[float]]) -> dict[str, Any]:
    """(a)'s "background write / disk bandwidth" from rounds that each timed Ravex's background
    write and every way of writing the same bytes to the disk.

    Per way, the median over rounds of (that way's time / Ravex's time in the same round),
    with a bootstrap 95% interval; the disk's bandwidth is the best way, the one with the
    lowest median ratio, i.e. the fastest (``median``, ``reference``, ``ci95``). Also kept, stricter and biased low:
    the median over rounds of the fastest way in each round (``median_of_round_best``): the
    fastest of four noisy samples is below what any one way does typically.

    Why ratios within a round, not the ratio of two medians: on this VM the disk's speed
    drifts by 2x over minutes (and the buffered ways swing with page-cache allocation), so
    medians taken over different rounds compare Ravex with a disk it never met."""
    rounds = []
    for r, bg in enumerate(ravex_bg):
        times = {n: ts[r] for n, ts in disk.items() if r < len(ts)}
        best = min(times, key=times.__getitem__)
        rounds.append({"ravex_background_s": _r(bg), "disk_s": _r(times[best]), "disk_reference": best,
                       "fraction": _r(times[best] / bg, 3)})
    per_way = {n: [ts[r] / bg for r, bg in enumerate(ravex_bg) if r < len(ts)] for n, ts in disk.items()}
    by_ref = {n: _med(v) for n, v in per_way.items()}
    ref = min(by_ref, key=by_ref.__getitem__)  # the fastest way: the smallest time for the same bytes
    lo, hi = _median_ci95(per_way[ref])
    return {"median": _r(by_ref[ref], 3), "reference": ref, "ci95": [_r(lo, 3), _r(hi, 3)], "rounds": rounds,
            "median_by_reference": {n: _r(v, 3) for n, v in by_ref.items()},
            "median_of_round_best": _r(_med([x["fraction"] for x in rounds]), 3)}


def _bandwidth_pairs(cfg: Config, dense: Any, act: Active, nbytes: int, root: str,
                     disk_names: list[str]) -> dict[str, list[float]]:
    """(a)'s background write against the disk: ``cfg.a_pairs`` rounds, each a training step
    (every tensor changes, so every checkpoint writes all its bytes), then Ravex's checkpoint
    and each of the disk's ways of writing the same bytes, back to back, ``os.sync()`` before
    each, the order rotated. Seconds per round: Ravex's background write (``flush()`` after
    the checkpoint returned) and each way's write + fsync.

    The rotated rounds of every contender above put Ravex and the disk up to eight
    contenders (10-20 s) apart, and this disk drifts on that scale; here they are a second apart."""
    out: dict[str, list[float]] = {n: [] for n in ("ravex", *disk_names)}
    ways: dict[str, Any] = {
        DISK_ONE_FILE: lambda p: L.disk_one_file(p, nbytes),
        DISK_OBJECTS: lambda p: L.disk_objects(p, nbytes, defer=True, writeback=True),
        DISK_DIRECT: lambda p: L.disk_direct_file(p, nbytes),
        DISK_OBJECTS_DIRECT: lambda p: L.disk_objects(p, nbytes, threads=8, defer=True, direct=True),
    }
    for k in range(cfg.a_pairs):
        dense.train(1, seed=1000 + k)
        for _i, name in _rotated(["ravex", *disk_names], k):
            if cfg.settle:
                os.sync()
            if name == "ravex":
                dt = act.checkpoint()["background_s"]
            else:
                path = os.path.join(root, f"pair-{k}")
                dt = _t(lambda: ways[name](path))  # noqa: B023 (called at once)
                remove(path)
            out[name].append(dt)
            free()
        cfg.log(f"  pair {k + 1}/{cfg.a_pairs} " + "  ".join(f"{n.removeprefix('disk: ')} {v[-1]:.3f} s"
                                                             for n, v in out.items()))
    return out


def a_stall(cfg: Config) -> dict[str, Any]:
    log = cfg.log
    reps = max(cfg.reps, cfg.a_reps)
    log(f"(a) stall: ~{cfg.size_mib:g} MiB dense model + AdamW, full checkpoint, {reps} reps ...")
    dense = S.build(cfg.size_mib)
    state = dense.torch_state()
    arrays = _np_arrays(state)
    nbytes = sum(a.nbytes for a in arrays)
    dst = _touched_like(arrays)
    root = os.path.join(cfg.scratch, "a")
    os.makedirs(root)
    store = os.path.join(root, "ravex")
    first: dict[str, Any] = {}
    direct = L.direct_io_supported(root)
    disk_names = [DISK_ONE_FILE, DISK_OBJECTS] + ([DISK_DIRECT, DISK_OBJECTS_DIRECT] if direct else [])
    names = ["bare copy into reused buffers", "ravex.checkpoint", "torch.save", "safetensors.save_file",
             "dcp.save", "dcp.async_save", *disk_names]
    blocking = {n: Timed() for n in names}
    durable = {n: Timed() for n in names}
    ck_runs: list[dict[str, Any]] = []
    keep: dict[str, str] = {}
    with Active(store) as act:
        dense.train(1, seed=50)
        first["ravex.checkpoint"] = act.checkpoint()  # allocates and faults in the staging buffers
        bl, du_ = dcp_async(state, os.path.join(root, "dcp-async-first"))
        first["dcp.async_save"] = {"blocking_s": bl, "durable_s": du_}
        remove(os.path.join(root, "dcp-async-first"))
        for rep in range(reps):
            dense.train(1, seed=100 + rep)  # every tensor changes: each checkpoint is a full one

            def ravex_ck() -> tuple[float, float]:
                r = act.checkpoint()
                ck_runs.append(r)
                return r["stall_s"], r["durable_s"]

            def sync(fn: Any) -> Any:
                def run(p: str) -> tuple[float, float]:
                    dt = _t(lambda: fn(p))
                    return dt, dt
                return run

            entries: list[tuple[str, Any]] = [
                ("bare copy into reused buffers", sync(lambda p: L.copy_reused(arrays, dst))),
                ("ravex.checkpoint", lambda p: ravex_ck()),
                ("torch.save", sync(lambda p: C.torch_save(state, p))),
                ("safetensors.save_file", sync(lambda p: C.safetensors_save(state, p))),
                ("dcp.save", sync(lambda p: C.dcp_save(state, p))),
                ("dcp.async_save", lambda p: dcp_async(state, p)),
                (DISK_ONE_FILE, sync(lambda p: L.disk_one_file(p, nbytes))),
                (DISK_OBJECTS, sync(lambda p: L.disk_objects(p, nbytes, defer=True, writeback=True))),
                *([(DISK_DIRECT, sync(lambda p: L.disk_direct_file(p, nbytes))),
                   (DISK_OBJECTS_DIRECT, sync(lambda p: L.disk_objects(p, nbytes, threads=8, defer=True, direct=True)))]
                  if direct else []),
            ]
            for i, (name, fn) in _rotated(entries, rep):
                path = os.path.join(root, f"{i}-r{rep}")
                if cfg.settle:
                    os.sync()  # nobody's dirty pages (the previous contender's) are flushed inside this one
                b, d = fn(path)
                blocking[name].times.append(b)
                durable[name].times.append(d)
                log(f"  rep {rep + 1}/{reps} {name:<32} blocks {b:7.3f} s  durable {d:7.3f} s")
                if rep == reps - 1 and name in ("torch.save", "safetensors.save_file", DISK_ONE_FILE):
                    keep[name] = path
                else:
                    remove(path)
                free()
        pairs = _bandwidth_pairs(cfg, dense, act, nbytes, root, disk_names)
    med = {n: blocking[n].median for n in names}
    stall = med["ravex.checkpoint"]
    copy = med["bare copy into reused buffers"]
    # The disk's bandwidth is the best of its ways of writing the same bytes, in each round:
    # this virtual disk has had hours when one stream ran at 1 GiB/s and hours when it ran at
    # 0.3 GiB/s while parallel writes stayed near 1 GiB/s. Against the best one, the goal is strict.
    frac = per_round_fraction(pairs["ravex"], {n: pairs[n] for n in disk_names})
    bg_rounds = [r["background_s"] for r in ck_runs]
    # the same from the rounds above (Ravex and the disk up to eight contenders apart), to compare
    frac_rot = per_round_fraction(bg_rounds, {n: durable[n].times for n in disk_names})
    disk_by = {n: durable[n].median for n in disk_names}
    bg = _med(bg_rounds)
    out = {
        "state": {"tensors": len(arrays), "tensor_bytes": nbytes, "tensor_gib": round(nbytes / GIB, 4),
                  "width": dense.width, "layers": S.LAYERS},
        "blocking": {n: blocking[n].to_json(nbytes) for n in names},
        "durable": {n: durable[n].to_json(nbytes) for n in names},
        "background_write_rounds": frac["rounds"],
        "bandwidth_rounds_s": {n: Timed(v).to_json(nbytes) for n, v in pairs.items()},
        "ravex_checkpoints": [{k: (_r(v) if isinstance(v, float) else v) for k, v in r.items()} for r in ck_runs],
        "first_checkpoint": {k: {kk: (_r(vv) if isinstance(vv, float) else vv) for kk, vv in v.items()}
                             for k, v in first.items()},
        "ratios": {
            "stall_over_bare_copy": _r(stall / copy, 3),
            "stage_over_bare_copy": _r(_med([r["stage_s"] for r in ck_runs]) / copy, 3),
            "call_over_bare_copy": _r(_med([r["call_s"] for r in ck_runs]) / copy, 3),
            "torch_save_blocking_over_stall": _r(med["torch.save"] / stall, 2),
            "safetensors_blocking_over_stall": _r(med["safetensors.save_file"] / stall, 2),
            "dcp_save_blocking_over_stall": _r(med["dcp.save"] / stall, 2),
            "dcp_async_blocking_over_stall": _r(med["dcp.async_save"] / stall, 2),
            "first_stall_over_bare_copy": _r(first["ravex.checkpoint"]["stall_s"] / copy, 3),
            "background_write_fraction_of_disk": frac["median"],
            "background_write_fraction_of_disk_ci95": frac["ci95"],
            "background_write_fraction_of_disk_reference": frac["reference"],
            "background_write_fraction_of_disk_by_reference": frac["median_by_reference"],
            "background_write_fraction_of_disk_round_best": frac["median_of_round_best"],
            "background_write_fraction_of_disk_rotated_rounds": frac_rot["median"],
            "background_write_fraction_of_disk_rotated_rounds_ci95": frac_rot["ci95"],
            # the former figure, kept to compare: best median of the disk over Ravex's median
            "background_write_fraction_of_disk_of_medians": _r(min(disk_by.values()) / bg, 3),
            "ravex_durable_over_torch_save": _r(durable["ravex.checkpoint"].median / durable["torch.save"].median, 3),
            "ravex_durable_over_dcp_async": _r(durable["ravex.checkpoint"].median
                                               / durable["dcp.async_save"].median, 3),
        },
    }
    out["_keep"] = {**keep, "ravex": store}
    return out


# ---- (e) load and resume ----------------------------------------------------------------------

#: Resume when the runtime saw the objects being built (``ravex enable``, or ``activate()``
#: called before the model): no heap scan at activation.
RESUME_REGISTERED = "resume: ravex, objects seen as built"


def e_load(cfg: Config, kept: dict[str, str] | None) -> dict[str, Any]:
    """Warm page cache (dropping it needs privileges these VMs do not give): the loaders' own cost."""
    import ravex
    from ravex.format import open_store

    log = cfg.log
    made_here = kept is None
    if kept is None:  # run alone: write the files (a) would have left
        root = os.path.join(cfg.scratch, "e")
        os.makedirs(root)
        dense = S.build(cfg.size_mib)
        st = dense.torch_state()
        kept = {"torch.save": os.path.join(root, "pt"), "safetensors.save_file": os.path.join(root, "st"),
                "ravex": os.path.join(root, "ravex")}
        C.torch_save(st, kept["torch.save"])
        C.safetensors_save(st, kept["safetensors.save_file"])
        with Active(kept["ravex"]) as act:
            act.checkpoint()
        del dense, st
        free()
    nbytes = apparent_size(kept["torch.save"])
    reps = max(cfg.reps, cfg.e_reps)
    log(f"(e) load: {nbytes / MIB:.0f} MiB, warm page cache, {reps} reps ...")

    # resume as the runtime does it: a rerun builds the same model, activates, and the first
    # forward restores; against torch.load + load_state_dict into the same objects
    fresh = S.build(cfg.size_mib, steps=0)
    _ = fresh.optimizer.state_dict()
    fresh.train(1, seed=7)  # AdamW state exists, as in the run that wrote the checkpoint

    def torch_resume(p: str) -> None:
        sd = torch.load(p, weights_only=True)
        fresh.model.load_state_dict(sd["model"])
        fresh.optimizer.load_state_dict(sd["optim"])

    split: dict[str, list[float]] = {"activate": [], "read_restore": []}
    as_built = (*(("modules", m) for m in fresh.model.modules()), ("optimizers", fresh.optimizer))

    def ravex_resume_registered(p: str) -> None:
        with Active(p, resume="auto", collect=False, registered=as_built):
            rt = ravex.runtime.starting.lifecycle.get_runtime()
            rt.ensure_restored()  # what the first forward pass triggers
            if rt.resumed_from is None:
                raise RuntimeError("resume failed")

    def ravex_resume(p: str) -> None:
        t0 = time.perf_counter()
        with Active(p, resume="auto", collect=False):  # no benchmark gc.collect() inside the timing
            t1 = time.perf_counter()
            rt = ravex.runtime.starting.lifecycle.get_runtime()
            if rt is None or rt._restored:
                raise RuntimeError("nothing to resume from")
            rt.ensure_restored()  # what the first forward pass triggers
            if rt.resumed_from is None:
                raise RuntimeError("resume failed")
            t2 = time.perf_counter()
        split["activate"].append(t1 - t0)
        split["read_restore"].append(t2 - t1)

    step = open_store(kept["ravex"]).complete_steps()
    entries: list[tuple[str, str, Any]] = [
        ("disk: read one file", kept.get(DISK_ONE_FILE, kept["torch.save"]), L.read_file),
        ("torch.load", kept["torch.save"], C.torch_load),
        ("safetensors.load_file", kept["safetensors.save_file"], C.safetensors_load),
        ("ravex.load", kept["ravex"], lambda p: ravex.load(p)),
        ("ravex store read (numpy)", kept["ravex"], lambda p: open_store(p).open_step("latest").read()),
        ("resume: torch.load + load_state_dict", kept["torch.save"], torch_resume),
        ("resume: ravex runtime (read + restore)", kept["ravex"], ravex_resume),
        (RESUME_REGISTERED, kept["ravex"], ravex_resume_registered),
    ]
    from .format_bench import _timed_load

    for _name, path, fn in entries:  # warm: every file read once before any timing
        _timed_load(fn, path)
        free()
    tm = {n: Timed() for n, _, _ in entries}
    split["activate"].clear()
    split["read_restore"].clear()
    for rep in range(reps):
        for _i, (name, path, fn) in _rotated(entries, rep):
            dt = _timed_load(fn, path)
            tm[name].times.append(dt)
            log(f"  rep {rep + 1}/{reps} {name:<40} {dt:7.3f} s")
            free()
    base = tm["torch.load"].median
    base_resume = tm["resume: torch.load + load_state_dict"].median
    out: dict[str, Any] = {"bytes": nbytes, "steps_in_store": len(step), "page_cache": "warm"}
    out["loads"] = {n: tm[n].to_json(nbytes) | {"over_torch_load": _r(t.median / base, 3)} for n, t in tm.items()}
    out["ravex_resume_split_s"] = {k: _r(_med(v)) for k, v in split.items()}
    out["ratios"] = {
        "ravex_load_over_torch_load": _r(tm["ravex.load"].median / base, 3),
        "ravex_resume_read_restore_over_torch_resume": _r(_med(split["read_restore"]) / base_resume, 3),
        "ravex_resume_over_torch_resume": _r(tm["resume: ravex runtime (read + restore)"].median / base_resume, 3),
        "ravex_resume_registered_over_torch_resume": _r(tm[RESUME_REGISTERED].median / base_resume, 3),
        "torch_load_fraction_of_read_bandwidth": _r(tm["disk: read one file"].median / base, 3),
    }
    # the same ratios rep by rep (each rep times both, in a rotated order): how far one run swings
    def per_rep(mine: str, theirs: str) -> list[float | None]:
        return [_r(a / b, 3) for a, b in zip(tm[mine].times, tm[theirs].times, strict=True)]

    out["ratios_per_rep"] = {
        "ravex_load_over_torch_load": per_rep("ravex.load", "torch.load"),
        "ravex_resume_over_torch_resume": per_rep("resume: ravex runtime (read + restore)",
                                                  "resume: torch.load + load_state_dict"),
        "ravex_resume_registered_over_torch_resume": per_rep(RESUME_REGISTERED, "resume: torch.load + load_state_dict"),
    }
    if made_here:
        remove(os.path.join(cfg.scratch, "e"))
    return out


# ---- (f) patch overhead -----------------------------------------------------------------------


def f_patch_overhead(cfg: Config) -> dict[str, Any]:
    """N training steps with and without ``ravex.activate()`` (no checkpoint due), interleaved
    off/on and on/off blocks, one torch thread, thread CPU time per step (the quietest figure a
    shared 2-core box gives); and the patches alone on an empty loop."""
    log = cfg.log
    log(f"(f) patch overhead: {cfg.overhead_pairs} pairs x {cfg.overhead_steps} steps, small MLP ...")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        width, batch = 256, 32
        model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                    torch.nn.ReLU(), torch.nn.Linear(width, 10))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
        loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True)
        lossf = torch.nn.CrossEntropyLoss()

        def block(n: int) -> float:
            """Median CPU seconds of this thread per step (next batch, forward, backward, optimizer):
            time other users of the machine take from us is not counted, and a median ignores
            the steps whose caches a neighbour trashed."""
            times: list[float] = []
            t0 = time.thread_time()
            while len(times) < n:
                for x, y in loader:
                    loss = lossf(model(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    t1 = time.thread_time()
                    times.append(t1 - t0)
                    t0 = t1
                    if len(times) == n:
                        break
                t0 = time.thread_time()  # a new epoch's iterator start is timed with its first step
            return _med(times)

        # the patches alone: an empty loop of next() + optimizer.step() on one scalar parameter,
        # with and without activate(): microseconds that noise cannot hide in a 1% figure
        tiny = torch.nn.Parameter(torch.zeros(()))
        tiny_opt = torch.optim.SGD([tiny], lr=0.0)
        tiny_loader = torch.utils.data.DataLoader(list(range(4096)), batch_size=None)

        def bare(n: int) -> float:
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                for i, _x in enumerate(tiny_loader):
                    tiny_opt.step()
                    if i + 1 == n:
                        break
                times.append((time.perf_counter() - t0) / n)
            return min(times)

        block(max(20, cfg.overhead_steps // 4))  # warm up
        off: list[float] = []
        on: list[float] = []
        ratios: list[float] = []
        bare_off: list[float] = []
        bare_on: list[float] = []
        store = os.path.join(cfg.scratch, "f-store")
        for i in range(cfg.overhead_pairs):
            pair = {}
            for which in ("off", "on") if i % 2 == 0 else ("on", "off"):
                if which == "on":
                    with Active(store) as act:
                        pair["on"] = block(cfg.overhead_steps)
                        steps_seen = act.rt.step
                else:
                    free()
                    pair["off"] = block(cfg.overhead_steps)
            if i < 6:
                for which in ("off", "on"):
                    if which == "on":
                        with Active(store):
                            bare_on.append(bare(2000))
                    else:
                        bare_off.append(bare(2000))
            off.append(pair["off"])
            on.append(pair["on"])
            ratios.append(pair["on"] / pair["off"])
        remove(store)
        out = {
            "model": f"MLP 64-{width}-{width}-10, AdamW, DataLoader batch {batch}, 1 torch thread",
            "pairs": cfg.overhead_pairs, "steps_per_block": cfg.overhead_steps,
            "step_s_off": {"median": _r(_med(off), 6), "all": [_r(x, 6) for x in off]},
            "step_s_on": {"median": _r(_med(on), 6), "all": [_r(x, 6) for x in on]},
            "ratio_per_pair": [_r(x, 4) for x in ratios],
            "overhead_fraction": _r(_med(ratios) - 1.0, 4),
            "overhead_fraction_ci95": [_r(x - 1.0, 4) for x in _median_ci95(ratios)],
            "overhead_us_per_step": _r((_med(on) - _med(off)) * 1e6, 1),
            "steps_counted_by_ravex_in_last_on_block": steps_seen,
            "empty_step_us_off": _r(min(bare_off) * 1e6, 2),
            "empty_step_us_on": _r(min(bare_on) * 1e6, 2),
            "patch_us_per_step_isolated": _r((min(bare_on) - min(bare_off)) * 1e6, 2),
        }
        out["overhead_fraction_isolated"] = _r((min(bare_on) - min(bare_off)) / _med(off), 4)
        log(f"  step {out['step_s_off']['median'] * 1e3:.3f} ms off, overhead {out['overhead_fraction']:+.2%} "
            f"(A/B); patches alone {out['patch_us_per_step_isolated']} us/step "
            f"= {out['overhead_fraction_isolated']:+.2%}")
        return out
    finally:
        torch.set_num_threads(threads)


# ---- (b) + (d) frozen fine-tuning, ten checkpoints -------------------------------------------


def bd_frozen(cfg: Config) -> tuple[dict[str, Any], dict[str, Any]]:
    log = cfg.log
    log(f"(b)+(d) 90% frozen: ~{cfg.frozen_mib:g} MiB model, {cfg.intervals} checkpoints, one step apart ...")
    ft = S.build(cfg.frozen_mib, frozen_fraction=0.9)
    state = ft.torch_state()
    root = os.path.join(cfg.scratch, "bd")
    os.makedirs(root)
    store = os.path.join(root, "ravex")
    flat = {k: v for k, v in S.leaves(S.to_numpy_tree(state)).items() if isinstance(v, np.ndarray)}
    total = sum(a.nbytes for a in flat.values())
    trainable = [v for v in _np_arrays({"p": ft.trainable_params})]
    moments = [v for k, v in flat.items() if k[0] == "optim"]
    changed_arrays = trainable + [m for m in moments if m.ndim > 0]
    changed_expected = sum(a.nbytes for a in changed_arrays)
    dst = _touched_like(changed_arrays)
    rows: list[dict[str, Any]] = []
    copy_changed: list[float] = []
    pt_bytes: list[int] = []
    pt_du: list[int] = []
    pt_s: list[float] = []
    with Active(store) as act:
        prev: dict[tuple, np.ndarray] | None = None
        for i in range(cfg.intervals):
            if i:
                ft.train(1, seed=200 + i)
            changed = total if prev is None else sum(
                a.nbytes for k, a in flat.items()
                if not np.array_equal(a.reshape(-1).view(np.uint8), prev[k].reshape(-1).view(np.uint8)))
            prev = {k: a.copy() for k, a in flat.items()}
            # interleave: bare copy of the changed state, Ravex, torch.save (order rotated)
            order = [("copy", None), ("ravex", None), ("torch", None)]
            k = i % 3
            for what, _ in order[k:] + order[:k]:
                if cfg.settle:
                    os.sync()
                if what == "copy":
                    copy_changed.append(_t(lambda: L.copy_reused(changed_arrays, dst)))
                elif what == "ravex":
                    r = act.checkpoint()
                    r["changed_tensor_bytes"] = changed
                    r["store_du_after"] = du(store)
                    rows.append(r)
                else:
                    p = os.path.join(root, f"step{i}.pt")
                    pt_s.append(_t(lambda p=p: C.torch_save(state, p)))
                    pt_bytes.append(os.path.getsize(p))
                    pt_du.append(du(p))
                    remove(p)  # only its size is needed: keep the disk free
            log(f"  checkpoint {i + 1}/{cfg.intervals}: ravex new {rows[-1]['new_bytes'] / MIB:8.1f} MiB "
                f"(changed {changed / MIB:8.1f}), stall {rows[-1]['stall_s']:.3f} s, torch.save {pt_s[-1]:.3f} s")
    later = rows[1:] or rows
    new_b = _med([r["new_bytes"] + r["manifest_bytes"] for r in later])
    changed_b = _med([r["changed_tensor_bytes"] for r in later])
    stall = _med([r["stall_s"] for r in later])
    b = {
        "state": {"tensor_bytes": total, "layers_frozen": ft.frozen_layers, "layers": S.LAYERS,
                  "changed_expected_bytes": changed_expected,
                  "changed_expected_fraction": _r(changed_expected / total, 4)},
        "checkpoints": [{kk: (_r(vv) if isinstance(vv, float) else vv) for kk, vv in r.items()} for r in rows],
        "bare_copy_of_changed_s": Timed(copy_changed[1:] or copy_changed).to_json(changed_expected),
        "torch_save_s": Timed(pt_s[1:] or pt_s).to_json(),
        "ratios": {
            "written_over_changed": _r(new_b / changed_b, 4),
            "written_over_full": _r(new_b / total, 4),
            "stall_over_bare_copy_of_changed": _r(stall / _med(copy_changed[1:] or copy_changed), 3),
            "stall_over_full_stage_share": _r(changed_expected / total, 4),
            "background_over_first": _r(_med([r["background_s"] for r in later]) / rows[0]["background_s"], 3),
            "durable_over_torch_save": _r(_med([r["durable_s"] for r in later]) / _med(pt_s[1:] or pt_s), 3),
        },
    }
    d = {
        "checkpoints": cfg.intervals,
        "ravex_store_du": rows[-1]["store_du_after"],
        "ravex_store_apparent": apparent_size(store),
        "torch_save_files_du": sum(pt_du),
        "torch_save_files_bytes": sum(pt_bytes),
        "ratios": {"torch_save_over_ravex_du": _r(sum(pt_du) / max(1, rows[-1]["store_du_after"]), 3)},
    }
    remove(root)
    return b, d


# ---- (c) sparse embedding ---------------------------------------------------------------------


def _refs_bytes(store: str, step: int) -> int:
    """Bytes of a step's ``refs.json`` (the fsspec view the writer adds to every step): written
    per checkpoint like the manifest, so counted apart and reported beside it."""
    path = os.path.join(store, "steps", str(step), "refs.json")
    return os.path.getsize(path) if os.path.exists(path) else 0


def c_sparse(cfg: Config) -> dict[str, Any]:
    """The runtime's default chunking (``ravex.activate()``, nothing set by hand) on a sparse
    table, then a sweep of one chunk size for every array through the writer, which is how
    the runtime's size for sparse tables (``ravex.runtime.state.chunking.SPARSE_CHUNK_BYTES``) was chosen."""
    import ravex
    from ravex.format import open_store

    log = cfg.log
    n_int = max(2, min(cfg.intervals, 4))
    rows, dim = cfg.sparse_rows, cfg.sparse_dim
    log(f"(c) sparse: {rows} x {dim} embedding + SparseAdam, ~1% rows (Zipf) per interval, {n_int} intervals ...")
    root = os.path.join(cfg.scratch, "c")
    os.makedirs(root)
    tab = SparseTable(rows, dim)
    full = S.tensor_bytes(tab.torch_state())
    runs: list[dict[str, Any]] = []
    store = os.path.join(root, "ravex")
    with Active(store) as act:
        first = act.checkpoint()
        first["refs_bytes"] = _refs_bytes(store, ravex.status()["last_written_step"])
        for i in range(n_int):
            ids = tab.interval()
            r = act.checkpoint()
            r["rows_changed"] = int(ids.size)
            r["refs_bytes"] = _refs_bytes(store, ravex.status()["last_written_step"])
            runs.append(r)
            log(f"  interval {i + 1}/{n_int}: {ids.size} rows changed, ravex wrote "
                f"{(r['new_bytes'] + r['manifest_bytes']) / MIB:.2f} MiB (+ refs.json {r['refs_bytes'] / MIB:.2f}) "
                f"of {full / MIB:.1f} MiB in {r['durable_s']:.2f} s")
        last = open_store(store).manifest(ravex.status()["last_written_step"], 0)
        chosen = {p: e.zarr["chunk_grid"]["configuration"]["chunk_shape"] for p, e in last.arrays.items()
                  if e.zarr["shape"] and e.zarr["shape"][0] == rows}
    pt = os.path.join(root, "full.pt")
    C.torch_save(tab.torch_state(), pt)
    pt_bytes = os.path.getsize(pt)
    remove(pt)
    written = _med([r["new_bytes"] + r["manifest_bytes"] for r in runs])
    with_refs = _med([r["new_bytes"] + r["manifest_bytes"] + r["refs_bytes"] for r in runs])
    del tab
    free()
    remove(root)

    # the same workload on a smaller table (same row size, same 1%), per chunk size, through the
    # format's writer: how small must chunks be for >= 6x fewer bytes?
    srows = min(rows, cfg.sparse_sweep_rows)
    log(f"  chunk sweep on {srows} rows: {', '.join(f'{c >> 10} KiB' for c in cfg.sparse_sweep_chunks)} ...")
    sweep = []
    for chunk in cfg.sparse_sweep_chunks:
        tab = SparseTable(srows, dim)
        path = os.path.join(cfg.scratch, "c-sweep")
        store = open_store(path, create=True)
        with store.writer(chunk_bytes=chunk) as w:
            t0 = time.perf_counter()
            w.commit(1, S.to_numpy_tree(tab.torch_state()))
            t_first = time.perf_counter() - t0
            got = []
            for i in range(n_int):
                tab.interval()
                t0 = time.perf_counter()
                s = w.commit(2 + i, S.to_numpy_tree(tab.torch_state()))
                got.append((s.new_bytes + s.manifest_bytes, s.new_bytes, s.manifest_bytes, time.perf_counter() - t0,
                            s.logical_bytes, s.chunks, _refs_bytes(path, 2 + i)))
        remove(path)
        wb = _med([g[0] for g in got])
        wr = _med([g[0] + g[6] for g in got])
        sweep.append({
            "chunk_bytes": chunk, "full_bytes": got[0][4], "chunks": got[0][5],
            "written_bytes": wb, "object_bytes": _med([g[1] for g in got]), "manifest_bytes": _med([g[2] for g in got]),
            "refs_bytes": _med([g[6] for g in got]),
            "full_over_written": _r(got[0][4] / wb, 3), "full_over_written_with_refs": _r(got[0][4] / wr, 3),
            "commit_s": _r(_med([g[3] for g in got]), 4), "first_commit_s": _r(t_first, 4),
        })
        log(f"    chunk {chunk >> 10:>6} KiB: {got[0][4] / wb:6.2f}x fewer bytes ({got[0][4] / wr:5.2f}x with "
            f"refs.json), commit {_med([g[3] for g in got]):.3f} s")
        del tab
        free()
    meets = [r["chunk_bytes"] for r in sweep if (r["full_over_written"] or 0) >= 6]
    return {
        "table": {"rows": rows, "dim": dim, "dtype": "float32", "rows_changed_per_interval": runs[0]["rows_changed"],
                  "zipf_s": 1.05, "state_bytes": full, "runtime_chunk_shapes": chosen},
        "first_checkpoint": {k: (_r(v) if isinstance(v, float) else v) for k, v in first.items()},
        "checkpoints": [{k: (_r(v) if isinstance(v, float) else v) for k, v in r.items()} for r in runs],
        "torch_save_bytes": pt_bytes,
        "chunk_sweep": {"rows": srows, "results": sweep,
                        "largest_chunk_meeting_6x": max(meets) if meets else None},
        "ratios": {"full_over_written": _r(full / written, 3),
                   "full_over_written_with_refs": _r(full / with_refs, 3),
                   "torch_save_over_written": _r(pt_bytes / written, 3)},
    }


# ---- (g) bf16 with and without compression ----------------------------------------------------


def g_bf16(cfg: Config) -> dict[str, Any]:
    log = cfg.log
    log(f"(g) bf16: ~{cfg.bf16_mib:g} MiB bf16 model + AdamW (bf16 moments), {cfg.reps} reps ...")
    base = S.build(cfg.bf16_mib * 2, steps=0)  # fp32 sizing; half that in bf16
    model = base.model.to(torch.bfloat16)
    del base
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    st = S.TrainState(model, opt, model[0].in_features, 0)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        loss = model(torch.randn(16, st.width, generator=gen, dtype=torch.bfloat16)).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    state = st.torch_state()
    tree = S.to_numpy_tree(state)
    nbytes = S.tensor_bytes(state)
    root = os.path.join(cfg.scratch, "g")
    os.makedirs(root)
    entries: list[tuple[str, Any]] = [
        ("torch.save", lambda p: C.torch_save(state, p)),
        ("safetensors.save_file", lambda p: C.safetensors_save(state, p)),
    ] + [(f"ravex {c}", lambda p, c=c: C.ravex_save(tree, p, c)) for c in ("none", "zstd", "blosc")]
    tm = {n: Timed() for n, _ in entries}
    for rep in range(cfg.reps):
        for i, (name, fn) in _rotated(entries, rep):
            path = os.path.join(root, f"{i}-r{rep}")
            if cfg.settle:
                os.sync()
            dt = _t(lambda fn=fn, path=path: fn(path))
            tm[name].times.append(dt)
            if rep == 0:
                tm[name].extra["bytes_on_disk"] = du(path)
                tm[name].extra["bytes_apparent"] = apparent_size(path)
            remove(path)
            log(f"  rep {rep + 1}/{cfg.reps} {name:<24} {dt:7.3f} s")
    remove(root)
    raw = tm["ravex none"].extra["bytes_apparent"]
    out = {
        "state_bytes": nbytes, "dtype": "bfloat16",
        "writes": {n: t.to_json(nbytes) | {"compression_ratio": _r(nbytes / t.extra["bytes_apparent"], 3)}
                   for n, t in tm.items()},
        "ratios": {
            "zstd_bytes_over_none": _r(tm["ravex zstd"].extra["bytes_apparent"] / raw, 3),
            "blosc_bytes_over_none": _r(tm["ravex blosc"].extra["bytes_apparent"] / raw, 3),
            "zstd_time_over_none": _r(tm["ravex zstd"].median / tm["ravex none"].median, 3),
            "blosc_time_over_none": _r(tm["ravex blosc"].median / tm["ravex none"].median, 3),
            "ravex_none_time_over_torch_save": _r(tm["ravex none"].median / tm["torch.save"].median, 3),
        },
    }
    return out


# ---- driver ----------------------------------------------------------------------------------


def run(cfg: Config) -> dict[str, Any]:
    results: dict[str, Any] = {"config": {k: v for k, v in cfg.__dict__.items() if k != "log"}}
    t0 = time.perf_counter()
    kept: dict[str, str] | None = None
    try:
        if "a_stall" in cfg.sections:
            results["a_stall"] = a_stall(cfg)
            kept = results["a_stall"].pop("_keep")
        if "e_load" in cfg.sections:
            results["e_load"] = e_load(cfg, kept)
    finally:
        for p in (kept or {}).values():
            remove(p)
        remove(os.path.join(cfg.scratch, "a"))
    if "f_patch_overhead" in cfg.sections:
        results["f_patch_overhead"] = f_patch_overhead(cfg)
    if "b_frozen" in cfg.sections or "d_ten_checkpoints" in cfg.sections:
        results["b_frozen"], results["d_ten_checkpoints"] = bd_frozen(cfg)
    if "c_sparse" in cfg.sections:
        results["c_sparse"] = c_sparse(cfg)
    if "g_bf16" in cfg.sections:
        results["g_bf16"] = g_bf16(cfg)
    if "i_sparse_cpu" in cfg.sections:
        from ravex.format.objects.tabledelta import TABLE_MIN_CHUNKS

        from . import sparse_cpu

        rows = max(cfg.sparse_rows, TABLE_MIN_CHUNKS * 2048 // (4 * cfg.sparse_dim))  # a table even when quick
        results["i_sparse_cpu"] = sparse_cpu.run(sparse_cpu.Config(
            rows=rows, dim=cfg.sparse_dim, intervals=3, reps=min(cfg.reps, 2), scratch=cfg.scratch, log=cfg.log))
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    return results
