"""A hint to the kernel to start writing a file's dirty pages back (Linux ``sync_file_range``)."""

from __future__ import annotations

import functools
import sys
from typing import Any

_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages to disk now, without waiting.

    A commit writes its objects first and fsyncs them all at the end (``publish``). Left
    alone, the kernel writes nothing back until that fsync (a 1 GiB commit stays under
    the dirty-page thresholds), so the disk idles while later chunks are hashed and
    written. ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` starts the disk on each object as
    it is finished; the fsync then waits only for the tail. It is a hint: it gives no
    durability (the fsync still does), and where it is missing (not Linux) or fails,
    nothing changes but the overlap.
    """
    fn = load_sync_file_range()
    if fn:
        fn(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # ctypes drops the GIL; errors ignored


@functools.cache
def load_sync_file_range() -> Any:
    """libc's ``sync_file_range`` through ctypes, or False where there is none. ``ctypes`` is
    imported here, on the first commit, not by every ``import ravex``."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn
