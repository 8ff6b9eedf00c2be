"""The stage's CPU copies, shared between the training thread and helper threads.

The training loop is blocked while its state is copied into the staging buffers, and a
single thread copies at about half of what two do on these machines (1 GiB: 0.121 s on one
thread, 0.063 s on two, measured right after an optimizer step). So the copies are cut
into pieces of at most :data:`PIECE_BYTES` and handed out one at a time, from one queue,
to the calling thread and to :data:`HELPERS` helper threads. The caller works through the
queue itself, so a helper that the machine does not schedule costs nothing but the one
piece it took (~1.5 ms); this is why the copy is not ``Tensor.copy_``'s intra-op split,
which hands each thread a fixed share and then waits for the slowest (3.7x a bare copy on a
busy machine, see ``ravex.saving.stager``). ``np.copyto`` releases the GIL while it copies.

**Hashing as it copies.** A pair queued with a chunk length is copied chunk by chunk, each
chunk in blocks of :data:`HASH_BLOCK_BYTES` that are hashed right after they land, while
they are still in the cache (:class:`~ravex.format.objects.hashing.ChunkHasher`). The writer then
finds those digests known and does not read the bytes again to hash them: measured on 1.125
GiB on two threads, the copy took 0.065 s alone and 0.071 s hashing as well, against a
separate hash pass of 0.036-0.064 CPU-s over memory (benchmarks/RESULTS.md (h), issue 26).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import torch

from ravex.format.objects.hashing import ChunkHasher
from ravex.format.writing.threads import usable_cores

_copy = np.copyto  # (a name of this module, so that a test can make a piece fail)

#: Largest piece of one tensor's bytes a thread takes at a time.
PIECE_BYTES = 8 << 20
#: The page size: what one store faults in
PAGE_BYTES = mmap.PAGESIZE
#: Helper threads (besides the caller); at most 3: memory bandwidth, not cores, is the limit.
HELPERS = max(0, min(3, usable_cores() - 1))
#: Below this many bytes in one stage the caller copies alone (waking a helper costs more).
PARALLEL_MIN_BYTES = 4 * PIECE_BYTES
#: A chunk hashed as it is copied goes in blocks of this size: each is hashed while it is in
#: the cache (1 MiB: 0.071 s for 1.125 GiB on two threads, 256 KiB 0.076, 64 KiB 0.092).
HASH_BLOCK_BYTES = 1 << 20

#: One piece of work: source bytes, destination bytes, and for a hashed chunk the length it is
#: padded to and the digests it goes into (keyed as ``ravex.format.objects.hashing.KnownDigests``).
_Piece = tuple[np.ndarray, np.ndarray, int, "dict[tuple[int, int, int], str] | None"]


def byte_view(tensor: torch.Tensor) -> np.ndarray | None:
    """A flat uint8 numpy view of a contiguous CPU tensor's bytes (any dtype, no
    ``ml_dtypes``), or None where there is none (strided, conjugate/negative bits, exotic
    tensors): those are copied by ``copy_`` on the caller's thread."""
    if tensor.is_conj() or tensor.is_neg() or not tensor.is_contiguous():
        return None
    try:
        return tensor.reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError, ValueError):
        return None


