"""Run real training subprocesses and talk to them through pipes (never sleeps).

A child prints ``LOSS``/``EPOCH``/``BLOCKED``/``IN-WRITE`` lines; :func:`run` reads them as
they come and SIGKILLs the child the moment it reports the point a test asked for.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
TRAINEE = Path(__file__).with_name("trainee.py")
PYTHON = sys.executable
WATCHDOG_S = 240  # a safety net against a hung child, not a synchronisation


@dataclass
class Result:
    returncode: int
    stdout: list[str] = field(default_factory=list)
    stderr: str = ""
    timed_out: bool = False

    def explain(self) -> str:
        """What to print when an assertion on this run fails."""
        head = f"returncode {self.returncode}{' (WATCHDOG KILLED A HUNG CHILD)' if self.timed_out else ''}"
        return f"{head}\n--- stdout tail\n" + "\n".join(self.stdout[-8:]) + f"\n--- stderr\n{self.stderr[-3000:]}"

    @property
    def losses(self) -> list[str]:
        return [line.split()[1] for line in self.stdout if line.startswith("LOSS ")]

    @property
    def witness(self) -> str | None:
        """The resume witness's line for the job (``ravex: resume verified: ...``), if printed."""
        said = re.compile(r"ravex: resume (verified|diverged|not verified)")
        lines = [line for line in self.stderr.splitlines() if said.match(line)]
        assert len(lines) <= 1, f"the witness spoke {len(lines)} times:\n" + "\n".join(lines)
        return lines[0] if lines else None

    def assert_verified(self, where: str = "") -> None:
        """The rerun checked itself against the run that wrote its step, and matched."""
        line = self.witness
        assert line is not None and line.startswith("ravex: resume verified:"), f"{where}\n{self.explain()}"

    @property
    def resumed_from(self) -> int | None:
        m = re.search(r"resumed from step (\d+)", self.stderr)
        return int(m.group(1)) if m else None


def kill_points() -> random.Random:
    """The random source of a test's kill points: seeded anew each run, the seed printed so
    that a failure repeats with ``RAVEX_TEST_SEED``."""
    seed = int(os.environ.get("RAVEX_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"kill-point seed {seed} (rerun with RAVEX_TEST_SEED={seed})")
    return random.Random(seed)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAVEX_", "T_"))}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    kill_on: str | None = None,
    send_signal_on: tuple[str, int] | None = None,
    tree: bool = False,
) -> Result:
    """Run ``argv``; SIGKILL it when a stdout line matches the regex ``kill_on``.

    ``send_signal_on=(prefix, signum)`` sends ``signum`` instead and lets the child exit.
    ``tree``: the child runs in a session of its own, and the kill (and the end of the run) is
    SIGKILL to all of it at once: a child that starts processes of its own (Lightning's DDP
    launcher starts the other ranks) leaves none behind, and none finishes a write.
    """
    stderr_path = cwd / f"stderr-{os.getpid()}-{threading.get_ident()}.txt"

    def kill(proc: subprocess.Popen[str]) -> None:
        if not tree:
            proc.kill()
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=tree)
        fired = threading.Event()
        watchdog = threading.Timer(WATCHDOG_S, lambda: (fired.set(), kill(proc)))
        watchdog.start()
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                lines.append(line)
                if kill_on and re.match(kill_on, line):
                    kill(proc)
                    break
                if send_signal_on and line.startswith(send_signal_on[0]):
                    proc.send_signal(send_signal_on[1])
                    assert proc.stdin is not None
                    proc.stdin.close()  # unblock the child's stdin read after the signal
                    send_signal_on = None
            proc.stdout.close()
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()
            code = proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                kill(proc)
                proc.wait()
            elif tree:
                kill(proc)  # what it started, should any outlive it
    return Result(code, lines, stderr_path.read_text(), fired.is_set())


@contextlib.contextmanager
def hold(argv: list[str], cwd: Path, env: dict[str, str], until: str) -> Iterator[subprocess.Popen]:
    """Start ``argv`` and yield it, alive, once a stdout line matches the regex ``until`` (a
    child blocked there, e.g. ``BLOCKED``); SIGKILLed when the block ends, if still running."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    watchdog = threading.Timer(WATCHDOG_S, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if re.match(until, raw):
                break
        else:
            raise AssertionError(f"{argv} exited with {proc.wait()} before printing {until!r}")
        yield proc
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def assert_same_state(a: object, b: object, where: str = "state") -> None:
    """Bitwise equality of two nested state dicts (tensors: dtype, shape and bytes)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8) if b.dim() else b), where
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {set(a) ^ set(b)}"
        for k in a:
            assert_same_state(a[k], b[k], f"{where}/{k}")
        return
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}/{i}")
        return
    assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"
