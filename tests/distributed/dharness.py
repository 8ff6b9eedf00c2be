"""Launch ``torchrun`` jobs and watch their output (never sleeps to synchronise).

The job runs in its own session; :func:`run` reads its stdout line by line and SIGKILLs
the whole process group (torchrun and every rank) the moment a condition on the lines
seen so far holds, e.g. "every rank printed BLOCKED". :func:`run_nodes` starts one torchrun
agent per "node" on this host (a c10d rendezvous on a free loopback port) and can SIGKILL
one node's family alone, then waits (bounded) for the other nodes to fail on their own.
"""

from __future__ import annotations

import itertools
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
TRAINEE = Path(__file__).with_name("trainee.py")
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
WATCHDOG_S = 240  # a safety net against a hung job, not a synchronisation
_LAUNCHES = itertools.count()


@dataclass
class Result:
    returncode: int
    stdout: list[str] = field(default_factory=list)
    stderr: str = ""
    killed: bool = False
    hung: bool = False  # still running long after another node was killed (killed then)

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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a rendezvous endpoint; each launch takes its own)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _argv(nproc: int, script: Path, nnodes: int, node: int, port: int) -> list[str]:
    """torchrun's command line: ``--standalone`` for one node; for several, one agent per node
    meeting at a c10d rendezvous on 127.0.0.1 (node 0's agent hosts its store, as the host
    named by ``--rdzv-endpoint`` does on a real cluster)."""
    if nnodes == 1:
        return [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", str(script)]
    return [TORCHRUN, f"--nnodes={nnodes}", f"--node-rank={node}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-conf=is_host={1 if node == 0 else 0}", str(script)]


def _read(node: int, stream: IO[str], out: queue.Queue[tuple[int, str | None]]) -> None:
    for raw in stream:
        out.put((node, raw.rstrip("\n")))
    out.put((node, None))


def run_nodes(nproc: int, cwd: Path, environ: dict[str, str], nnodes: int = 2,
              kill_node_when: Callable[[list[list[str]]], int | None] | None = None,
              script: Path = TRAINEE, on_line: Callable[[list[str], int], None] | None = None,
              kill_job_when: Callable[[list[str]], bool] | None = None,
              exit_timeout: float = 90.0, node_env: list[dict[str, str]] | None = None) -> list[Result]:
    """One job of ``nnodes`` torchrun agents (``nproc`` ranks each), one :class:`Result` per agent.

    ``kill_node_when(lines per agent)`` names an agent whose family (agent and ranks) is
    SIGKILLed then; the others are left to fail on their own, as a cluster's other nodes do,
    and are waited for: one still running ``exit_timeout`` s after the kill (or after another
    agent ended on its own) is killed too and its result says ``hung``. ``kill_job_when(lines
    of an agent)`` SIGKILLs every agent at once; ``on_line(lines of an agent, its pid)`` runs
    after each line (e.g. to send a signal). ``node_env[n]``: what agent ``n``'s environment adds
    to ``environ`` (each node's own ``RAVEX_LOCAL``, as each machine has its own disk).
    """
    port = free_port() if nnodes > 1 else 0
    tag = f"{os.getpid()}-{threading.get_ident()}-{next(_LAUNCHES)}"  # each launch its own files
    err_paths = [cwd / (f"stderr-{tag}.txt" if nnodes == 1 else f"stderr-{tag}-node{n}.txt")
                 for n in range(nnodes)]
    lines: list[list[str]] = [[] for _ in range(nnodes)]
    killed = [False] * nnodes
    hung = [False] * nnodes
    procs: list[subprocess.Popen[str]] = []
    readers: queue.Queue[tuple[int, str | None]] = queue.Queue()

    def kill(node: int) -> None:
        kill_job(procs[node].pid)
        killed[node] = True

    watchdog = threading.Timer(WATCHDOG_S, lambda: [kill_job(p.pid) for p in procs])
    try:
        for node in range(nnodes):
            with open(err_paths[node], "w") as err:
                own = environ if node_env is None else {**environ, **node_env[node]}
                proc = subprocess.Popen(_argv(nproc, script, nnodes, node, port), cwd=cwd, env=own,
                                        stdout=subprocess.PIPE, stderr=err, text=True,
                                        start_new_session=True)
            procs.append(proc)
            assert proc.stdout is not None
            threading.Thread(target=_read, args=(node, proc.stdout, readers), daemon=True).start()
        watchdog.start()
        open_nodes, deadline, overdue = set(range(nnodes)), None, False
        while open_nodes:
            try:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                node, line = readers.get(timeout=wait)
            except queue.Empty:  # a survivor outlived exit_timeout after the kill
                if overdue:  # its output stays open even after its family was killed: give up on it
                    break
                for n in open_nodes - {n for n in range(nnodes) if killed[n]}:
                    hung[n] = True
                    kill(n)
                overdue, deadline = True, time.monotonic() + 30.0
                continue
            if line is None:
                open_nodes.discard(node)
                if deadline is None and nnodes > 1:  # a node ended: the others follow, or are hung
                    deadline = time.monotonic() + exit_timeout
                continue
            lines[node].append(line)
            if on_line is not None:
                on_line(lines[node], procs[node].pid)
            if kill_job_when is not None and not any(killed) and kill_job_when(lines[node]):
                for n in range(nnodes):
                    kill(n)
            if kill_node_when is not None and not any(killed):
                victim = kill_node_when(lines)
                if victim is not None:
                    kill(victim)
                    deadline = time.monotonic() + exit_timeout
        codes = [proc.wait() for proc in procs]
    finally:
        watchdog.cancel()
        for proc in procs:
            if proc.poll() is None:
                kill_job(proc.pid)  # no rank outlives its test
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    return [Result(codes[n], lines[n], err_paths[n].read_text(), killed[n], hung[n]) for n in range(nnodes)]


def run(nproc: int, cwd: Path, environ: dict[str, str],
        kill_when: Callable[[list[str]], bool] | None = None, script: Path = TRAINEE,
        on_line: Callable[[list[str], int], None] | None = None) -> Result:
    """One ``torchrun --standalone`` job; ``kill_when(lines)`` SIGKILLs all of it, ``on_line(lines,
    launcher_pid)`` runs after each line (e.g. to send a signal)."""
    return run_nodes(nproc, cwd, environ, nnodes=1, script=script, on_line=on_line,
                     kill_job_when=kill_when)[0]


def joined(results: list[Result]) -> Result:
    """The agents of one job as one :class:`Result` (every rank's lines; the worst exit)."""
    return Result(next((r.returncode for r in results if r.returncode), 0),
                  [ln for r in results for ln in r.stdout], "".join(r.stderr for r in results),
                  any(r.killed for r in results), any(r.hung for r in results))


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
