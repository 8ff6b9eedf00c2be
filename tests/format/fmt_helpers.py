"""Shared helpers of the format tests: exact comparison, on-disk accounting, call counting,
deterministic writer states (used by the child processes too), zarr store assembly.

Imported by the tests (pytest puts this folder on sys.path) and by ``_child.py``.
"""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("_child.py")
PY = sys.executable


# ---- exact comparison --------------------------------------------------------------------


def assert_same(got: Any, want: Any, where: str = "root") -> None:
    """Types exactly equal, arrays bit-exact (raw bytes, NaN payloads included), dict order kept.

    Python floats: bit-exact (so -0.0 != 0.0), except that a NaN only has to come back
    as a NaN (typed JSON keeps floats by ``repr``, which has no NaN sign or payload).
    """
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: got {type(got).__name__}, want ndarray"
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
        assert got.tobytes() == want.tobytes(), f"{where}: array bytes differ"
        return
    assert type(got) is type(want), f"{where}: type {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, float):
        if math.isnan(want):
            assert math.isnan(got), f"{where}: {got!r} is not nan"
        else:
            assert struct.pack("<d", got) == struct.pack("<d", want), f"{where}: {got!r} != {want!r}"
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)!r} != {list(want)!r}"
        for k in want:
            assert_same(got[k], want[k], f"{where}/{k!r}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}/{i}")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


# ---- what is on disk ---------------------------------------------------------------------


def object_files(root: str | os.PathLike[str]) -> dict[str, os.stat_result]:
    """Every finished object file under ``root/objects`` (temp files excluded) with its stat."""
    out = {}
    base = Path(root) / "objects"
    for folder, _dirs, files in os.walk(base):
        for name in files:
            if not name.startswith(".tmp-"):
                p = Path(folder) / name
                out[str(p.relative_to(root))] = p.stat()
    return out


def snapshot(root: str | os.PathLike[str]) -> dict[str, tuple[int, int, int]]:
    """(size, inode, mtime_ns) of every object file: a rewrite of an identical object shows."""
    return {k: (s.st_size, s.st_ino, s.st_mtime_ns) for k, s in object_files(root).items()}


def tree_bytes(root: str | os.PathLike[str]) -> int:
    """Bytes of every file under ``root`` (objects, manifests, root document)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            total += (Path(folder) / name).stat().st_size
    return total


# ---- counting calls through the storage seam ----------------------------------------------

READ_METHODS = ("read", "read_into", "read_range", "exists", "size", "list_dir", "walk")
#: Every way bytes reach storage (a commit writes its chunk objects pending, then publishes them).
WRITE_METHODS = ("write", "write_pending")


@contextmanager
def counting(storage: Any, methods: tuple[str, ...] = READ_METHODS) -> Iterator[list[tuple]]:
    """Record ``(method, key, *args)`` of every call to ``methods`` on this Storage instance."""
    log: list[tuple] = []

    def wrap(name: str, orig: Any) -> Any:
        def counted(key: str, *args: Any, **kwargs: Any) -> Any:
            log.append((name, key, *args[:2]) if name == "read_range" else (name, key))
            return orig(key, *args, **kwargs)

        return counted

    for name in methods:
        setattr(storage, name, wrap(name, getattr(storage, name)))
    try:
        yield log
    finally:
        for name in methods:
            delattr(storage, name)


def assert_metadata_only(writes: list[tuple], step: int, rank: int = 0) -> None:
    """A commit that stored no object: it wrote its manifest (and the optional refs.json) only."""
    keys = [c[1] for c in writes]
    assert [k for k in keys if k.startswith("objects")] == [], keys
    assert keys[0] == f"steps/{step}/rank-{rank}.json" and set(keys[1:]) <= {f"steps/{step}/refs.json"}, keys


def object_calls(log: list[tuple]) -> list[tuple]:
    """The calls of a log that touched an object (or listed the objects folder)."""
    return [c for c in log if str(c[1]).startswith("objects")]


# ---- deterministic states of the writer children ------------------------------------------

_FROZEN: dict[int, np.ndarray] = {}


def writer_state(step: int, size: int = 1) -> dict:
    """The state a writer child commits at ``step``: reproducible from the step number.

    A frozen weight (same every step), live weights and an optimizer moment that change
    every step, a small bias (packed), a 0-d array (inline) and plain values.
    ``size`` scales the bulk (1 = about 1 MiB of changing data per step).
    """
    rows = 128 * size
    if size not in _FROZEN:
        _FROZEN[size] = np.random.default_rng(12345).standard_normal((rows, 1024)).astype(np.float32)
    rng = np.random.default_rng(step)
    live = rng.standard_normal((rows, 1024), dtype=np.float32)
    return {
        "model": {
            "frozen.weight": _FROZEN[size],
            "live.weight": live,
            "live.bias": rng.standard_normal(1000).astype(np.float32),
            "step_tensor": np.array(step, dtype=np.int64),
        },
        "optim": {
            "state": {0: {"exp_avg": (live * np.float32(0.5)).astype(np.float16), "step": float(step)}},
            "param_groups": [{"lr": 1.0 / (step + 1), "betas": (0.9, 0.999), "params": [0]}],
        },
        "step": step,
        "rng": rng.bytes(16),
    }


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def spawn(*args: str, stdin: bool = False) -> subprocess.Popen:
    """Start ``_child.py`` with ``args``; its stdout is a line-buffered text pipe."""
    return subprocess.Popen(
        [PY, str(CHILD), *args],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        env=child_env(),
        text=True,
        bufsize=1,
    )


def expect_line(proc: subprocess.Popen, prefix: str) -> str:
    """Read lines of a child until one starts with ``prefix``; fail if it exits first."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"child exited (rc={proc.wait()}) before printing {prefix!r}")


