"""Small helpers: timing, durability, page cache, disk usage, machine notes."""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ravex.format.storage.atomic import fsync_path

GIB = 1 << 30
MIB = 1 << 20


@dataclass
class Timed:
    """Repeated timings of one thing, and its figures."""

    times: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    def to_json(self, nbytes: int | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {"times_s": [round(t, 4) for t in self.times], "median_s": round(self.median, 4)}
        if nbytes:
            doc["gib_s"] = round(nbytes / GIB / self.median, 4) if self.median > 0 else None
        doc.update(self.extra)
        return doc


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def fsync_tree(root: str) -> None:
    """fsync every file under ``root`` and every folder (what a durable save must end with)."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)


def du(path: str) -> int:
    """Bytes allocated on disk under ``path`` (st_blocks, as ``du`` counts them)."""
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def apparent_size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(folder, name))
    return total


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.unlink(path)


def cached_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1])
    return -1


def drop_caches() -> bool:
    """sync, then ask the kernel to drop clean page cache. True if it worked."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def file_cached_fraction(path: str) -> float | None:
    """Fraction of a file's pages resident in page cache (mincore(2)), or None if unknown."""
    try:
        import ctypes
        import mmap

        size = os.path.getsize(path)
        if size == 0:
            return 0.0
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(addr, size, vec) != 0:
                    return None
                return sum(b & 1 for b in bytes(vec)) / pages
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    except Exception:
        return None


def git_rev(repo: str) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
        dirty = subprocess.run(
            ["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        )
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except Exception:
        return "unknown"


def machine_notes(scratch: str) -> dict[str, Any]:
    import numpy as np
    import torch

    notes: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "loadavg_start": list(os.getloadavg()),
        "scratch": scratch,
    }
    try:
        with open("/proc/meminfo") as f:
            notes["mem_total_gib"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    try:
        st = os.statvfs(scratch)
        notes["scratch_free_gib"] = round(st.f_bavail * st.f_frsize / GIB, 1)
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("zarr", "numcodecs", "safetensors", "xxhash", "ml_dtypes"):
        try:
            notes[dist] = version(dist)
        except PackageNotFoundError:
            notes[dist] = None
    return notes


#: what a ``FsspecStorage`` method costs on an object store (``delete_if_older`` is its HEAD: the
#: DELETE it then sends goes through ``delete``, counted there)
BILLED = {"write": "PUT", "create": "PUT", "read": "GET", "read_range": "GET", "list_dir": "LIST",
          "walk": "LIST", "exists": "HEAD", "size": "HEAD", "delete": "DELETE", "delete_if_older": "HEAD"}


def count_requests(counts: Counter[str], kind: Callable[[str], str] | None = None) -> threading.Lock:
    """Wrap every billed ``FsspecStorage`` method to count into ``counts`` as the object store bills
    it (``PUT bytes`` too). ``kind``: each request is also counted under ``"<op> <kind(key)>"``.
    Returns the lock the counting holds (take it to copy ``counts`` while Ravex's threads count)."""
    from ravex.format.storage.fsspec_store import FsspecStorage

    lock = threading.Lock()  # Ravex calls storage from several threads (writers, parallel reads)
    for method, op in BILLED.items():
        original = getattr(FsspecStorage, method)

        def counted(self: Any, *args: Any, _original: Any = original, _op: str = op, **kwargs: Any) -> Any:
            with lock:
                counts[_op] += 1
                if _op == "PUT" and len(args) > 1:
                    counts["PUT bytes"] += memoryview(args[1]).nbytes
                if kind is not None and args and isinstance(args[0], str):
                    counts[f"{_op} {kind(args[0])}"] += 1
            return _original(self, *args, **kwargs)

        setattr(FsspecStorage, method, counted)
    return lock
