"""How many threads a commit writes with: the cores this process may use, and the storage.

A local disk and object storage want different numbers. Object storage waits on the network
per request, so parallel requests are what fill the bandwidth. A local disk is fed by the
guest's kernel and, on a VM, the host's block emulation, which take CPU from the cores that
train: measured on a 2-core VM whose two cores run the training loop (benchmark (h), the
user's loop, 1.125 GiB a checkpoint, 3 rounds each), 4 writing threads cost the loop 0.32 s
a checkpoint (medians; 0.40 s in an earlier run) against 0.21 s (0.26 s) for one, the
checkpoint written in 0.66 s against 0.70 s.
"""

from __future__ import annotations

import os

#: Threads of a commit to object storage (and the most a local disk gets).
DEFAULT_THREADS = 4
#: Threads of a commit to a local disk where set (benchmarks set it); None: by the cores.
LOCAL_THREADS: int | None = None


def usable_cores() -> int:
    """The cores this process may run on (a CPU-limited container: its share), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def writer_threads(local_disk: bool) -> int:
    """A commit's threads: :data:`DEFAULT_THREADS` for object storage; for a local disk one per
    two usable cores, at least one and at most :data:`DEFAULT_THREADS`."""
    if not local_disk:
        return DEFAULT_THREADS
    if LOCAL_THREADS:
        return LOCAL_THREADS
    return max(1, min(DEFAULT_THREADS, usable_cores() // 2))
