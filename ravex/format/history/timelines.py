"""Timelines: branches of a store's history, so that a run resumed from an older step trains on
without touching the steps after it, and both histories stay readable (spec/FORMAT.md §19).

Layout::

    steps/<step>/rank-<r>.json                     the steps of ``main`` (every 1.0 store)
    timelines/<name>.json                          written once, when ``<name>`` forks
    timelines/<name>/steps/<step>/rank-<r>.json    the steps of ``<name>``

A timeline's document names its ``parent`` and the ``fork_step`` it started from; its own steps
are all newer than that step, and the parent's steps up to it are its history (its *lineage*).
A *root* timeline (since 1.5) names neither: a fresh run's own history in a store that holds
another's (``resume: never``); like ``main``, its steps are all it has.
The document is created with an exclusive create (:meth:`Storage.create`): of two runs that fork
the same name, one wins and the other gets :class:`NameTakenError`. Nothing about a timeline is
ever rewritten, so forking needs no lock and per-rank writes stay lock-free.

Which timeline a plain rerun continues (:func:`current_timeline`) is read from storage alone:
the timeline whose newest event, its newest complete step or its creation, is the newest, by
the storage's modification times. No shared file is read-modified-written for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ManifestError, NameTakenError, StepNotFoundError
from ..objects.names import MAIN_STEPS, MAX_LABEL, check_label, is_decimal
from . import clock
from .jsondoc import load_named

if TYPE_CHECKING:
    from ..storage import Storage

#: The timeline every store starts with; its steps are ``steps/`` (what spec 1.0 reads).
MAIN = "main"
TIMELINES = "timelines"
TIMELINE_FORMAT = "ravex-timeline"
#: The spec version of the timeline and tag documents (they first appear in 1.1).
DOC_VERSION = "1.1"
#: The version of a root timeline's document: a 1.1-1.4 reader rejects it (no ``parent``),
#: and with it the store, rather than collect what only that timeline's steps name.
ROOT_DOC_VERSION = "1.5"
#: The name a root timeline takes (then ``fresh-2``, ``fresh-3``...).
ROOT_NAME = "fresh"


@dataclass(frozen=True)
class Timeline:
    """One branch: its name, where it forked (None for ``main`` and a root timeline), and when."""

    name: str
    parent: str | None = None
    fork_step: int | None = None
    created_at: str | None = None
    run: str | None = None

    @property
    def steps_prefix(self) -> str:
        """Where this timeline's steps live."""
        return MAIN_STEPS if self.name == MAIN else f"{TIMELINES}/{self.name}/steps"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "parent": self.parent, "fork_step": self.fork_step,
                "created_at": self.created_at, "run": self.run}


def timeline_key(name: str) -> str:
    return f"{TIMELINES}/{name}.json"


def check_timeline_name(name: object) -> str:
    """A name a new timeline may take: a valid label (:func:`~.names.check_label`), not ``main``."""
    name = check_label(name, "timeline")
    if name == MAIN:
        raise NameTakenError(f"timeline name {MAIN!r} is the store's first timeline; pick another name")
    return name


def parse_timeline(data: bytes, key: str) -> Timeline:
    """A timeline document, checked; a malformed one is a :class:`ManifestError` naming ``key``."""
    doc = load_named(data, key, "timeline", TIMELINE_FORMAT, "parent", "fork_step", both_null=True)
    run = doc.get("run")
    return Timeline(doc["name"], doc["parent"], doc["fork_step"], str(doc.get("created_at") or ""),
                    run if isinstance(run, str) else None)


def read_timelines(storage: Storage) -> dict[str, Timeline]:
    """Every timeline of the store, ``main`` first, then by name. A document that does not parse
    is an error: a timeline whose lineage is unknown cannot be read, nor safely collected."""
    found = {MAIN: Timeline(MAIN)}
    for entry in storage.list_dir(TIMELINES):
        name = entry.removesuffix(".json")
        if entry == name or len(name) > MAX_LABEL or name == MAIN:
            continue  # a timeline's folder of steps, or a name the layout never writes
        try:
            check_label(name, "timeline")
        except ValueError:
            continue
        key = timeline_key(name)
        try:
            data = storage.read(key)
        except FileNotFoundError:
            continue  # deleted between the listing and the read
        found[name] = parse_timeline(data, key)
    return found


