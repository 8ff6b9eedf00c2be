"""Crash safety: a writer process SIGKILLed at random instants, inside and between commits,
leaves a store where every complete step reads back exactly and nothing else is visible."""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess

import pytest
from fmt_helpers import CHILD, PY, assert_same, child_env, writer_state

from ravex.format import StepNotFoundError, open_store
from ravex.format.reports.validate import validate

TRIALS = int(os.environ.get("RAVEX_CRASH_TRIALS", "32"))
SEED = int(os.environ.get("RAVEX_CRASH_SEED", "20261202"))
KINDS = ("committing", "object", "object", "manifest", "committed", "block-rename", "block-manifest")


class Zygote:
    """A child that imported everything once and forks a writer per trial (see _child.py)."""

    def __init__(self) -> None:
        env = child_env()
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [PY, str(CHILD), "zygote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1
        )
        assert self.readline() == "zygote ready"

    def readline(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"zygote exited (rc={self.proc.wait()})")
        return line.rstrip("\n")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send("quit")
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)


@pytest.fixture
def zygote():
    z = Zygote()
    try:
        yield z
    finally:
        if z.proc.poll() is None:
            z.proc.kill()
            z.proc.wait()


def kill_at(z: Zygote, url: str, rng: random.Random, size: int, kind: str) -> dict:
    """Fork a writer; SIGKILL it when its output reaches a randomly chosen line; reap it."""
    commit = rng.randrange(3)
    nth = rng.randrange(4)  # which object write of the commit
    compression = rng.choice(["none", "none", "zstd", "blosc"])  # a resumed run may change it
    block = ""
    if kind == "block-rename":  # killed while blocked just before a file's rename
        block = f" --block rename:{rng.randrange(1, 12)}"
    elif kind == "block-manifest":  # killed with every object durable, the manifest a temp file
        block = f" --block manifest:{commit + 1}"
    z.send(f"fork {url} --trace --max-steps 6 --compression {compression} --size {size}{block}")
    pid = None
    commits = -1
    objects = 0
    trail: list[str] = []
    killed_in = None
    while True:
        line = z.readline()
        if line.startswith("forked "):
            pid = int(line.split()[1])
        elif line.startswith("Traceback") or line.startswith("exit"):
            raise AssertionError(f"writer ended on its own: {line} after {trail[-5:]}")
        else:
            trail.append(line)
            if line.startswith("committing "):
                commits += 1
                objects = 0
            elif line.startswith("wrote objects/"):
                objects += 1
            hit = line.startswith("blocked ") or (commits >= commit and (
                (kind == "committing" and line.startswith("committing "))
                or (kind == "object" and line.startswith("wrote objects/") and objects > nth)
                or (kind == "manifest" and line.startswith("write steps/"))
                or (kind == "committed" and line.startswith("committed "))
                or (not kind.startswith("block") and commits > commit + 1)  # a target this commit did not reach
            ))
            if hit and killed_in is None:
                killed_in = line
        if killed_in is not None and pid is not None:
            os.kill(pid, signal.SIGKILL)
            break
    z.send(f"reap {pid}")
    while not (line := z.readline()).startswith(f"reaped {pid} "):
        trail.append(line)  # what the writer printed before the kill landed
    status = int(line.split()[2])
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    last = [t for t in trail if t.startswith(("committing ", "committed "))]
    mid_commit = bool(last) and last[-1].startswith("committing ")
    return {"target": (kind, commit, nth), "line": killed_in, "mid_commit": mid_commit,
            "blocked_manifest": killed_in.startswith("blocked steps/") and "/rank-" in killed_in}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "trials,size,seed",
    [(TRIALS, 1, SEED), pytest.param(40, 4, SEED + 1, marks=pytest.mark.slow, id="bigger-commits")],
)
def test_sigkill_at_random_instants(tmp_path, zygote, trials, size, seed):
    url = str(tmp_path / "store")
    open_store(url, create=True)
    rng = random.Random(seed)
    verified: set[int] = set()
    outcomes = []
    schedule = [KINDS[i % len(KINDS)] for i in range(trials)]  # every kind, in a seeded order
    rng.shuffle(schedule)
    for kind in schedule:
        outcomes.append(kill_at(zygote, url, rng, size, kind))
        store = open_store(url)
        report = validate(store)
        assert report.ok, [f.message for f in report.findings if f.severity == "error"]
        complete = store.complete_steps()
        assert store.latest_step() == (complete[-1] if complete else None)
        for step in complete:
            if step not in verified:
                assert_same(store.read(step), writer_state(step, size))
                verified.add(step)
        for step in set(store.step_numbers()) - set(complete):
            with pytest.raises(StepNotFoundError):
                store.read(step)
        if outcomes[-1]["blocked_manifest"]:  # all objects durable, the manifest a temp file
            step = int(outcomes[-1]["line"].split("/")[1])
            assert step not in complete and step == (complete[-1] if complete else 0) + 1
            assert "incomplete_step" in report.kinds()
    zygote.close()

    store = open_store(url)
    final = validate(store, full=True)
    assert final.ok, [f.message for f in final.findings if f.severity == "error"]
    print(f"{trials} kills {sorted(collections.Counter(o['target'][0] for o in outcomes).items())}: "
          f"{len(verified)} complete steps verified, "
          f"{sum(o['mid_commit'] for o in outcomes)} kills inside a commit, findings {sorted(final.kinds())}")
    assert len(verified) >= trials // 2  # resumed from the newest complete step and made progress
    for step in store.complete_steps():  # everything, once more, with a cold reader
        assert_same(store.read(step), writer_state(step, size))
    # the kills really landed inside commits and left debris that readers ignored
    assert sum(o["mid_commit"] for o in outcomes) >= trials // 3, outcomes
    kinds = final.kinds()
    assert "orphan_object" in kinds
    assert any(name.startswith(".tmp-") for _, _, files in os.walk(url) for name in files)
    assert sum(o["blocked_manifest"] for o in outcomes) >= 2  # killed with only the manifest missing


def test_sigkill_gc_at_random_instants(tmp_path, zygote):
    """GC killed at any of its deletions (manifests first, then objects) leaves every complete
    step readable and the store valid; the next GC finishes the job."""
    url = str(tmp_path / "store")
    store = open_store(url, create=True)
    rng = random.Random(SEED + 7)
    kills = 0
    step = 0
    with store.writer(chunk_bytes=256 << 10) as w:
        for _trial in range(12):
            for _ in range(3):
                step += 1
                w.commit(step, writer_state(step))
            target = rng.randrange(1, 14)
            zygote.send(f"fork gc {url} {rng.randrange(1, 3)}")
            pid, seen, killed = None, 0, False
            while True:
                line = zygote.readline()
                if line.startswith("forked "):
                    pid = int(line.split()[1])
                elif line.startswith("delete "):
                    seen += 1
                elif line.startswith("gc done") or line.startswith("Traceback"):
                    assert line.startswith("gc done"), line
                    break
                if pid is not None and seen >= target and not killed:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                    break
            zygote.send(f"reap {pid}")
            while not zygote.readline().startswith(f"reaped {pid} "):
                pass
            kills += killed
            check = open_store(url)
            report = validate(check)
            assert report.ok, [f.message for f in report.findings if f.severity == "error"]
            assert check.latest_step() == step  # GC never drops the newest complete step
            for s in check.complete_steps():
                assert_same(check.read(s), writer_state(s))
    assert kills >= 6
    store.gc(keep_last=1, grace_seconds=0)
    final = validate(url, full=True)
    assert final.findings == [], final.findings
    assert_same(open_store(url).read(step), writer_state(step))
