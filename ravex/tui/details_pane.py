"""The details pane: the chosen step, or the chosen tensor's metadata, chunk map, statistics and
histogram (or a value against the previous step's), each read in a worker of the pane's own.

The pane keeps the question it was last asked (step, leaf, timeline listed; or a step, whose
details take the record of the run that wrote it once read): an answer to an older one is
dropped, and anything the app shows here directly (a message) drops the question, so a late
answer never covers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static
from textual.worker import get_current_worker

from ravex.format import CheckpointStore, StepReader
from ravex.format.history.runs import RunRecord, read_run
from ravex.format.reports.diff import step_values
from ravex.format.reports.summary import StepSummary

from .formatting import one_line
from .model import Leaf, compute_details, render_details, render_value

Question = tuple[int, Leaf, str | None]


class DetailsPane(VerticalScroll):
    """Metadata, chunk map, statistics and histogram of the selected tensor (or the step)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._asked: Question | None = None
        self._step: int | None = None  # the step shown, until a tensor is asked for: its run record is wanted
        self._runs: dict[str, RunRecord] = {}  # run records read so far, by run id

    def compose(self) -> ComposeResult:
        yield Static("", id="details-body")

    def on_mount(self) -> None:
        self.border_title = "details"

    def show(self, text: Text | str) -> None:
        """Show ``text``; an answer still being read for the pane is no longer wanted."""
        self._asked = self._step = None
        self._body(text)

    def show_step(self, s: StepSummary, render: Callable[[RunRecord | None, str | None], Text],
                  store: CheckpointStore) -> None:
        """Step ``s`` as ``render`` draws it, then again with the record of the run that wrote it
        (spec §20) or a note saying why there is none, once read from ``store``."""
        self.show(render(None, None))
        self._step = s.step
        if s.run:
            self.load_run(s, render, store)

    @work(thread=True, exclusive=True, group="run")
    def load_run(self, s: StepSummary, render: Callable[[RunRecord | None, str | None], Text],
                 store: CheckpointStore) -> None:
        assert s.run is not None
        record, note = self._runs.get(s.run), None
        if record is None:
            try:
                record = read_run(store.storage, s.run)
            except Exception as exc:  # a damaged record is a line in the pane, never a traceback
                note = f"run record unreadable: {one_line(exc)}"
            else:
                if record is None:
                    note = "no run record (a store written before 1.1)"
                else:
                    self._runs[s.run] = record
        self.app.call_from_thread(self._show_run, s.step, render, record, note)

    def _show_run(self, step: int, render: Callable[[RunRecord | None, str | None], Text], record: RunRecord | None,
                  note: str | None) -> None:
        if step == self._step:
            self._body(render(record, note))

    def ask(self, step: int, leaf: Leaf, listed: str | None, reader: Callable[[int], StepReader],
            previous: int | None) -> None:
        """Read and show ``leaf`` of ``step`` (of the timeline ``listed``), against the complete
        step before it (``previous``), through ``reader``."""
        self._asked, self._step = (step, leaf, listed), None
        if leaf.kind == "value":
            self.show_value(step, leaf, listed, reader, previous)
        else:
            self.load_details(step, leaf, listed, reader, previous)

    @work(thread=True, exclusive=True, group="details")
    def show_value(self, step: int, leaf: Leaf, listed: str | None, reader: Callable[[int], StepReader],
                   previous: int | None) -> None:
        prev_value, has_prev = None, False
        if previous is not None:
            try:
                values = step_values(reader(previous))
                key = leaf.path or leaf.name
                has_prev = key in values
                prev_value = values.get(key)
            except Exception:
                pass
        text = render_value(leaf, step, prev_value, has_prev)
        self.app.call_from_thread(self._answer, (step, leaf, listed), text)

    @work(thread=True, exclusive=True, group="details")
    def load_details(self, step: int, leaf: Leaf, listed: str | None, reader: Callable[[int], StepReader],
                     previous: int | None) -> None:
        assert leaf.path is not None
        asked = (step, leaf, listed)
        try:
            current = reader(step)
            before = reader(previous) if previous is not None else None
            d = compute_details(current, leaf.path, before, stats=False)
            width = max(20, self.size.width - 2)
            self.app.call_from_thread(self._answer, asked, render_details(d, width))
            worker = get_current_worker()
            if worker.is_cancelled:
                return  # the user moved on before the statistics were read

            def progress(done: int, total: int, what: str) -> None:
                if worker.is_cancelled:  # a large tensor streams in blocks: stop between two
                    raise _Cancelled

            d = compute_details(current, leaf.path, before, stats=True, progress=progress)
            self.app.call_from_thread(self._answer, asked, render_details(d, width))
        except _Cancelled:
            return
        except Exception as exc:
            self.app.call_from_thread(self._answer, asked, Text(f"{leaf.name}: {one_line(exc)}", "red"))

    def _answer(self, asked: Question, text: Text) -> None:
        if asked == self._asked:
            self._body(text)

    def _body(self, text: Text | str) -> None:
        self.query_one("#details-body", Static).update(text)


class _Cancelled(Exception):
    """Raised inside a worker whose result nobody wants any more."""
