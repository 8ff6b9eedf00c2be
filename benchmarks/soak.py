"""Crash soak: SIGKILL writers and GC at random instants, then validate and resume, many times.

    python benchmarks/soak.py --trials 100 --seed 0 [--dir DIR] [--json out.json]
    python benchmarks/soak.py --s3 --trials 40     # against a moto S3 server it starts

One store lives through all trials. Each trial forks a writer process (it resumes
from the newest complete step, drops the incomplete steps above it, and commits
step after step of a state that is a pure function of the step number) and a GC
process (retention keep-last/keep-every with a short grace, in a loop; forked from
this process, which has imported everything, so no time goes to start-up), waits until
both are running, then SIGKILLs each at its own random instant. Then, in this
process: validate the store, open the latest step and compare it bit for bit with
the state it must hold ("resume"), read every step that became complete since the
last trial, and check that no complete step seen before has vanished unless the
retention policy allowed it.

Reported (JSON and a table): trials, kills, commits, corrupt resumes (must be 0),
lost complete steps (must be 0), corrupt steps, validate errors (must be 0), and
how often a kill left an incomplete step or orphan objects (expected: garbage).
``run_soak`` is what the short CI version (tests/remote/test_soak_short.py) calls.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

KEEP_LAST = 2
KEEP_EVERY = 10
GRACE_SECONDS = 1.0  # commits here take well under this (the GC contract: a commit finishes within the grace)
CHUNK_BYTES = 64 << 10


def soak_state(step: int) -> dict[str, Any]:
    """The state of ``step``: frozen parts (delta reuse across writer restarts), parts that
    change every step, parts that come back to an earlier value (objects rewritten after
    they may have become garbage), many small tensors (packs), plain values."""
    rng = np.random.default_rng(2026)
    frozen = rng.standard_normal((64, 1024)).astype("float32")  # 256 KiB, 4 chunks, never changes
    moving = rng.standard_normal((128, 1024)).astype("float32")  # 512 KiB, 8 chunks
    moving[(step * 7) % 128] += step
    moving[(step * 13) % 128] -= step
    # the same bytes again 12 steps later (~1 s, past GC's grace): by then its objects may be
    # garbage that GC is deleting while the writer stores them anew (GC's delete_if_older race)
    cycle = np.full((32, 1024), float((step // 4) % 3), dtype="float32")
    small = {f"norm.{i}": np.full(900, float(i + (step if i % 5 == 0 else 0)), dtype="float32") for i in range(24)}
    return {
        "model": {"frozen": frozen, "moving": moving, "cycle": cycle, "small": small},
        "optimizer": {"step": step, "lr": 1e-3 / (1 + step), "betas": [0.9, 0.999]},
        "rng": bytes([step % 256]) * 16,
    }


# ---- children ------------------------------------------------------------------------------


def _child_writer(url: str, opts: dict | None, grace: float, ready) -> None:
    from ravex.format import open_store

    store = open_store(url, create=True, storage_options=opts)
    latest = store.latest_step()
    store.discard_incomplete_above(latest)
    step = (latest or 0) + 1
    ready()
    with store.writer(chunk_bytes=CHUNK_BYTES) as w:
        while True:
            w.commit(step, soak_state(step))
            step += 1


def _child_gc(url: str, opts: dict | None, grace: float, ready) -> None:
    from ravex.format import open_store

    store = open_store(url, storage_options=opts)
    ready()
    while True:
        store.gc(keep_last=KEEP_LAST, keep_every=KEEP_EVERY, grace_seconds=grace)
        time.sleep(0.01)


# ---- the parent ----------------------------------------------------------------------------


class _Child:
    """A forked child process (the parent has imported everything already: no start-up cost,
    so kills land in commits and GC passes, not in imports)."""

    def __init__(self, role: str, url: str, opts: dict | None, grace: float) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 0
            try:
                os.close(r)
                fn = _child_writer if role == "writer" else _child_gc
                fn(url, opts, grace, lambda: os.write(w, b"ready\n"))
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self.role, self.pid, self.fd = role, pid, r
        self.status: int | None = None

    def wait_ready(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
            if ready:
                return os.read(self.fd, 64).startswith(b"ready")
        return False

    def kill(self) -> str:
        """SIGKILL; "killed", or how the child had ended on its own."""
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            how = "killed"
        else:
            how = f"exited on its own (status {status})"
        os.close(self.fd)
        return how


def _retained_window(complete: list[int]) -> tuple[int, set[int]]:
    """What retention must keep given the complete steps now: every step >= the
    KEEP_LAST-th newest, and every multiple of KEEP_EVERY."""
    floor = complete[-KEEP_LAST] if len(complete) >= KEEP_LAST else (complete[0] if complete else 0)
    return floor, {s for s in complete if s % KEEP_EVERY == 0}


def run_soak(
    trials: int = 100,
    seed: int = 0,
    workdir: str | None = None,
    max_kill_seconds: float = 1.5,
    full_validate_every: int = 10,
    log=None,
    url: str | None = None,
    storage_options: dict | None = None,
    grace_seconds: float | None = None,
) -> dict[str, Any]:
    """Run the soak; returns the report (see the module doc). ``url``: a store URL to use
    instead of a local folder (``s3://...`` with ``storage_options``)."""
    from ravex.format import open_store
    from ravex.format.reports.validate import validate

    rng = random.Random(seed)
    own_dir = workdir is None
    base = Path(workdir or tempfile.mkdtemp(prefix="ravex-soak-"))
    opts = storage_options
    url = url or str(base / "store")
    grace = GRACE_SECONDS if grace_seconds is None else grace_seconds
    open_store(url, create=True, storage_options=opts)
    report: dict[str, Any] = {
        "trials": trials,
        "seed": seed,
        "store": url,
        "kills": {"writer": 0, "gc": 0},
        "commits": 0,
        "corrupt_resumes": 0,
        "lost_complete_steps": 0,
        "corrupt_steps": 0,
        "validate_errors": 0,
        "steps_retired_by_gc": 0,
        "trials_leaving_incomplete_step": 0,
        "trials_leaving_orphans": 0,
        "children_failed": 0,
        "problems": [],
    }
    seen_complete: set[int] = set()
    verified: set[int] = set()
    started = time.monotonic()

    def problem(text: str) -> None:
        report["problems"].append(text)
        if log:
            log(f"  PROBLEM: {text}")

    try:
        for trial in range(trials):
            writer, collector = _Child("writer", url, opts, grace), _Child("gc", url, opts, grace)
            deadline = time.monotonic() + 60
            ok_w, ok_g = writer.wait_ready(deadline), collector.wait_ready(deadline)
            t0 = time.monotonic()
            kill_at = {"writer": rng.uniform(0.0, max_kill_seconds), "gc": rng.uniform(0.0, max_kill_seconds)}
            for role in sorted(kill_at, key=kill_at.get):
                time.sleep(max(0.0, t0 + kill_at[role] - time.monotonic()))
                how = (writer if role == "writer" else collector).kill()
                if how == "killed":
                    report["kills"][role] += 1
                else:
                    report["children_failed"] += 1
                    problem(f"trial {trial}: {role} {how}")
            if not (ok_w and ok_g):
                problem(f"trial {trial}: a child did not start (writer {ok_w}, gc {ok_g})")

            # ---- after the crash: validate, resume, check every complete step -------------
            full = full_validate_every > 0 and (trial % full_validate_every == full_validate_every - 1)
            v = validate(url, full=full, storage_options=opts)
            errors = [f for f in v.findings if f.severity == "error"]
            if errors:
                report["validate_errors"] += len(errors)
                problem(f"trial {trial}: validate: {[f.message for f in errors][:3]}")
            kinds = v.kinds()
            report["trials_leaving_incomplete_step"] += "incomplete_step" in kinds
            report["trials_leaving_orphans"] += "orphan_object" in kinds

            store = open_store(url, storage_options=opts)
            complete = store.complete_steps()
            latest = complete[-1] if complete else None
            if latest is not None:
                try:
                    got = store.read("latest")
                    if not _same(got, soak_state(latest)):
                        raise ValueError("content differs from the state of that step")
                except Exception as exc:
                    report["corrupt_resumes"] += 1
                    problem(f"trial {trial}: resume of step {latest} failed: {type(exc).__name__}: {exc}")
            for step in complete:
                if step in verified:
                    continue
                try:
                    if not _same(store.read(step), soak_state(step)):
                        raise ValueError("content differs")
                    verified.add(step)
                except Exception as exc:
                    report["corrupt_steps"] += 1
                    problem(f"trial {trial}: step {step} unreadable: {type(exc).__name__}: {exc}")
            floor, _every = _retained_window(complete)
            now = set(complete)
            for step in sorted(seen_complete - now):
                must_keep = step >= floor or step % KEEP_EVERY == 0 or (latest is not None and step > latest)
                if must_keep:
                    report["lost_complete_steps"] += 1
                    problem(f"trial {trial}: complete step {step} vanished (complete now: {complete[-6:]})")
                else:
                    report["steps_retired_by_gc"] += 1
            seen_complete = now  # vanished ones were either allowed to go or are reported above
            older = sorted(verified & now - {latest})
            if older:  # one earlier step again: still exact after this trial's GC and writer?
                step = rng.choice(older)
                try:
                    if not _same(store.read(step), soak_state(step)):
                        raise ValueError("content differs")
                except Exception as exc:
                    report["corrupt_steps"] += 1
                    problem(f"trial {trial}: step {step}, read fine before, now: {type(exc).__name__}: {exc}")
            report["commits"] = max(report["commits"], latest or 0)
            if log:
                log(
                    f"trial {trial + 1:4d}/{trials}: kill writer@{kill_at['writer']:.2f}s gc@{kill_at['gc']:.2f}s "
                    f"latest={latest} complete={len(complete)} findings={sorted(kinds)}"
                )
        # at the end: a full validate, and every complete step once more
        v = validate(url, full=True, storage_options=opts)
        report["final_validate_ok"] = v.ok
        if not v.ok:
            report["validate_errors"] += sum(1 for f in v.findings if f.severity == "error")
        store = open_store(url, storage_options=opts)
        for step in store.complete_steps():
            try:
                if not _same(store.read(step), soak_state(step)):
                    raise ValueError("content differs")
            except Exception as exc:
                report["corrupt_steps"] += 1
                problem(f"final: step {step}: {type(exc).__name__}: {exc}")
        report["final_complete_steps"] = len(store.complete_steps())
    finally:
        report["seconds"] = round(time.monotonic() - started, 1)
        if own_dir:
            shutil.rmtree(base, ignore_errors=True)
    report["ok"] = (
        report["corrupt_resumes"] == 0
        and report["lost_complete_steps"] == 0
        and report["corrupt_steps"] == 0
        and report["validate_errors"] == 0
    )
    return report


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape and (
            got.tobytes() == want.tobytes()
        )
    if isinstance(want, dict):
        return isinstance(got, dict) and list(got) == list(want) and all(_same(got[k], want[k]) for k in want)
    if isinstance(want, (list, tuple)):
        return type(got) is type(want) and len(got) == len(want) and all(map(_same, got, want))
    return type(got) is type(want) and got == want


def table(report: dict[str, Any]) -> str:
    rows = [
        ("trials", report["trials"]),
        ("writer kills (SIGKILL)", report["kills"]["writer"]),
        ("gc kills (SIGKILL)", report["kills"]["gc"]),
        ("steps committed (newest)", report["commits"]),
        ("corrupt resumes (must be 0)", report["corrupt_resumes"]),
        ("lost complete steps (must be 0)", report["lost_complete_steps"]),
        ("corrupt complete steps (must be 0)", report["corrupt_steps"]),
        ("validate errors (must be 0)", report["validate_errors"]),
        ("steps retired by GC (allowed)", report["steps_retired_by_gc"]),
        ("trials leaving an incomplete step", report["trials_leaving_incomplete_step"]),
        ("trials leaving orphan objects", report["trials_leaving_orphans"]),
        ("children that died on their own", report["children_failed"]),
        ("seconds", report["seconds"]),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{'':-<{width + 12}}"] + [f"{k:<{width}}  {v!s:>8}" for k, v in rows] + [f"{'':-<{width + 12}}"]
    lines.append("OK" if report["ok"] else "FAILED: " + "; ".join(report["problems"][:5]))
    return "\n".join(lines)


def start_moto(logdir: str) -> tuple[Any, str]:
    """A moto S3 server process on 127.0.0.1 (a free port), ready; returns (process, endpoint)."""
    import re
    import subprocess

    exe = Path(sys.executable).with_name("moto_server")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
    log = Path(logdir) / "moto_server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", "0"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        m = re.search(rb"Running on http://127\.0\.0\.1:(\d+)", log.read_bytes())
        if m:
            return proc, f"http://127.0.0.1:{int(m.group(1))}"
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"moto_server did not start: {log.read_text(errors='replace')[-500:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="where the store lives (default: a fresh temp folder, removed after)")
    ap.add_argument("--max-kill-seconds", type=float, default=1.5)
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--s3", action="store_true", help="run against a moto S3 server started here (grace 3 s)")
    args = ap.parse_args(argv)
    log = None if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    if args.s3:
        import boto3

        from ravex.format.storage.remote import s3_storage_options

        moto, endpoint = start_moto(tempfile.mkdtemp(prefix="ravex-soak-moto-"))
        try:
            boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="soak", aws_secret_access_key="soak",
                         region_name="us-east-1").create_bucket(Bucket="ravex-soak")
            opts = s3_storage_options(endpoint=endpoint, region="us-east-1", access_key="soak", secret_key="soak",
                                      env={})
            # S3 LastModified has 1 s resolution: an object can look up to 1 s older than it is
            report = run_soak(args.trials, args.seed, args.dir, args.max_kill_seconds, log=log,
                              url=f"s3://ravex-soak/run-{args.seed}", storage_options=opts, grace_seconds=3.0)
        finally:
            moto.terminate()
            moto.wait()
    else:
        report = run_soak(args.trials, args.seed, args.dir, args.max_kill_seconds, log=log)
    text = json.dumps(report, indent=2)
    print(text)
    print(table(report), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
