"""GC repacking while a writer commits, both SIGKILLed at random points of the repack
(spec/FORMAT.md §14, 3b): every complete step reads bit-exact after each kill, and the GC at the
end of the run leaves at most a tenth of the object bytes dead.

Each trial runs this file as a child process (``python test_repack_race.py STORE COUNT``): a
writer without the pack-liveness rule (as a 1.0 writer) commits COUNT steps while a thread runs
GC (keep_last 2, keep_every 4, grace 600 s) in a loop; every storage write and delete prints a
line first, naming the thread and the key, so the parent SIGKILLs the child at a chosen one of
the GC thread's, most of which belong to the repack (new packs, retirement records, manifests
and refs.json replaced). Between trials an hour passes with nothing running.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fmt_helpers import PY, child_env

TRIALS = int(os.environ.get("RAVEX_REPACK_TRIALS", "32"))
#: the child's GC: longer than any commit (A2), so what it deletes is what the parent aged
GRACE_SECONDS = 600.0
TRACED = ("write", "write_pending", "publish", "delete", "delete_if_older")
KEEP_EVERY = 2


def race_state(step: int) -> dict:
    """Weights that change every step and a buffer that changes at every odd step: stored with
    an odd step's weights, reused by the next (even, kept) step, so that once the odd step is
    collected, that pack is named by one kept step for a fifth of its bytes: GC repacks it."""
    import numpy as np

    rng = np.random.default_rng(step)
    return {"m": {"fast": rng.standard_normal(4096, dtype=np.float32),
                  "slow": np.full(1024, (step + 1) // 2, dtype=np.float32)}}


def run_child(url: str, count: int) -> None:
    import ravex.format.writing.writer as writer_module
    from ravex.format import open_store
    from ravex.format.maintenance.gc import gc

    writer_module.PACK_LIVE_FLOOR = writer_module.PACK_LIVE_TARGET = 0.0
    out = threading.Lock()

    def emit(line: str) -> None:
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    store = open_store(url)
    storage = store.storage
    for method in TRACED:
        orig = getattr(storage, method)

        def traced(*args: object, _orig: object = orig, _method: str = method) -> object:
            first = args[0] if args else ""
            key = first if isinstance(first, str) else getattr(first, "key", "") if not isinstance(first, list) else ""
            emit(f"op {threading.current_thread().name} {_method} {key}")
            return _orig(*args)  # type: ignore[operator]

        setattr(storage, method, traced)
    done = threading.Event()

    def collect() -> None:
        while not done.is_set():
            report = gc(store, keep_last=2, keep_every=KEEP_EVERY, grace_seconds=GRACE_SECONDS)
            if report.repack is not None and report.repack.packs:
                emit(f"repacked {report.repack.packs}")

    gc_thread = threading.Thread(target=collect, name="gc", daemon=True)
    latest = store.latest_step() or 0
    store.discard_incomplete_above(latest)
    gc_thread.start()
    with store.writer(threads=2, grace_seconds=GRACE_SECONDS) as w:
        for step in range(latest + 1, latest + 1 + count):
            w.commit(step, race_state(step))
            emit(f"committed {step}")
    done.set()
    gc_thread.join()
    emit("trial done")


def _of_the_repack(line: str) -> bool:
    """Whether a traced call is one of the repack's: GC writing a new pack, a retirement record,
    a replaced manifest or refs.json, or deleting a retired pack or its record."""
    parts = line.split()
    if len(parts) < 4 or parts[:2] != ["op", "gc"]:
        return False
    method, key = parts[2], parts[3]
    return key.startswith("repack/") or (method == "write" and key.startswith(("objects/", "steps/")))


def _an_hour_passes(root: Path) -> None:
    """Every object an hour older, and every retirement an hour earlier: time passing between
    trials with nothing running, so that the next trial's GC has old garbage and old
    retirements to collect while the writer runs."""
    from test_pack_liveness import _age_objects

    _age_objects(str(root), 3600)
    for record in (root / "repack").glob("*.json"):
        doc = json.loads(record.read_text())
        doc["retired_at"] -= 3600
        record.write_text(json.dumps(doc))


@pytest.mark.timeout(300)
def test_gc_repacking_beside_a_writer_sigkilled_at_random_points_loses_nothing(tmp_path):
    from test_pack_liveness import dead_bytes
    from test_repack import assert_every_step_reads

    from ravex.format import open_store
    from ravex.format.maintenance.gc import gc

    root = tmp_path / "s"
    open_store(root, create=True)
    seed = int(os.environ.get("RAVEX_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"kill-point seed {seed} (rerun with RAVEX_TEST_SEED={seed})")
    rng = random.Random(seed)
    env = child_env()
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    kills = repacks = 0
    for trial in range(TRIALS):
        target = rng.randrange(1, 9)  # the repack's storage call at which the kill lands
        proc = subprocess.Popen([PY, __file__, str(root), "6"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env, text=True, bufsize=1)
        assert proc.stdout is not None
        seen, finished = 0, False
        lines: list[str] = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("repacked "):
                    repacks += 1
                elif _of_the_repack(line):
                    seen += 1
                    if seen >= target:
                        os.kill(proc.pid, signal.SIGKILL)
                        break
                elif line.startswith("trial done"):
                    finished = True
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        tail = "".join(lines[-30:])
        assert finished or proc.returncode == -signal.SIGKILL, f"trial {trial}: child exited {proc.returncode}: {tail}"
        kills += not finished
        assert_every_step_reads(root, race_state)  # validate, Ravex and the spec's reader, refs.json
        _an_hour_passes(root)
    print(f"{TRIALS} trials: {kills} killed at a storage call of the repack; {repacks} repacks finished")
    assert kills >= TRIALS // 2, "the kills miss the repack"
    store = open_store(root)
    assert store.latest_step() >= TRIALS
    gc(store, keep_last=2, keep_every=KEEP_EVERY, grace_seconds=0)  # the run over
    dead, total = dead_bytes(open_store(root))
    print(f"after the run's last GC: dead {dead} of {total} object bytes ({dead / total:.1%})")
    assert dead <= 0.10 * total
    assert_every_step_reads(root, race_state)


if __name__ == "__main__":
    run_child(sys.argv[1], int(sys.argv[2]))
