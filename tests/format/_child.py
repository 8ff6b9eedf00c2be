"""Child processes of the format tests (real processes, one store). Not a test module.

    _child.py writer STORE [--max-steps N] [--trace] [--size S] [--compression C] [--stop-on-eof]
                           [--block rename:N | --block manifest:N]
        commits writer_state(step) for step = latest + 1, latest + 2, ... printing
        "committing N" / "committed N"; with --trace also "write KEY" / "wrote KEY"
        around every storage write. Stops after N steps, or with --stop-on-eof when
        its stdin closes (checked between commits). --block prints "blocked KEY" and
        blocks forever before the N-th rename of a written file (of a manifest), so
        that the parent's SIGKILL lands exactly there.
    _child.py rank STORE RANK WORLD RUN
        prints "ready", waits for "go" on stdin, commits rank_state(RANK) as its rank of
        step 1, prints "done".
    _child.py shard STORE RANK WORLD RUN
        like rank, with an ArrayShard of shard_global() as tensor "w".
    _child.py zygote
        imports everything once, prints "zygote ready", then serves stdin commands:
        "fork ARGS..." forks a writer process (as ``writer ARGS...``; its lines go to this
        stdout) and prints "forked PID" ("fork gc STORE KEEP" forks a traced GC instead);
        "reap PID" waits for it and prints "reaped PID STATUS".
        Saves the interpreter start-up (seconds on a loaded machine) per crash trial.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from fmt_helpers import writer_state

from ravex.format import ArrayShard, open_store

_out = threading.Lock()


def emit(line: str) -> None:
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


# ---- states of the lock-free multi-rank tests (the parent imports these to check) ---------

SHARD_ROWS = (0, 10, 20, 30, 37)  # rank r holds rows [SHARD_ROWS[r], SHARD_ROWS[r + 1])
SHARD_CHUNK_ROWS = 5


def rank_state(rank: int) -> dict:
    """Replicated tensors (same bytes on every rank) and rank-specific ones (own names)."""
    rep = np.random.default_rng(0)
    own = np.random.default_rng(100 + rank)
    return {
        "model": {
            "embed.weight": rep.standard_normal((128, 1024)).astype(np.float32),  # 2 chunks of 256 KiB
            "head.weight": rep.standard_normal((64, 1024)).astype(np.float32),
        },
        "local": {f"rank{rank}": {"buffer": own.standard_normal((96, 1024)).astype(np.float32)}},
        "rank": rank,
        "lr": 0.01,
    }


def shard_global() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((SHARD_ROWS[-1], 512)).astype(np.float32)


def shard_state(rank: int) -> dict:
    g = shard_global()
    lo, hi = SHARD_ROWS[rank], SHARD_ROWS[rank + 1]
    return {"w": ArrayShard(g[lo:hi], g.shape, lo, SHARD_CHUNK_ROWS), "rank": rank}


# ---- modes ---------------------------------------------------------------------------------


def run_writer(argv: list[str]) -> None:
    url = argv[0]
    max_steps = int(argv[argv.index("--max-steps") + 1]) if "--max-steps" in argv else None
    size = int(argv[argv.index("--size") + 1]) if "--size" in argv else 1
    compression = argv[argv.index("--compression") + 1] if "--compression" in argv else "none"
    store = open_store(url)
    if "--trace" in argv:
        storage = store.storage
        orig, orig_pending, orig_publish = storage.write, storage.write_pending, storage.publish

        def write(key: str, data: object) -> None:
            emit(f"write {key}")
            orig(key, data)
            emit(f"wrote {key}")

        def write_pending(key: str, data: object) -> object:
            emit(f"write {key}")
            handle = orig_pending(key, data)
            emit(f"wrote {key}")  # (a temp file: fsync'd and renamed into place at publish)
            return handle

        def publish(pending: list) -> None:
            emit(f"publish {len(pending)}")
            orig_publish(pending)
            emit(f"published {len(pending)}")

        # the child's own progress report, through the storage seam
        storage.write, storage.write_pending, storage.publish = write, write_pending, publish

    if "--block" in argv:  # block (until killed) before the N-th rename of a finished file
        rule, _, n = argv[argv.index("--block") + 1].partition(":")
        renames = {"rename": 0, "manifest": 0}
        real_replace = os.replace

        def replace(src: str, dst: str) -> None:
            with _out:
                renames["rename"] += 1
                manifest = os.path.basename(dst).startswith("rank-")
                renames["manifest"] += manifest
                hit = renames[rule] == int(n) and (rule == "rename" or manifest)
            if hit:
                emit(f"blocked {os.path.relpath(dst, store.url)}")
                threading.Event().wait()  # never set: the parent kills this process now
            real_replace(src, dst)

        os.replace = replace  # the child's own instrument: the only rename LocalStorage makes

    stop = threading.Event()
    if "--stop-on-eof" in argv:

        def watch() -> None:
            sys.stdin.read()
            stop.set()

        threading.Thread(target=watch, daemon=True).start()
    step = (store.latest_step() or 0) + 1
    done = 0
    with store.writer(chunk_bytes=256 << 10, threads=2, compression=compression) as w:
        emit(f"start {step}")
        while not stop.is_set() and (max_steps is None or done < max_steps):
            state = writer_state(step, size)
            emit(f"committing {step}")
            w.commit(step, state)
            emit(f"committed {step}")
            step += 1
            done += 1
    emit("exit")


def run_gc(argv: list[str]) -> None:
    """GC with keep_last=argv[1] and no grace, printing "delete KEY" before each deletion."""
    store = open_store(argv[0])
    storage = store.storage
    for method in ("delete", "delete_if_older"):
        orig = getattr(storage, method, None)
        if orig is None:
            continue

        def traced(keys: object, *args: object, _orig: object = orig) -> object:
            listed = [keys] if isinstance(keys, str) else list(keys)  # type: ignore[call-overload]
            for key in listed:
                emit(f"delete {key}")
            return _orig(keys if isinstance(keys, str) else listed, *args)  # type: ignore[operator]

        setattr(storage, method, traced)
    report = store.gc(keep_last=int(argv[1]), grace_seconds=0)
    emit(f"gc done {len(report.deleted_steps)} {report.deleted_objects}")


def run_rank(argv: list[str], make: object) -> None:
    url, rank, world, run = argv[0], int(argv[1]), int(argv[2]), argv[3]
    store = open_store(url)
    state = make(rank)  # type: ignore[operator]
    with store.writer(rank=rank, world_size=world, run=run, chunk_bytes=256 << 10, threads=2) as w:
        emit("ready")
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("expected 'go'")
        stats = w.commit(1, state)
    emit(f"done {stats.new_bytes}")


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the zygote) exits, so that a writer
    blocked by --block never outlives a test that failed before killing it."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_zygote() -> None:
    emit("zygote ready")
    live: set[int] = set()
    try:
        _serve(live)
    finally:
        for pid in live:  # never leave a forked writer behind
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass


def _serve(live: set[int]) -> None:
    parent = os.getpid()
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "fork":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:  # the writer: a process of its own, killed by the test
                code = 1
                try:
                    _die_with_parent()
                    if os.getppid() != parent:
                        os._exit(1)
                    if args[0] == "gc":
                        run_gc(args[1:])
                    else:
                        run_writer(args)
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


def main() -> None:
    mode, argv = sys.argv[1], sys.argv[2:]
    if mode == "writer":
        run_writer(argv)
    elif mode == "rank":
        run_rank(argv, rank_state)
    elif mode == "shard":
        run_rank(argv, shard_state)
    elif mode == "zygote":
        run_zygote()
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