class Copier:
    """Collects ``(source bytes, destination bytes)`` pairs, then copies them all in :meth:`run`."""

    def __init__(self, helpers: int = HELPERS) -> None:
        self._helpers = helpers
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._pieces: list[_Piece] = []
        self._bytes = 0

    def add(self, src: np.ndarray, dst: np.ndarray, chunk_len: int | None = None,
            digests: dict[tuple[int, int, int], str] | None = None) -> None:
        """Queue a copy of ``src`` into ``dst`` (flat uint8 arrays of one size). With ``chunk_len``
        and ``digests``, ``dst`` is also hashed in chunks of ``chunk_len`` from its start (the
        last one padded to it), and :meth:`run` puts each chunk's digest into ``digests``."""
        if chunk_len and digests is not None:
            self._pieces.extend((src[at:at + chunk_len], dst[at:at + chunk_len], chunk_len, digests)
                                for at in range(0, src.nbytes, chunk_len))
        else:
            self._pieces.extend((src[at:at + PIECE_BYTES], dst[at:at + PIECE_BYTES], 0, None)
                                for at in range(0, src.nbytes, PIECE_BYTES))
        self._bytes += src.nbytes

    def run(self) -> None:
        """Copy everything queued; returns when every byte is in place. On an error (the
        caller's first, else a helper's) the helpers stop after the piece in hand, and none
        is still writing when the error reaches the caller."""
        pieces, self._pieces, total, self._bytes = self._pieces, [], self._bytes, 0
        self._share(pieces, total, _copy_piece)

    def fault_in(self, buffers: list[np.ndarray]) -> None:
        """Fault in every page of these new buffers (flat uint8 arrays), shared among the threads
        as the copies are: the first copy into fresh memory pays for its pages anyway, and
        paying for them apart lets the checkpoint's line say what they cost."""
        pieces = [b[at:at + PIECE_BYTES] for b in buffers for at in range(0, b.nbytes, PIECE_BYTES)]
        self._share(pieces, sum(b.nbytes for b in buffers), touch)

    def _share(self, pieces: list[Any], total: int, work: Callable[[Any], None]) -> None:
        """Run ``work`` on every piece, on the caller's thread and the helpers', one piece at a time."""
        if not pieces:
            return
        if self._helpers == 0 or total < PARALLEL_MIN_BYTES:
            for piece in pieces:
                work(piece)
            return
        order = iter(range(len(pieces)))
        lock = threading.Lock()
        halted = [False]

        def drain() -> None:
            while True:
                with lock:
                    i = None if halted[0] else next(order, None)
                if i is None:
                    return
                work(pieces[i])

        if self._pool is None or self._pid != os.getpid():  # a forked child has none of our threads
            self._pool, self._pid = ThreadPoolExecutor(self._helpers, thread_name_prefix="ravex-stage"), os.getpid()
        helpers: list[Future[None]] = []
        try:
            try:
                for _ in range(min(self._helpers, len(pieces) - 1)):
                    helpers.append(self._pool.submit(drain))
            except RuntimeError:  # the interpreter is shutting down its pools: copy alone
                pass
            drain()
        except BaseException:
            with lock:
                halted[0] = True  # helpers stop after the piece in hand
            raise
        finally:
            # None may still write into a buffer once this returns or raises: a helper that
            # never started is cancelled, one that did is waited for (a piece at most, unless
            # the caller failed first and it drains what is left).
            wait([fut for fut in helpers if not fut.cancel()])
        for fut in helpers:
            if not fut.cancelled() and fut.exception() is not None:
                raise fut.exception()  # type: ignore[misc]

    def discard(self) -> None:
        """Forget what is queued (the stage failed before running it)."""
        self._pieces, self._bytes = [], 0

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None  # (after fork() the parent's pool is not ours to shut down)


def touch(piece: np.ndarray) -> None:
    """Fault in every page of a new buffer's bytes: one ``madvise(MADV_POPULATE_WRITE)`` call
    where the kernel has it (Linux 5.14 on), which faults the range in without a trap per page
    and leaves the bytes as they are; else one byte stored per page (the kernel zeroes the rest)."""
    if not _populate(piece):
        piece[::PAGE_BYTES] = 0


#: ``madvise`` advice: fault pages in writable, as a write would, without writing (Linux 5.14)
MADV_POPULATE_WRITE = 23
_madvise: Any = None  # libc's madvise once looked up; False where it is not there or refused the advice


def _populate(piece: np.ndarray) -> bool:
    """Whether the kernel faulted in the pages under ``piece`` (the pages it starts and ends in whole:
    they belong to the same mapping, and populating changes no byte)."""
    global _madvise
    if _madvise is None:
        _madvise = False
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
                _madvise = fn
            except (OSError, AttributeError):
                pass
    if _madvise is False or piece.nbytes == 0:
        return False
    start = piece.ctypes.data - piece.ctypes.data % PAGE_BYTES
    end = piece.ctypes.data + piece.nbytes
    if _madvise(start, end - start, MADV_POPULATE_WRITE) == 0:
        return True
    if ctypes.get_errno() == errno.EINVAL:  # a kernel without the advice: never asked again
        _madvise = False
    return False


def _copy_piece(piece: _Piece) -> None:
    """Copy one piece; a hashed chunk block by block, each hashed right after it lands."""
    src, dst, padded_to, digests = piece
    if digests is None:
        _copy(dst, src)
        return
    hasher = ChunkHasher(padded_to)
    for at in range(0, src.nbytes, HASH_BLOCK_BYTES):
        block = dst[at:at + HASH_BLOCK_BYTES]
        _copy(block, src[at:at + HASH_BLOCK_BYTES])
        hasher.update(block.data)
    digests[(int(dst.ctypes.data), dst.nbytes, padded_to)] = hasher.hexdigest()
