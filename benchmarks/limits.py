"""Physical limits measured in the same run: what the disk, memory and one core can do.

The disk writes are shaped like the contenders' saves (a fresh path, fsync'd) so the
write loop can interleave them with the contenders, and noise from other users of the
machine lands on all of them alike.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .util import MIB, fsync_path

BLOCK = 16 * MIB


def _blocks(total: int, block: int) -> Iterator[int]:
    left = total
    while left > 0:
        n = min(block, left)
        yield n
        left -= n


def _pattern(nbytes: int) -> memoryview:
    """A reused, incompressible source buffer (the disk does not care, a codec would)."""
    return memoryview(np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8))


def disk_one_file(path: str, total: int) -> None:
    """One file of ``total`` bytes in 16 MiB writes from a reused buffer, then fsync."""
    src = _pattern(BLOCK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for n in _blocks(total, BLOCK):
            view = src[:n]
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(os.path.dirname(path) or ".")


def direct_io_supported(folder: str) -> bool:
    """Whether the file system under ``folder`` takes ``O_DIRECT`` writes (tmpfs and some FUSE
    file systems refuse them): one aligned block written to a probe file, then removed."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    probe = os.path.join(folder, ".direct-probe")
    buf = mmap.mmap(-1, mmap.PAGESIZE)  # page-aligned, as O_DIRECT asks of the address
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
    except OSError:
        return False
    try:
        os.write(fd, buf)
        return True
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    finally:
        os.close(fd)
        os.unlink(probe)
        buf.close()


ALIGN = 4096  # O_DIRECT's alignment of address, length and offset (every block size up to 4 KiB)


def _aligned_pattern(nbytes: int) -> memoryview:
    """:func:`_pattern` in a page-aligned buffer (anonymous ``mmap``), as ``O_DIRECT`` asks."""
    buf = mmap.mmap(-1, nbytes)
    buf.write(_pattern(nbytes))
    return memoryview(buf)


def _write_direct(path: str, src: memoryview, total: int, create: int) -> None:
    """``total`` bytes of ``src`` (repeated) into a new file at ``path``: the 4 KiB-aligned body
    with ``O_DIRECT``, a tail shorter than 4 KiB through the page cache, as Ravex's direct
    writes do. No fsync: the caller's durability step does it."""
    body = total - total % ALIGN
    fd = os.open(path, os.O_WRONLY | create | os.O_DIRECT, 0o644)
    try:
        for n in _blocks(body, src.nbytes):
            view = src[:n]
            while view:
                view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    if body < total:
        with open(path, "r+b", buffering=0) as f:
            f.seek(body)
            f.write(src[:total - body])


def disk_direct_file(path: str, total: int) -> None:
    """One file of ``total`` bytes in 16 MiB ``O_DIRECT`` writes from a reused page-aligned
    buffer, then fsync (file and folder): the disk without the page cache in between.

    The buffered references copy every byte into freshly allocated page-cache pages first; on
    this VM that allocation swings with what the host has reclaimed (the one-file reference
    took 0.47-3.2 s per GiB minutes apart), which is the VM's memory, not the disk. The
    caller checks :func:`direct_io_supported` first."""
    _write_direct(path, _aligned_pattern(BLOCK), total, os.O_CREAT | os.O_TRUNC)
    fsync_path(path)
    fsync_path(os.path.dirname(path) or ".")


