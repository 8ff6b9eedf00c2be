"""The background write's threads yield the cores to training.

A checkpoint's write (hashing, encoding, copying into the page cache) runs while training
keeps every core busy. At the same priority the scheduler shares the cores evenly, so each
checkpoint slows the next iterations by about the write's CPU time (issue 17: iterations of
0.5 s ran 2-3 s after each checkpoint). At the lowest priority the write runs in the gaps the
training threads leave (data loading, synchronisation, Python between kernels) and training
loses little; the write then takes longer, which the next checkpoint waits for only when it
comes before the write is done.

Priority is a per-thread attribute on Linux, and a thread starts with its creator's: lowering
the writer thread's priority first thing lowers that of every thread it starts afterwards
(the format writer's pool, the fsync threads). Elsewhere it is left alone.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

logger = logging.getLogger("ravex")

#: ``"idle"``: SCHED_IDLE (runs only when a core has nothing else to run); ``"nice"``: nice
#: 19; ``None``: the creator's priority (the A/B of benchmarks/goodput.py sets these).
BACKGROUND: str | None = None


def lower_this_thread() -> str | None:
    """Put the calling thread at :data:`BACKGROUND` priority; the policy applied, or None
    where it is off or unsupported (not Linux, or refused: it changes nothing else)."""
    policy = BACKGROUND
    if policy is None or not sys.platform.startswith("linux"):
        return None
    tid = threading.get_native_id()
    try:
        if policy == "idle":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.setpriority(os.PRIO_PROCESS, tid, 19)
    except (OSError, AttributeError) as exc:
        logger.debug("ravex: background priority %r not applied: %s", policy, exc)
        return None
    return policy