def lineage(timelines: dict[str, Timeline], name: str) -> list[Timeline]:
    """``name``'s timeline, its parent, ... up to ``main``. A parent that is missing or a loop
    (only a hand-edited store has one) is a :class:`ManifestError`."""
    if name not in timelines:
        raise StepNotFoundError(f"no timeline {name!r}; timelines: {', '.join(sorted(timelines))}")
    chain = [timelines[name]]
    while chain[-1].parent is not None:
        parent = chain[-1].parent
        if parent not in timelines or any(t.name == parent for t in chain):
            raise ManifestError(f"timeline {chain[-1].name!r} forks from {parent!r}, which is "
                                f"{'missing' if parent not in timelines else 'its own descendant'}")
        chain.append(timelines[parent])
    return chain


def create_timeline(storage: Storage, name: str, parent: str | None, fork_step: int | None,
                    run: str | None = None) -> Timeline:
    """Fork ``name`` from ``parent`` at ``fork_step``, or with both None start a root timeline:
    the document is created once, exclusively. The caller checks that the fork step is a
    complete step of the parent's lineage."""
    check_timeline_name(name)
    if (parent is None) != (fork_step is None):
        raise ValueError("a timeline names both its parent and its fork step, or neither (a root)")
    timeline = Timeline(name, parent, None if fork_step is None else int(fork_step), clock.now_iso(), run)
    version = DOC_VERSION if parent is not None else ROOT_DOC_VERSION
    doc = {"format": TIMELINE_FORMAT, "version": version, **timeline.to_json()}
    if run is None:
        del doc["run"]
    if not storage.create(timeline_key(name), json.dumps(doc, indent=2).encode() + b"\n"):
        raise NameTakenError(
            f"timeline {name!r} already exists in {storage.url!r} (another run forked it); "
            "resume it with a plain rerun, or fork under another name"
        )
    return timeline


def fork_name(existing: dict[str, Timeline] | set[str], parent: str | None, step: int | None) -> str:
    """The name an automatic fork takes: ``<parent>-<step>``, then ``-2``, ``-3``... when taken
    (a second roll-back to the same step); a root timeline's, :data:`ROOT_NAME` and on. Cut to
    fit :data:`MAX_LABEL`."""
    base = (ROOT_NAME if parent is None else f"{parent}-{step}")[:MAX_LABEL - 4]
    name, n = base, 1
    while name in existing or name == MAIN:
        n += 1
        name = f"{base}-{n}"
    return name


def split_ref(text: str) -> tuple[str | None, str]:
    """``"exp@60"`` -> ``("exp", "60")``; ``"60"`` -> ``(None, "60")``. The step part is left as
    text for the catalog to resolve (``latest``, ``step_60``)."""
    timeline, sep, step = str(text).rpartition("@")
    return (timeline, step) if sep else (None, step)


def newest_event(mtimes: list[float], created: float | None) -> float:
    """When a timeline last moved: its newest complete step's time or its creation, whichever is later."""
    return max([*mtimes, created if created is not None else float("-inf")], default=float("-inf"))


def is_step_text(text: str) -> bool:
    """Whether ``text`` names a step number (``60``, ``step_60``) or ``latest``."""
    return text == "latest" or is_decimal(text.removeprefix("step_"))


def in_span(step: int, floor: int | None, ceiling: int | None) -> bool:
    """Whether ``step`` lies in a timeline's share of a history, ``floor < step <= ceiling``
    (None: no bound; ``CheckpointStore.lineage_spans`` gives each timeline's)."""
    return (floor is None or step > floor) and (ceiling is None or step <= ceiling)