def disk_objects(path: str, total: int, obj_bytes: int = 4 * MIB, threads: int = 4, defer: bool = False,
                 writeback: bool = False, direct: bool = False) -> None:
    """``total`` bytes as objects of ``obj_bytes``, each written and fsync'd, from ``threads``
    threads, into 256 fan-out folders like a content-addressed store; folders fsync'd last.

    ``defer``: write every object first and fsync them all at the end (same durability
    when the end is reached, as before a manifest is written; the kernel can write back
    while later objects are still being written instead of one journal commit per object).
    ``writeback``: with ``defer``, start each object's writeback as soon as it is written
    (``sync_file_range``, as Ravex's LocalStorage does), so the disk is busy meanwhile.
    ``direct``: each object written with ``O_DIRECT`` from a page-aligned buffer (as Ravex's
    LocalStorage writes large objects), past the page cache; the caller checks
    :func:`direct_io_supported` first."""
    from ravex.format.storage import start_writeback

    src = _aligned_pattern(obj_bytes) if direct else _pattern(obj_bytes)
    sizes = list(_blocks(total, obj_bytes))
    os.makedirs(path)
    folders = [os.path.join(path, f"{i:02x}") for i in range(min(256, len(sizes)))]
    for f in folders:
        os.mkdir(f)

    def put(i: int, n: int) -> None:
        if direct:
            _write_direct(os.path.join(folders[i % len(folders)], f"{i:08x}"), src, n, os.O_CREAT | os.O_EXCL)
            if not defer:
                fsync_path(os.path.join(folders[i % len(folders)], f"{i:08x}"))
            return
        fd = os.open(os.path.join(folders[i % len(folders)], f"{i:08x}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = src[:n]
            while view:
                view = view[os.write(fd, view):]
            if not defer:
                os.fsync(fd)
            elif writeback:
                start_writeback(fd)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(threads) as pool:
        for fut in [pool.submit(put, i, n) for i, n in enumerate(sizes)]:
            fut.result()
        if defer:
            names = [os.path.join(folders[i % len(folders)], f"{i:08x}") for i in range(len(sizes))]
            for fut in [pool.submit(fsync_path, name) for name in names]:
                fut.result()
    for f in folders:
        fsync_path(f)
    fsync_path(path)


def read_file(path: str) -> int:
    """Read a whole file into a reused 16 MiB buffer; returns bytes read."""
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                return total
            total += n


# ---- memory and CPU -------------------------------------------------------------------------


def copy_reused(arrays: list[np.ndarray], dst: list[np.ndarray]) -> None:
    for s, d in zip(arrays, dst, strict=True):
        np.copyto(d, s)


def copy_fresh(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [a.copy() for a in arrays]


def sample_chunks(arrays: list[np.ndarray], chunk: int, limit: int) -> list[memoryview]:
    """Up to ``limit`` bytes of ``chunk``-sized slices spread over every array (weights and moments)."""
    chunks: list[memoryview] = []
    for a in arrays:
        flat = memoryview(a.reshape(-1).view(np.uint8))
        for start in range(0, flat.nbytes - chunk + 1, chunk):
            chunks.append(flat[start:start + chunk])
    if not chunks:
        return [memoryview(a.reshape(-1).view(np.uint8)) for a in arrays if a.nbytes]
    keep = max(1, limit // chunk)
    stride = max(1, len(chunks) // keep)
    return chunks[::stride][:keep]


def cpu_rates(arrays: list[np.ndarray], reps: int, sample_bytes: int) -> dict[str, Any]:
    """One core: hashing and encoding rates (GB/s of input) and compression ratios on the state."""
    import numcodecs
    import xxhash

    chunks = sample_chunks(arrays, 4 * MIB, sample_bytes)
    total = sum(c.nbytes for c in chunks)
    zstd = numcodecs.Zstd(level=1)
    blosc = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE, blocksize=0)
    blosc_threads = numcodecs.blosc.get_nthreads() if hasattr(numcodecs.blosc, "get_nthreads") else None

    def run(fn: Any) -> tuple[float, int]:
        best = []
        out_bytes = 0
        for _ in range(reps):
            t0 = time.perf_counter()
            out_bytes = sum(fn(c) for c in chunks)
            best.append(time.perf_counter() - t0)
        best.sort()
        return best[len(best) // 2], out_bytes

    t_hash, _ = run(lambda c: len(xxhash.xxh3_128_digest(c)) * 0)
    t_zstd, z_bytes = run(lambda c: len(zstd.encode(c)))
    t_blosc, b_bytes = run(lambda c: len(blosc.encode(np.frombuffer(c, dtype="u4"))))
    return {
        "sample_bytes": total,
        "xxh3_128_gb_s": round(total / t_hash / 1e9, 3),
        "zstd1_gb_s": round(total / t_zstd / 1e9, 3),
        "zstd1_ratio": round(total / z_bytes, 4),
        "blosc_lz4_bitshuffle_gb_s": round(total / t_blosc / 1e9, 3),
        "blosc_lz4_bitshuffle_ratio": round(total / b_bytes, 4),
        "blosc_threads": blosc_threads,
    }
