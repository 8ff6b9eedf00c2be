"""Launch ``torchrun`` jobs and watch their output (never sleeps to synchronise).

The job runs in its own session; :func:`run` reads its stdout line by line and SIGKILLs
the whole process group (torchrun and every rank) the moment a condition on the lines
seen so far holds, e.g. "every rank printed BLOCKED".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINEE = Path(__file__).with_name("trainee.py")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
WATCHDOG_S = 240  # a safety net against a hung job, not a synchronisation


@dataclass
class Result:
    returncode: int
    stdout: list[str] = field(default_factory=list)
    stderr: str = ""
    killed: bool = False

    def losses(self, rank: int) -> dict[int, str]:
        """step -> loss (hex) of one rank."""
        out = {}
        for line in self.stdout:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "LOSS" and int(parts[1]) == rank:
                out[int(parts[2])] = parts[3]
        return out

    def restored(self, rank: int) -> int | None:
        for line in self.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "RESTORED" and int(parts[1]) == rank:
                return int(parts[2])
        return None

    def explain(self) -> str:
        return f"rc={self.returncode}\n--- stdout\n" + "\n".join(self.stdout[-30:]) + \
            f"\n--- stderr\n{self.stderr[-6000:]}"


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAVEX_", "T_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC"))}
    out["PYTHONPATH"] = str(ROOT)
    out["PYTHONUNBUFFERED"] = "1"
    out["OMP_NUM_THREADS"] = "1"
    out.update(extra)
    return out


def workdir(path: Path, every: int = 4, **config: object) -> Path:
    lines = {"storage": "./ckpt", "checkpoint_every": every, **config}
    (path / "ravex.yaml").write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return path


def _family(pid: int) -> list[int]:
    """``pid`` and all its descendants (torchrun starts each rank in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kill_job(pid: int) -> None:
    """SIGKILL torchrun and every rank, all at once (no rank gets to finish a write)."""
    for p in _family(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(nproc: int, cwd: Path, environ: dict[str, str],
        kill_when: Callable[[list[str]], bool] | None = None, script: Path = TRAINEE,
        on_line: Callable[[list[str], int], None] | None = None) -> Result:
    """``on_line(lines, launcher_pid)`` runs after each line (e.g. to send a signal)."""
    argv = [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", str(script)]
    err_path = cwd / f"stderr-{os.getpid()}-{threading.get_ident()}.txt"
    killed = False
    with open(err_path, "w") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=err,
                                text=True, start_new_session=True)
        watchdog = threading.Timer(WATCHDOG_S, kill_job, (proc.pid,))
        watchdog.start()
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                lines.append(raw.rstrip("\n"))
                if on_line is not None:
                    on_line(lines, proc.pid)
                if kill_when is not None and kill_when(lines):
                    kill_job(proc.pid)
                    killed = True
                    break
            proc.stdout.close()
            code = proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                kill_job(proc.pid)  # no rank outlives its test
                proc.wait()
    return Result(code, lines, err_path.read_text(), killed)


def all_ranks(word: str, nproc: int) -> Callable[[list[str]], bool]:
    """True once every rank printed ``<word> <rank>``."""
    def check(lines: list[str]) -> bool:
        return {ln.split()[1] for ln in lines if ln.startswith(word + " ")} >= {str(r) for r in range(nproc)}
    return check


def any_line(prefix: str) -> Callable[[list[str]], bool]:
    return lambda lines: bool(lines) and lines[-1].startswith(prefix)


def assert_same_state(a: object, b: object, where: str = "state") -> None:
    """Bitwise equality of two nested state dicts (tensors: dtype, shape and bytes)."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), where
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
