"""Child process of test_pack_liveness (not a test module): a zygote that forks, per trial,
a process committing steps while GC runs in a thread beside it, every storage write and
delete traced so that the parent can SIGKILL it at a chosen one.

    _liveness_child.py          prints "zygote ready", then serves stdin:
        "fork STORE COUNT"      forks a process that commits the next COUNT steps of
                                liveness_state while a thread runs GC (keep_last 2) in a loop;
                                it prints "op KEY" before each storage write or delete and
                                "committed STEP" after each commit; "forked PID" from the zygote
        "reap PID"              waits for it: "reaped PID STATUS"
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np

from ravex.format import open_store

_out = threading.Lock()
#: GC's grace in the trials: longer than any commit (assumption A2), so GC racing the writer
#: deletes only what the parent aged on purpose between trials
GRACE_SECONDS = 600.0


def emit(line: str) -> None:
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def liveness_state(step: int) -> dict:
    """A small model's checkpoint at ``step``: weights and optimizer moments that change every
    step, and, in the same pack, a frozen bias and a data loader's RNG state that never do."""
    rng = np.random.default_rng(step)
    return {
        "model": {
            "fc1.weight": rng.standard_normal((64, 32), dtype=np.float32),
            "fc2.weight": rng.standard_normal((64, 64), dtype=np.float32),
            "fc2.bias": np.linspace(-1, 1, 256, dtype=np.float32),  # frozen, 1 KiB: packed
            "fc3.bias": rng.standard_normal(8, dtype=np.float32),  # inline
        },
        "optim": {
            "exp_avg": rng.standard_normal((64, 64), dtype=np.float32),
            "exp_avg_sq": rng.standard_normal((64, 64), dtype=np.float32),
            "step": step,
        },
        "rng": {
            "torch": rng.integers(0, 255, 5056, dtype=np.uint8),  # the global generator: changes
            "loader": np.random.default_rng(7).integers(0, 255, 5056, dtype=np.uint8),  # fixed
        },
    }


def _traced(store: object) -> None:
    storage = store.storage  # type: ignore[attr-defined]
    for method in ("write", "write_pending", "publish", "delete", "delete_if_older"):
        orig = getattr(storage, method)

        def traced(*args: object, _orig: object = orig, _method: str = method) -> object:
            emit(f"op {_method}")
            return _orig(*args)  # type: ignore[operator]

        setattr(storage, method, traced)


def run_trial(url: str, count: int) -> None:
    store = open_store(url)
    _traced(store)
    done = threading.Event()

    def collect() -> None:
        while not done.is_set():
            store.gc(keep_last=2, grace_seconds=GRACE_SECONDS)

    gc_thread = threading.Thread(target=collect, daemon=True)
    gc_thread.start()
    latest = store.latest_step() or 0
    with store.writer(threads=2, grace_seconds=GRACE_SECONDS) as w:
        for step in range(latest + 1, latest + 1 + count):
            w.commit(step, liveness_state(step))
            emit(f"committed {step}")
    done.set()
    gc_thread.join()
    emit("trial done")


def main() -> None:
    emit("zygote ready")
    parent = os.getpid()
    live: set[int] = set()
    try:
        for line in sys.stdin:
            cmd, *args = line.split()
            if cmd == "fork":
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # dies with the zygote
                        if os.getppid() == parent:
                            run_trial(args[0], int(args[1]))
                            code = 0
                    except BaseException:
                        traceback.print_exc()
                    finally:
                        sys.stdout.flush()
                        os._exit(code)
                live.add(pid)
                emit(f"forked {pid}")
            elif cmd == "reap":
                pid = int(args[0])
                _, status = os.waitpid(pid, 0)
                live.discard(pid)
                emit(f"reaped {pid} {status}")
            elif cmd == "quit":
                break
    finally:
        for pid in live:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
