"""Run records: what a run was, in ``runs/<run>.json`` (spec/FORMAT.md §21, added in 1.1).

Every manifest names the run that wrote it (its ``run`` member). The run's record says what
that run was: the command line, the script's git commit and whether its tree was dirty, the
host, the world size, the Python/torch/Ravex versions and the effective configuration. It is
written once per run, by rank 0, before the run's first manifest, atomically and never
replaced, so no process reads, modifies and writes it back, and a reader that finds a
manifest finds the record of its run (unless the record's write failed, which never fails a
checkpoint: the record is informative).

This module only reads and writes the document and checks its shape; what goes into it is
gathered by the runtime (``ravex/runtime/recording/provenance.py``), which keeps secrets out of it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .._version import check_version
from ..errors import ManifestError
from ..objects.names import check_name
from ..objects.values import decode_value, encode_value
from ..storage import Storage
from . import clock
from .jsondoc import load_document

RUN_FORMAT = "ravex-run"
#: The spec version that defines the run record.
RUN_VERSION = "1.1"
RUNS_DIR = "runs"
#: A run id as a key segment: what ``uuid4().hex`` gives, or a name a user chose.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: ``git`` when the script's tree could not be described by a commit: the reason, in words.
NOT_A_CHECKOUT = "not a git checkout"


def check_run_id(run: object, where: str = "run id") -> str:
    """A run id that can name a key: 1 to 128 of ``A-Z a-z 0-9 . _ -``, starting with a letter or digit."""
    return check_name(run, _RUN_ID, where, "cannot name a run record; a run id is 1 to 128 letters, digits, "
                      "'.', '_' or '-', starting with a letter or digit")


def run_key(run: str) -> str:
    """Storage key of a run's record: ``runs/<run>.json``."""
    return f"{RUNS_DIR}/{check_run_id(run)}.json"


@dataclass(frozen=True)
class GitState:
    """The script's checkout: its commit and whether tracked files differ from it (or the
    script is not committed), or why there is no commit to name (``unavailable``)."""

    commit: str | None = None
    dirty: bool | None = None
    unavailable: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.commit is None:
            return {"unavailable": self.unavailable or NOT_A_CHECKOUT}
        return {"commit": self.commit, "dirty": bool(self.dirty)}

    def describe(self) -> str:
        """``3f2a9c1d0e7b (dirty)``, or the reason there is no commit."""
        if self.commit is None:
            return self.unavailable or NOT_A_CHECKOUT
        return f"{self.commit[:12]} ({'dirty' if self.dirty else 'clean'})"


#: What a resumed run's witness check found (spec §22): the comparison held, a step differed,
#: or there was nothing to compare.
VERDICTS = ("verified", "diverged", "unverified")


