"""What a run was, gathered once for its run record (:mod:`ravex.format.history.runs`).

The command line, the script and the git commit of its checkout (and whether tracked files
differ from it), the host, the world size, the Python/torch/Ravex versions and the effective
configuration with where each value came from (:class:`~.config.RavexConfig` remembers).
Rank 0 gathers it at its first checkpoint; the backend writes it beside the run's steps.

Secrets are never written. The store is often shared more widely than the credentials that
write to it, so: the storage credentials are recorded only as ``***`` (set) or null; a URL's
``user:password@`` is masked; a command-line value given to an option whose name says it is a
secret (``--api-key X``, ``--password=X``) is masked; and every string of the record is
scrubbed of the value of every credential Ravex knows of (the storage keys) and of every
environment variable whose name says it holds one (``*SECRET*``, ``*TOKEN*``, ``*PASSWORD*``,
``*ACCESS_KEY*``...), wherever it appears. The environment itself is not recorded.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from ravex.format.history.runs import NOT_A_CHECKOUT, GitState, RunRecord, now
from ravex.version import __version__

from ..config import RavexConfig

#: A git call that takes longer is abandoned: the record says "git timed out" instead.
GIT_TIMEOUT_S = 3.0
MASK = "***"
#: Names of options and environment variables that hold credentials.
_SECRET_NAME = re.compile(r"secret|token|passw|credential|access[_-]?key|api[_-]?key|private[_-]?key|auth",
                          re.IGNORECASE)
_OPTION = re.compile(r"(--?[A-Za-z0-9][\w.-]*)(=(.*))?\Z", re.DOTALL)
_USERINFO = re.compile(r"(://)[^/@\s]*@")
#: Shorter environment values are not scrubbed from the record: they would mask common words.
_MIN_SECRET = 6
_CREDENTIAL_KEYS = ("access_key", "secret_key")


def gather(config: RavexConfig, world_size: int, environ: Mapping[str, str] | None = None,
           argv: list[str] | None = None) -> RunRecord:
    """This process's run record, its ``run`` left empty for the backend to fill with the id
    the run's manifests carry."""
    env = os.environ if environ is None else environ
    args = list(sys.argv if argv is None else argv)
    secrets = _known_secrets(config, env)
    cwd = os.getcwd()
    script = _script(args)
    git = git_state(os.path.dirname(script) if script else cwd, script)
    import torch

    return RunRecord(
        run="",
        created_at=now(),
        argv=tuple(_scrub(a, secrets) for a in mask_argv(args)),
        script=_scrub(script, secrets) if script else None,
        cwd=_scrub(cwd, secrets),
        git=git,
        hostname=socket.gethostname(),
        world_size=world_size,
        versions={"python": platform.python_version(), "torch": str(torch.__version__), "ravex": __version__},
        config={key: (_scrub_value(value, secrets), source)
                for key, (value, source) in effective_config(config).items()},
    )


def effective_config(config: RavexConfig) -> dict[str, tuple[Any, str]]:
    """Every configuration key (storage ones as ``storage.<key>``) -> (value, source), the
    storage credentials as ``***`` when set."""
    out: dict[str, tuple[Any, str]] = {}
    for name in config.keys():
        if name != "storage":
            out[name] = (getattr(config, name), config.source_of(name))
            continue
        storage = config.storage
        fallback = config.source_of("storage")
        out["storage.url"] = (mask_url(storage.url), config.sources.get("storage.url", fallback))
        for key in ("endpoint", "region", "path_style", *_CREDENTIAL_KEYS):
            value = getattr(storage, key)
            if key in _CREDENTIAL_KEYS and value is not None:
                value = MASK
            elif isinstance(value, str):
                value = mask_url(value)
            out[f"storage.{key}"] = (value, config.sources.get(f"storage.{key}", "default"))
    return out


def mask_url(url: str) -> str:
    """``s3://key:secret@host/x`` -> ``s3://***@host/x``."""
    return _USERINFO.sub(rf"\g<1>{MASK}@", url)


def mask_argv(argv: list[str]) -> list[str]:
    """The command line with the value of every option whose name says it is a secret masked:
    ``--api-key X`` and ``--api-key=X`` both become ``***`` in place of ``X``."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        m = _OPTION.match(arg)
        if m and _SECRET_NAME.search(m.group(1)):
            if m.group(2) is None:
                mask_next = True
                out.append(arg)
            else:
                out.append(f"{m.group(1)}={MASK}")
            continue
        out.append(mask_url(arg))
    return out


def git_state(directory: str, script: str | None = None) -> GitState:
    """The commit checked out at ``directory`` and whether the tree is dirty: a tracked file
    differs from the commit, or ``script`` itself is not committed. Untracked files elsewhere
    (logs, checkpoints) do not count. Read-only: git takes no lock (``GIT_OPTIONAL_LOCKS=0``)."""
    head = _git(directory, "rev-parse", "HEAD")
    if isinstance(head, GitState):
        return head
    commit = head.strip()
    if not re.fullmatch(r"[0-9a-f]{40,64}", commit):
        return GitState(unavailable=NOT_A_CHECKOUT)
    changes = _git(directory, "status", "--porcelain", "--untracked-files=no")
    if isinstance(changes, GitState):
        return changes
    dirty = bool(changes.strip())
    if not dirty and script:
        untracked = _git(directory, "status", "--porcelain", "--untracked-files=all", "--", script)
        if isinstance(untracked, GitState):
            return untracked
        dirty = bool(untracked.strip())
    return GitState(commit, dirty)


def _git(directory: str, *args: str) -> str | GitState:
    """``git -C directory args`` output, or the :class:`GitState` that says why there is none."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}
    try:
        done = subprocess.run(["git", "-C", directory or ".", *args], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=GIT_TIMEOUT_S, env=env, check=False)
    except FileNotFoundError:
        return GitState(unavailable="git is not installed")
    except subprocess.TimeoutExpired:
        return GitState(unavailable=f"git took over {GIT_TIMEOUT_S:g} s")
    except OSError as exc:
        return GitState(unavailable=f"git failed: {exc}")
    if done.returncode != 0:
        if "not a git repository" in done.stderr:
            return GitState(unavailable=NOT_A_CHECKOUT)
        if "unknown revision" in done.stderr or "ambiguous argument 'HEAD'" in done.stderr:
            return GitState(unavailable="a git checkout with no commit yet")
        return GitState(unavailable=f"git failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return done.stdout


def _script(argv: list[str]) -> str | None:
    """The running script's absolute path; None for ``python -c``, a REPL or stdin."""
    first = argv[0] if argv else ""
    if not first or first in ("-c", "-"):
        return None
    path = os.path.abspath(first)
    return path if os.path.isfile(path) else None


def _known_secrets(config: RavexConfig, env: Mapping[str, str]) -> list[str]:
    values = [v for v in (config.storage.access_key, config.storage.secret_key) if v]
    values += [v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET]
    return sorted(set(values), key=len, reverse=True)  # longest first: one inside another is masked whole


def _scrub(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def _scrub_value(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        return _scrub(value, secrets)
    if isinstance(value, list):
        return [_scrub_value(v, secrets) for v in value]
    return value
