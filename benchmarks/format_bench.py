"""``python -m benchmarks format``: Ravex's format against torch.save, safetensors and DCP.

One run, one state, every contender: durable write throughput, cold and warm load,
the physical limits of this machine measured in between, delta bytes of unchanged
and 90%-frozen states, and a chunk size x thread count sweep of Ravex's writer.
Repetitions are interleaved (rep 1 of every contender, then rep 2, ...) so that a
noisy neighbour slows all of them alike; figures are medians and ratios.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import contenders as C
from . import limits as L
from . import state as S
from .active import free
from .util import (
    GIB,
    MIB,
    Timed,
    apparent_size,
    cached_kib,
    drop_caches,
    du,
    file_cached_fraction,
    remove,
)


@dataclass
class Config:
    size_mib: float = 1024
    reps: int = 3
    scratch: str = "/tmp"
    sweep_mib: float = 256
    sweep_chunks_mib: tuple[int, ...] = (1, 4, 16)
    sweep_threads: tuple[int, ...] = (2, 4, 8)
    sweep_compressed: tuple[str, ...] = ("zstd", "blosc")
    cold: bool = True  # drop the page cache before each timed load
    settle: bool = True  # os.sync() before each timed write (waits for everyone's dirty pages: not in CI)
    sections: tuple[str, ...] = ("limits", "write", "read", "delta", "sweep")
    log: Any = print


def _arrays(tree: Any) -> list[np.ndarray]:
    return [v for v in S.flatten(tree).values() if isinstance(v, np.ndarray)]


def run(cfg: Config) -> dict[str, Any]:
    log = cfg.log
    results: dict[str, Any] = {"config": {k: v for k, v in cfg.__dict__.items() if k != "log"}}
    t_start = time.perf_counter()

    log(f"building state: ~{cfg.size_mib:g} MiB of Linear layers + AdamW ...")
    dense = S.build(cfg.size_mib)
    state = dense.torch_state()
    tree = S.to_numpy_tree(state)
    arrays = _arrays(tree)
    nbytes = sum(a.nbytes for a in arrays)
    results["state"] = {
        "layers": S.LAYERS,
        "width": dense.width,
        "dtype": "float32",
        "tensors": len(arrays),
        "tensor_bytes": nbytes,
        "tensor_gib": round(nbytes / GIB, 4),
        "optimizer": "AdamW (exp_avg, exp_avg_sq, step), 3 steps taken",
    }
    log(f"state: {len(arrays)} tensors, {nbytes / MIB:.1f} MiB, width {dense.width}")

    cold_ok = cfg.cold and drop_caches()
    results["page_cache"] = {"drop_caches_worked": cold_ok}

    if "limits" in cfg.sections:
        results["limits"] = _limits(cfg, arrays)
    keep: dict[str, str] = {}
    loads: list[tuple[str, str, Any]] = []
    try:
        if "write" in cfg.sections or "read" in cfg.sections:
            cons = C.build(state, tree)
            keep = _writes(cfg, cons, nbytes, results)
            _check_ravex_roundtrip(keep, tree)
            if "read" in cfg.sections:
                loads = _prepare_loads(keep, cons)
            del cons
        if "delta" in cfg.sections:
            results["delta"] = {"unchanged": _delta_unchanged(cfg, tree)}
        if "sweep" in cfg.sections:
            results["sweep"] = _sweep(cfg, tree)
        # the loads need only the files and their own targets: free the training state first
        del state, tree, arrays, dense
        free()
        if loads:
            _reads(cfg, loads, nbytes, results, cold_ok)
            del loads
            free()
    finally:
        for path in keep.values():
            remove(path)
    if "delta" in cfg.sections:
        results["delta"]["frozen_90"] = _delta_frozen(cfg)
    results["wall_s"] = round(time.perf_counter() - t_start, 1)
    results["loadavg_end"] = list(os.getloadavg())
    return results


# ---- limits -----------------------------------------------------------------------------------


def _limits(cfg: Config, arrays: list[np.ndarray]) -> dict[str, Any]:
    log = cfg.log
    nbytes = sum(a.nbytes for a in arrays)
    log("limits: memory copy, hashing and codecs on one core ...")
    dst = [np.empty_like(a) for a in arrays]
    for d in dst:
        d.reshape(-1).view(np.uint8)[:] = 0  # faulted in before timing: these are reused staging buffers
    reused, fresh = Timed(), Timed()
    for _ in range(cfg.reps):
        reused.times.append(_t(lambda dst=dst: L.copy_reused(arrays, dst)))
        t0 = time.perf_counter()
        copies = L.copy_fresh(arrays)
        fresh.times.append(time.perf_counter() - t0)
        del copies
        free()
    del dst
    free()
    cpu = L.cpu_rates(arrays, cfg.reps, min(nbytes, 256 * MIB))
    return {
        "copy_into_reused_buffers": reused.to_json(nbytes),
        "copy_into_fresh_allocations": fresh.to_json(nbytes),
        "cpu_one_core": cpu,
    }


def _rotated(items: list, rep: int) -> list[tuple[int, Any]]:
    """``enumerate(items)`` started at a different place each repetition, so no contender is
    always the one that runs right after another's writeback or in the same slot of a noisy cycle."""
    k = rep % max(1, len(items))
    order = list(enumerate(items))
    return order[k:] + order[:k]