# ---- zarr assembly ------------------------------------------------------------------------


def chunk_bytes_of(store_root: str | os.PathLike[str], ref: Any) -> bytes:
    """The stored (encoded) bytes of one chunk: inline, a whole object, or a pack's range."""
    from ravex.format.objects.names import object_key

    if ref.inline is not None:
        return bytes(ref.inline)
    data = (Path(store_root) / object_key(ref.object)).read_bytes()
    if ref.offset is not None:
        data = data[ref.offset : ref.offset + ref.size]
    return data


def assemble_zarr(store_root: str | os.PathLike[str], manifests: list, out_dir: str | os.PathLike[str]) -> None:
    """Lay the step's arrays out as a plain zarr v3 hierarchy on disk: each array's exact
    ``zarr.json`` from the manifest, each chunk's stored bytes at its chunk key."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    for m in manifests:
        for path, entry in m.arrays.items():
            d = out / path
            d.mkdir(parents=True, exist_ok=True)
            (d / "zarr.json").write_text(json.dumps(entry.zarr))
            for key, ref in entry.chunks.items():
                f = d / key
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_bytes(chunk_bytes_of(store_root, ref))


class Crash(Exception):
    """The process 'dies' here."""


#: every call of a Storage, writes, syncs and deletes included
STORAGE_CALLS = ("read", "read_range", "write", "write_pending", "publish", "sync", "exists", "size", "list_dir",
                 "walk", "delete", "delete_if_older", "remove_empty_dir")
#: the calls GC makes on a store no writer touches: reads, listings, deletes
GC_CALLS = ("read", "read_range", "list_dir", "walk", "delete", "delete_if_older", "remove_empty_dir", "exists")


def crash_after(storage, calls: int, names: tuple[str, ...] = STORAGE_CALLS) -> list[int]:
    """Make the ``calls``-th call from now on of ``names`` on ``storage`` raise :class:`Crash`;
    the returned counter holds how many calls are left before it."""
    left = [calls]
    for name in names:
        orig = getattr(storage, name)

        def wrapped(*args, _orig=orig, **kwargs):
            left[0] -= 1
            if left[0] < 0:
                raise Crash()
            result = _orig(*args, **kwargs)
            return list(result) if hasattr(result, "__next__") else result

        setattr(storage, name, wrapped)
    return left

