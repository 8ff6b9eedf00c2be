"""What every verb of the ``ravex`` command shares: naming a store and a step, the one way
to fail (:class:`UsageError`), output for humans and for scripts, and how a verb is declared.

Naming: ``STORE`` defaults to ``$RAVEX_STORAGE``, else the ``storage`` of ``./ravex.yaml``, else
``./checkpoints``. A step is ``step_100``, ``100``, ``latest``, ``TIMELINE@100`` for a step of
another timeline (spec/FORMAT.md §19; a bare step is in the current one, the timeline a plain
rerun continues), or ``STORE@step_100`` / ``STORE@TIMELINE@100`` to name another store. Nothing
heavy is imported here: no torch, no Textual, no zarr.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ravex.tui.formatting import one_line

if TYPE_CHECKING:
    from rich.console import Console

    from ravex.format import CheckpointStore, StepReader
    from ravex.format.reports.summary import Progress

#: Exit status: done; a finding (a failed validation); bad usage or an unreadable store.
EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2
_STEP = re.compile(r"^(latest|step_\d+|\d+)$")
_TIMELINE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class UsageError(Exception):
    """Bad usage or an unreadable store: printed as one line naming the fix, exit status 2."""


@dataclass(frozen=True)
class Verb:
    """One subcommand: its name, what it runs, and how it declares its arguments.

    The first paragraph of ``run``'s docstring is the verb's description (``ravex VERB
    --help``), its first sentence the verb's line in ``ravex --help``.
    """

    name: str
    run: Callable[[argparse.Namespace], int]
    add_arguments: Callable[[argparse.ArgumentParser], None]

    @property
    def description(self) -> str:
        return " ".join(inspect.cleandoc(self.run.__doc__ or "").split("\n\n")[0].split())

    @property
    def help(self) -> str:
        text = self.description
        end = text.find(". ")
        return text if end < 0 else text[:end + 1]


# ---- naming a store and a step ------------------------------------------------------------


def default_store(
    cwd: str | None = None, env: dict[str, str] | None = None
) -> tuple[str, dict[str, Any] | None]:
    """The store a verb uses when none is named, and its fsspec ``storage_options``.

    Read by the runtime's own configuration reader (:meth:`ravex.runtime.config.RavexConfig.load`), so
    the CLI and training agree: ``$RAVEX_STORAGE`` overrides the ``storage`` of ``./ravex.yaml``
    (or ``$RAVEX_CONFIG``), ``./checkpoints`` is the default, and a malformed file raises the
    same one-line :class:`~ravex.errors.ConfigError` that ``ravex status`` prints.
    """
    from ravex.runtime.config import RavexConfig

    cwd = cwd or os.getcwd()
    storage = RavexConfig.load(environ=env, cwd=cwd).storage  # None: os.environ
    if storage.is_remote:
        return storage.url, storage.storage_options() or None
    url = os.path.expanduser(storage.url)
    if "://" not in url and not os.path.isabs(url):
        url = os.path.normpath(os.path.join(cwd, url))
    return url, None


def split_step(spec: str) -> tuple[str | None, str]:
    """``STORE@step_100`` -> ``(STORE, "step_100")``; ``step_100`` -> ``(None, "step_100")``;
    ``exp@100`` -> ``(None, "exp@100")`` when no file or folder ``exp`` exists (a name without
    ``/`` or ``://`` is a timeline's; the store checks it); ``STORE@exp@100`` -> ``(STORE, "exp@100")``."""
    if "@" in spec:
        rest, step = spec.rsplit("@", 1)
        if not _STEP.match(step):
            raise UsageError(f"{spec!r}: after '@' comes a step (step_100, 100 or latest)")
        if not rest:
            raise UsageError(f"{spec!r}: before '@' comes a timeline (exp@100) or a store (STORE@100)")
        store, sep, timeline = rest.rpartition("@")
        if sep and store and _TIMELINE.fullmatch(timeline):
            return store, f"{timeline}@{step}"
        if _looks_like_timeline(rest):
            return None, f"{rest}@{step}"
        return rest, step
    if not _STEP.match(spec):
        raise UsageError(f"{spec!r} is not a step; use step_100, 100, latest, TIMELINE@100 or STORE@step_100")
    return None, spec


def _looks_like_timeline(text: str) -> bool:
    """Whether ``text`` before ``@STEP`` names a timeline rather than a store: no path separator,
    no URL scheme, and nothing of that name in the working directory."""
    return "/" not in text and os.sep not in text and "://" not in text and not os.path.exists(text)


def _configured_options(url: str) -> dict[str, Any] | None:
    """The ``storage_options`` of ``./ravex.yaml`` (or ``$RAVEX_*``) where its storage has the same
    scheme as ``url``: ``ravex ls s3://other-bucket/run`` reaches the endpoint, region and keys the
    training was given. None where nothing is configured, the scheme differs or the configuration
    does not load (a store named outright does not need it)."""
    from ravex.errors import ConfigError

    try:
        configured, opts = default_store()
    except (ConfigError, OSError):
        return None
    if opts and configured.split("://", 1)[0] == url.split("://", 1)[0]:
        return opts
    return None


def open_store_for(url: str | None) -> CheckpointStore:
    """Open the named store (or the default one); every failure becomes a one-line UsageError."""
    from ravex.format import RavexError, StoreNotFoundError, open_store

    opts = None
    named = url is not None
    if url is None:
        url, opts = default_store()
    elif "://" not in url:
        url = os.path.abspath(os.path.expanduser(url))
    else:
        opts = _configured_options(url)
    try:
        return open_store(url, storage_options=opts)
    except StoreNotFoundError:
        fix = ("check the path or URL" if named
               else "pass STORE, or set storage in ./ravex.yaml or $RAVEX_STORAGE")
        raise UsageError(f"{url!r} is not a Ravex store (it has no ravex.json); {fix}") from None
    except RavexError as exc:
        raise UsageError(one_line(exc)) from None
    except (OSError, ValueError, ImportError) as exc:
        raise UsageError(f"cannot open store {url!r}: {one_line(exc)}; check the path or URL") from None


def open_step_for(spec: str, store: CheckpointStore | None = None) -> StepReader:
    """A reader for ``step_100`` / ``100`` / ``latest`` / ``exp@100`` / ``STORE@...``; ``store``,
    when given, is the store ``spec`` names (already open), else the one it names is opened. A
    bare step is one of the store's current timeline (the one a plain rerun continues)."""
    from ravex.format import RavexError, StepNotFoundError

    store_url, step = split_step(spec)
    if store is None:
        store = open_store_for(store_url)
    try:
        return (store if "@" in step else store.current()).open_step(step)
    except StepNotFoundError as exc:
        hint = ""
        if store_url is None and "@" in step and f"no timeline {step.split('@')[0]!r}" in str(exc):
            hint = f"; a store is named by its path: ./{spec}"
        raise UsageError(one_line(exc) + hint) from None
    except RavexError as exc:
        raise UsageError(one_line(exc)) from None


def step_ref(reader: StepReader) -> str:
    """How a verb names the step ``reader`` reads: ``80`` on ``main``, ``exp@80`` on another timeline."""
    timeline = reader.store.timeline
    return str(reader.step) if timeline.parent is None else f"{timeline.name}@{reader.step}"


def step_name(reader: StepReader) -> str:
    """How output shows that step: ``step_80``, or ``exp@step_80`` on another timeline than ``main``."""
    timeline = reader.store.timeline
    return f"step_{reader.step}" if timeline.parent is None else f"{timeline.name}@step_{reader.step}"


# ---- output ---------------------------------------------------------------------------------


def console(stderr: bool = False) -> Console:
    """A Rich console on stdout (or stderr), 160 columns wide when not on a terminal."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def print_json(doc: Any) -> None:
    """``doc`` as strict JSON on stdout (``inf``/``nan`` spelled as text)."""
    from ravex.format.reports.diff import jsonable

    sys.stdout.write(json.dumps(jsonable(doc), indent=2, allow_nan=False) + "\n")


@contextlib.contextmanager
def progress_bar(label: str) -> Iterator[Progress]:
    """A ``progress(done, total, what)`` callback drawing a bar on stderr, only on a terminal."""
    if not sys.stderr.isatty():
        yield lambda done, total, what: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[what]}", style="dim"), console=console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task(label, total=None, what="")

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total or None, what=what[-40:])

        yield update


# ---- arguments ------------------------------------------------------------------------------


#: what every ``STORE`` argument says
STORE_HELP = ("store path or URL (default: $RAVEX_STORAGE, ravex.yaml's storage, ./checkpoints); a URL "
              "named takes ravex.yaml's endpoint, region and keys when its scheme is the same")


def store_argument(p: argparse.ArgumentParser) -> None:
    """The optional ``STORE`` of a verb that reads a whole store."""
    p.add_argument("store", nargs="?", metavar="STORE", help=STORE_HELP)


def step_argument(p: argparse.ArgumentParser) -> None:
    """The ``STEP`` of a verb that reads one step."""
    p.add_argument("step", metavar="STEP",
                   help="step_100, 100, latest, TIMELINE@100 (default: the current timeline) or STORE@step_100")


def json_argument(p: argparse.ArgumentParser) -> None:
    """``--json``: print JSON for scripts instead of tables."""
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value