def _t(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- writes -----------------------------------------------------------------------------------


def _writes(cfg: Config, cons: list[C.Contender], nbytes: int, results: dict[str, Any]) -> dict[str, str]:
    """Durable full-checkpoint writes of every contender plus the disk's own limits, interleaved.
    Returns the path of one output per contender (kept for the loads)."""
    log = cfg.log
    entries: list[tuple[str, Any, str]] = [
        ("disk: one file + fsync", lambda p: L.disk_one_file(p, nbytes), "limit"),
        ("disk: 4 MiB objects x4 threads, each fsync'd", lambda p: L.disk_objects(p, nbytes), "limit"),
        ("disk: 4 MiB objects x4 threads, fsyncs at end", lambda p: L.disk_objects(p, nbytes, defer=True), "limit"),
    ]
    entries += [(c.name, c.save, "ravex" if not c.peer else "peer") for c in cons]
    timings = {name: Timed() for name, _, _ in entries}
    keep: dict[str, str] = {}
    for rep in range(cfg.reps):
        for i, (name, save, _kind) in _rotated(entries, rep):
            path = os.path.join(cfg.scratch, f"w{i}-r{rep}")
            if cfg.settle:
                os.sync()  # start from a quiet disk: nothing of the previous contender left to flush
            t0 = time.perf_counter()
            detail = save(path)
            dt = time.perf_counter() - t0
            timings[name].times.append(dt)
            if rep == 0:
                timings[name].extra.update(
                    {"kind": _kind, "bytes_apparent": apparent_size(path), "bytes_on_disk": du(path)}
                )
                if detail:
                    timings[name].extra["ravex"] = detail
            log(f"  write rep {rep + 1}/{cfg.reps} {name:<46} {dt:7.3f} s  {nbytes / GIB / dt:6.3f} GiB/s")
            if rep == cfg.reps - 1:
                keep[name] = path
            else:
                remove(path)
    base = timings["torch.save"].median
    disk = timings["disk: one file + fsync"].median
    out = {}
    for name, tm in timings.items():
        doc = tm.to_json(nbytes)
        doc["speedup_vs_torch_save"] = round(base / tm.median, 3)
        doc["fraction_of_disk_one_file"] = round(disk / tm.median, 3)
        out[name] = doc
    results["write"] = out
    # the disk-limit outputs are only needed for the raw read bandwidth (the one file)
    remove(keep.pop("disk: 4 MiB objects x4 threads, each fsync'd"))
    remove(keep.pop("disk: 4 MiB objects x4 threads, fsyncs at end"))
    return keep


# ---- reads ------------------------------------------------------------------------------------


def _first_file(path: str) -> str | None:
    if os.path.isfile(path):
        return path
    for folder, _dirs, files in os.walk(path):
        for name in sorted(files):
            if name.endswith(".json"):
                continue
            return os.path.join(folder, name)
    return None


def _prepare_loads(keep: dict[str, str], cons: list[C.Contender]) -> list[tuple[str, str, Any]]:
    """(label, path, load) for every loader, in-place targets allocated and faulted in now."""
    loads: list[tuple[str, str, Any]] = [("disk: read one file", keep["disk: one file + fsync"], L.read_file)]
    for c in cons:
        if c.name in keep:
            loads += [(label, keep[c.name], fn) for label, fn in c.loads.items()]
    for _label, path, fn in loads:
        if hasattr(fn, "prepare"):
            fn.prepare(path)
    return loads


def _reads(cfg: Config, loads: list[tuple[str, str, Any]], nbytes: int, results: dict[str, Any],
           cold_ok: bool) -> None:
    log = cfg.log
    cold = {label: Timed() for label, _, _ in loads}
    warm = {label: Timed() for label, _, _ in loads}
    residency: dict[str, float | None] = {}
    for rep in range(cfg.reps):
        for _i, (label, path, fn) in _rotated(loads, rep):
            line = f"  read rep {rep + 1}/{cfg.reps} {label:<34}"
            if cold_ok:
                drop_caches()
                probe = _first_file(path)
                residency[label] = file_cached_fraction(probe) if probe else None
                dt = _timed_load(fn, path)
                cold[label].times.append(dt)
                line += f" cold {dt:7.3f} s"
            dt = _timed_load(fn, path)  # again, from the page cache: the loader's own cost
            warm[label].times.append(dt)
            log(line + f" warm {dt:7.3f} s")
    out = {}
    for which, tm in (("cold", cold), ("warm", warm)):
        if not tm["torch.load"].times:
            continue
        base = tm["torch.load"].median
        for label, _path, _fn in loads:
            doc = tm[label].to_json(nbytes) | {"speedup_vs_torch_load": round(base / tm[label].median, 3)}
            out.setdefault(label, {})[which] = doc
    for label in out:
        out[label]["first_file_cached_fraction_before_cold_read"] = residency.get(label)
    results["read"] = out
    results["page_cache"]["cached_kib_after_reads"] = cached_kib()


def _timed_load(fn: Any, path: str) -> float:
    """Seconds to load and touch every page; freeing the result is not timed."""
    t0 = time.perf_counter()
    result = fn(path)
    _touch(result)
    dt = time.perf_counter() - t0
    del result
    return dt


def _touch(tree: Any) -> int:
    """Read one byte of every 4 KiB page of every tensor a load returned: a loader that maps the
    file lazily (safetensors) pays for its reads here, as training would on first use."""
    import torch

    total = 0
    for v in S.flatten(tree).values() if isinstance(tree, (dict, list, tuple)) else ():
        if isinstance(v, torch.Tensor) and v.numel():
            total += int(v.detach().reshape(-1).view(torch.uint8)[::4096].sum())
        elif isinstance(v, np.ndarray) and v.size:
            total += int(v.reshape(-1).view(np.uint8)[::4096].sum())
    return total


def _check_ravex_roundtrip(keep: dict[str, str], tree: Any) -> None:
    """Every Ravex output reads back bit-exact (a benchmark of wrong bytes is no benchmark)."""
    want = {k: v for k, v in S.flatten(tree).items() if isinstance(v, np.ndarray)}
    for name, path in keep.items():
        if not name.startswith("ravex"):
            continue
        got = {k: v for k, v in S.flatten(C.ravex_load(path)).items() if isinstance(v, np.ndarray)}
        bad = [k for k in want if k not in got or not np.array_equal(want[k], got[k])]
        if bad:
            raise AssertionError(f"{name}: {len(bad)} tensors differ after a round trip, e.g. {bad[:3]}")
        del got
        free()


# ---- delta ------------------------------------------------------------------------------------


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def _changed_bytes(before: dict[tuple, np.ndarray], after: dict[tuple, np.ndarray], reader: Any) -> dict[str, int]:
    """Ground truth from content, independent of Ravex's hashes: bytes of tensors that changed,
    and bytes of the chunks (on the grid the manifest declares) whose content changed."""
    from ravex.format.objects.names import escape_key

    tensors = chunks = total = 0
    for key, a in after.items():
        b = before.get(key)
        total += a.nbytes
        if b is not None and b.shape == a.shape and _same_bytes(a, b):
            continue
        tensors += a.nbytes
        path = "/".join(escape_key(str(p)) for p in key)
        entry = reader.arrays.get(path)
        if entry is None or not a.shape or b is None or b.shape != a.shape:
            chunks += a.nbytes
            continue
        rows = entry.chunk_shape[0]
        row_bytes = a.nbytes // max(1, a.shape[0])
        for start in range(0, a.shape[0], rows):
            if not _same_bytes(a[start:start + rows], b[start:start + rows]):
                chunks += rows * row_bytes  # Zarr stores an edge chunk at full size
    return {"changed_tensor_bytes": tensors, "changed_chunk_bytes": chunks, "state_bytes": total}


def _flat_np(tree: Any) -> dict[tuple, np.ndarray]:
    return {k: v for k, v in S.leaves(tree).items() if isinstance(v, np.ndarray)}


def _delta_unchanged(cfg: Config, tree: Any) -> dict[str, Any]:
    """(a) the same state committed twice: the second commit must write no object bytes."""
    from ravex.format import open_store

    log = cfg.log
    log("delta (a): unchanged state committed again ...")
    store_path = os.path.join(cfg.scratch, "delta-unchanged")
    store = open_store(store_path, create=True)
    with store.writer() as w:
        s1 = w.commit(1, tree)
        du1 = du(store_path)
        t0 = time.perf_counter()
        s2 = w.commit(2, tree)
        t2 = time.perf_counter() - t0
    du2 = du(store_path)
    out = {
        "state_bytes": s1.logical_bytes,
        "first_commit_new_bytes": s1.new_bytes,
        "second_commit_new_bytes": s2.new_bytes,
        "second_commit_reused_bytes": s2.reused_bytes,
        "second_commit_s": round(t2, 4),
        "first_commit_s": round(s1.seconds["total"], 4),
        "disk_bytes_added_by_second": du2 - du1,
        "manifest_bytes": s2.manifest_bytes,
    }
    log(f"  unchanged: new_bytes {s2.new_bytes}, du +{du2 - du1} B, {t2:.3f} s vs first {s1.seconds['total']:.3f} s")
    remove(store_path)
    return out


def _delta_frozen(cfg: Config) -> dict[str, Any]:
    """(b) 90% of the layers frozen (no optimizer state, never changing), one optimizer step
    between two commits: Ravex should write the trainable tenth and its two AdamW moments."""
    from ravex.format import open_store

    log = cfg.log
    root = os.path.join(cfg.scratch, "delta")
    log("delta (b): 90%-frozen fine-tuning, one more optimizer step between two commits ...")
    ft = S.build(cfg.size_mib, frozen_fraction=0.9)
    before = {k: v.copy() for k, v in _flat_np(S.to_numpy_tree(ft.torch_state())).items()}
    store_path = os.path.join(root, "frozen")
    store = open_store(store_path, create=True)
    with store.writer() as w:
        s1 = w.commit(1, S.to_numpy_tree(ft.torch_state()))
        du1 = du(store_path)
        ft.train(1, seed=99)
        tree2 = S.to_numpy_tree(ft.torch_state())
        t0 = time.perf_counter()
        s2 = w.commit(2, tree2)
        t2 = time.perf_counter() - t0
    du2 = du(store_path)
    truth = _changed_bytes(before, _flat_np(tree2), store.open_step(2))
    pt = os.path.join(root, "frozen.pt")
    t0 = time.perf_counter()
    C.torch_save(ft.torch_state(), pt)
    t_pt = time.perf_counter() - t0
    pt_bytes = os.path.getsize(pt)
    remove(pt)
    params = sum(p.numel() for p in ft.model.parameters()) * 4
    trainable = sum(p.numel() for p in ft.trainable_params) * 4
    expected = 3 * trainable  # the trainable weights and their two AdamW moments
    out = {
        "layers_frozen": ft.frozen_layers,
        "layers": S.LAYERS,
        "param_bytes": params,
        "trainable_param_bytes": trainable,
        "full_checkpoint_tensor_bytes": truth["state_bytes"],
        "expected_changed_bytes": expected,
        "expected_fraction_of_full": round(expected / truth["state_bytes"], 4),
        **truth,
        "second_commit_new_bytes": s2.new_bytes,
        "second_commit_s": round(t2, 4),
        "first_commit_s": round(s1.seconds["total"], 4),
        "disk_bytes_added_by_second": du2 - du1,
        "new_over_changed_chunks": round(s2.new_bytes / max(1, truth["changed_chunk_bytes"]), 4),
        "new_over_changed_tensors": round(s2.new_bytes / max(1, truth["changed_tensor_bytes"]), 4),
        "new_over_full_state": round(s2.new_bytes / max(1, truth["state_bytes"]), 4),
        "torch_save_bytes": pt_bytes,
        "torch_save_s": round(t_pt, 4),
        "new_over_torch_save": round(s2.new_bytes / pt_bytes, 4),
        "second_commit_s_over_torch_save_s": round(t2 / t_pt, 4),
    }
    log(
        f"  frozen: new_bytes {s2.new_bytes / MIB:.1f} MiB, changed chunks "
        f"{truth['changed_chunk_bytes'] / MIB:.1f} MiB, torch.save {pt_bytes / MIB:.1f} MiB"
    )
    remove(root)
    del ft, before, tree2
    free()
    return out


# ---- chunk size x threads ---------------------------------------------------------------------


def _sweep_subset(tree: Any, target: int) -> dict[str, np.ndarray]:
    """Every k-th tensor of the state (weights, biases and moments alike) so that about
    ``target`` bytes remain: the tensors keep their real size, which is what chunking sees."""
    items = [(".".join(map(str, k)), v) for k, v in S.leaves(tree).items() if isinstance(v, np.ndarray)]
    total = sum(v.nbytes for _, v in items)
    stride = max(1, round(total / max(1, target)))
    return dict(items[::stride])


def _sweep(cfg: Config, full_tree: Any) -> dict[str, Any]:
    log = cfg.log
    tree = _sweep_subset(full_tree, int(cfg.sweep_mib * MIB))
    nbytes = sum(a.nbytes for a in tree.values())
    log(f"sweep: chunk size x threads on {nbytes / MIB:.0f} MiB ({len(tree)} tensors of the state) ...")
    configs = [("none", c, t) for c in cfg.sweep_chunks_mib for t in cfg.sweep_threads]
    configs += [(comp, 4, t) for comp in cfg.sweep_compressed for t in cfg.sweep_threads]
    timings = {cfgk: Timed() for cfgk in configs}
    for rep in range(cfg.reps):
        for i, (comp, chunk, threads) in _rotated(configs, rep):
            path = os.path.join(cfg.scratch, f"s{i}-r{rep}")
            if cfg.settle:
                os.sync()
            t0 = time.perf_counter()
            stats = C.ravex_save(tree, path, comp, chunk_bytes=chunk * MIB, threads=threads)
            dt = time.perf_counter() - t0
            timings[(comp, chunk, threads)].times.append(dt)
            timings[(comp, chunk, threads)].extra["stored_bytes"] = stats.new_bytes
            remove(path)
            log(f"  sweep rep {rep + 1}/{cfg.reps} {comp:<5} chunk {chunk:>2} MiB threads {threads}: {dt:6.3f} s")
    rows = []
    for (comp, chunk, threads), tm in timings.items():
        rows.append({"compression": comp, "chunk_mib": chunk, "threads": threads, **tm.to_json(nbytes)})
    best = {}
    for comp in ["none", *cfg.sweep_compressed]:
        cand = [r for r in rows if r["compression"] == comp]
        if cand:
            b = min(cand, key=lambda r: r["median_s"])
            best[comp] = {"chunk_mib": b["chunk_mib"], "threads": b["threads"], "gib_s": b["gib_s"]}
    return {"state_bytes": nbytes, "tensors": len(tree), "rows": rows, "best": best}