@dataclass(frozen=True)
class ResumeCheck:
    """How a resumed run's first steps compared with the witness of the step it resumed from
    (spec §22): ``steps`` compared, the first step that differed (``diverged`` only) and, in
    words, what differed, its likely cause and the fix, or why nothing was compared."""

    from_step: int
    verdict: str
    steps: tuple[int, ...] = ()
    diverged_at: int | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"from_step": self.from_step, "verdict": self.verdict, "steps": list(self.steps),
                "diverged_at": self.diverged_at, "detail": self.detail}

    @classmethod
    def from_json(cls, doc: Any) -> ResumeCheck:
        doc = _mapping(doc, "resume")
        verdict = _text(doc["verdict"], "resume.verdict")
        if verdict not in VERDICTS:
            raise ValueError(f"resume.verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
        at = doc.get("diverged_at")
        return cls(_count(doc["from_step"], "resume.from_step"), verdict,
                   tuple(_count(s, "resume.steps") for s in _list(doc["steps"], "resume.steps")),
                   None if at is None else _count(at, "resume.diverged_at"),
                   _text(doc.get("detail", ""), "resume.detail"))

    def describe(self) -> str:
        """``verified from step 60 (steps 61-63)``, ``DIVERGED at step 62 ...``: one line."""
        compared = _span(self.steps)
        if self.verdict == "verified":
            return f"verified from step {self.from_step} ({compared})"
        if self.verdict == "diverged":
            return f"DIVERGED at step {self.diverged_at} (resumed from step {self.from_step}): {self.detail}"
        return f"not verified (resumed from step {self.from_step}): {self.detail}"


def _span(steps: tuple[int, ...]) -> str:
    if not steps:
        return "no step"
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"steps {steps[0]}-{steps[-1]}"


@dataclass(frozen=True)
class RunRecord:
    """One run's record (spec §21). ``config`` maps each effective configuration key to its
    value (typed JSON, §9, in the document) and where the value came from."""

    run: str
    created_at: str
    argv: tuple[str, ...]
    script: str | None
    cwd: str
    git: GitState
    hostname: str
    world_size: int
    versions: dict[str, str]
    config: dict[str, tuple[Any, str]]
    #: a resumed run's check of its first steps (spec §22, since 1.4), when it was known by the
    #: time the record was written
    resume: ResumeCheck | None = None

    def to_json(self) -> dict[str, Any]:
        resume = {} if self.resume is None else {"resume": self.resume.to_json()}
        return {
            "format": RUN_FORMAT,
            "version": RUN_VERSION,
            "run": self.run,
            "created_at": self.created_at,
            "argv": list(self.argv),
            "script": self.script,
            "cwd": self.cwd,
            "git": self.git.to_json(),
            "hostname": self.hostname,
            "world_size": self.world_size,
            "versions": dict(self.versions),
            "config": {k: {"value": encode_value(v, _no_arrays, (k,)), "source": src}
                       for k, (v, src) in self.config.items()},
            **resume,
        }

    @classmethod
    def from_json(cls, doc: Any, where: str) -> RunRecord:
        """Parse and check a record; a malformed one is a :class:`ManifestError` naming what is wrong."""
        if not isinstance(doc, dict) or doc.get("format") != RUN_FORMAT:
            raise ManifestError(f"{where}: not a Ravex run record (format != {RUN_FORMAT!r})")
        check_version(doc.get("version"), where)
        try:
            git_doc = doc["git"]
            if "commit" in git_doc:
                git = GitState(_text(git_doc["commit"], "git.commit"), _bool(git_doc["dirty"], "git.dirty"))
            else:
                git = GitState(unavailable=_text(git_doc["unavailable"], "git.unavailable"))
            config = {}
            for key, entry in _mapping(doc["config"], "config").items():
                entry = _mapping(entry, f"config.{key}")
                value = decode_value(entry["value"], _no_array_leaf, f"{where} config.{key}")
                config[key] = (value, _text(entry["source"], f"config.{key}.source"))
            world = doc["world_size"]
            if isinstance(world, bool) or not isinstance(world, int) or world < 1:
                raise ValueError(f"world_size {world!r} is not an integer >= 1")
            return cls(
                run=check_run_id(doc["run"], where),
                created_at=_text(doc["created_at"], "created_at"),
                argv=tuple(_text(a, "argv") for a in _list(doc["argv"], "argv")),
                script=None if doc["script"] is None else _text(doc["script"], "script"),
                cwd=_text(doc["cwd"], "cwd"),
                git=git,
                hostname=_text(doc["hostname"], "hostname"),
                world_size=world,
                versions={k: _text(v, f"versions.{k}") for k, v in _mapping(doc["versions"], "versions").items()},
                config=config,
                resume=None if doc.get("resume") is None else ResumeCheck.from_json(doc["resume"]),
            )
        except KeyError as exc:
            raise ManifestError(f"{where}: run record lacks {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"{where}: malformed run record: {exc}") from None


def write_run(storage: Storage, record: RunRecord) -> str:
    """Write ``record`` as ``runs/<run>.json``, whole and once; returns its key.

    A record already there is left as it is (a run's record is never replaced)."""
    key = run_key(record.run)
    if storage.exists(key):
        return key
    storage.write(key, json.dumps(record.to_json(), indent=1).encode("utf-8") + b"\n")
    return key


def read_run(storage: Storage, run: str) -> RunRecord | None:
    """The record of ``run``; None when the store has none (a 1.0 store, or its write failed).

    Raises :class:`ManifestError` for a malformed one and :class:`UnsafeNameError` for a run
    id that cannot name a key."""
    key = run_key(run)
    try:
        data = storage.read(key)
    except FileNotFoundError:
        return None
    where = f"{storage.url}/{key}"
    doc = load_document(data, where, detail=True)
    record = RunRecord.from_json(doc, where)
    if record.run != run:
        raise ManifestError(f"{where}: records run {record.run!r}, not {run!r}")
    return record


def now() -> str:
    """The time a record is stamped with (the format's one clock)."""
    return clock.now_iso()


def _no_arrays(value: Any, path: tuple[Any, ...]) -> str:
    raise TypeError(f"configuration value at {'/'.join(map(str, path))} of type "
                    f"{type(value).__name__} is not a plain value")


def _no_array_leaf(path: str) -> Any:
    raise ManifestError(f"a run record holds no arrays (found {path!r})")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is {type(value).__name__}, not a string")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} is {type(value).__name__}, not true/false")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} is {type(value).__name__}, not a list")
    return value


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} {value!r} is not an integer >= 0")
    return value


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {type(value).__name__}, not an object")
    return value
