"""``ravex inspect``: browse a checkpoint store — steps, tensors, diffs, validation.

Every read happens in a thread worker; each worker carries the selection it was started for
and its result is dropped when the selection has moved on (the stale-result guard), so the UI
never waits on storage and never shows an answer to an old question.

This module is the app: the layout, the steps and timelines listed, the tensor tree, the diff it
runs, and the keys. Each right-hand pane reads what it shows in workers of its own
(:mod:`.details_pane`, :mod:`.diff_pane`, :mod:`.validate_pane`); the help is a screen
(:mod:`.screens`); the parsed steps are :mod:`.readers`'.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import ContentSwitcher, DataTable, Footer, Header, Static, Tree

from ravex.format import CheckpointStore, RavexError, StepReader, open_store
from ravex.format.history.runs import RunRecord
from ravex.format.history.timelines import MAIN
from ravex.format.reports.diff import TensorDiff, ValueDiff, change_order, compare_tensor, diff
from ravex.format.reports.summary import StepSummary
from ravex.format.reports.validate import Finding

from . import heap
from .details_pane import DetailsPane
from .diff_pane import DiffPane, TableRow
from .formatting import one_line
from .generation import Generation
from .manifests import PiecewiseStore
from .model import Leaf, diff_cells, render_step, render_value_side, step_leaves, value_cells
from .readers import StepReaders
from .screens import HelpScreen
from .timelines import StoreTimelines, history
from .validate_pane import ValidatePane, finding_step, tensor_shown
from .widgets import StepsPane, TensorPane, TensorTree, TreeNodes, tree_nodes

#: Steps summarised between two refreshes of the steps pane while a long listing loads.
STEPS_BATCH = 16
#: Diff rows added to the table per turn of the event loop (the table measures new rows when idle).
TABLE_BATCH = 200
#: Progress reports while a diff measures its changed tensors, at most.
PROGRESS_STEPS = 100


class InspectorApp(App[None]):
    """The inspector over one store URL."""

    CSS_PATH = "app.tcss"
    TITLE = "ravex inspect"
    BINDINGS: ClassVar = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("slash", "filter", "filter"),
        Binding("d", "diff", "diff"),
        Binding("m", "mark", "mark base", show=False),
        Binding("v", "validate", "validate"),
        Binding("i", "details", "details"),
        Binding("escape", "go_back", "back", show=False),
        Binding("r", "reload", "reload", show=False),
        Binding("t", "next_timeline", "timeline", show=False),  # the timelines box says so when there are several
    ]

    mode: reactive[str] = reactive("details")

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.url = url
        self.storage_options = storage_options
        self.root: CheckpointStore | None = None  # the store as opened (its main timeline)
        self.store: CheckpointStore | None = None  # the timeline listed (spec §19): the current one at first
        self.timeline: str | None = None  # the timeline to list (t moves it on before the listing follows)
        self.timelines: StoreTimelines | None = None
        self._owners: dict[int, str] = {}  # each listed step's timeline (a step lent by a parent is the parent's)
        self.summaries: list[StepSummary] = []
        self.step: int | None = None
        self.base_step: int | None = None
        self.leaf: Leaf | None = None
        self.diff_pair: tuple[int, int] | None = None
        self.diff_rows: list[TensorDiff] = []
        self.diff_values: list[ValueDiff] = []
        self.message: str | None = None
        self._readers = StepReaders()
        self._step_lock = threading.Lock()
        self._generation = Generation()  # bumped by every new diff or validation; older workers' results are dropped
        self._pending_tensor: str | None = None
        self._step_complete = False

    # ---- layout -------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="message")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield Static("", id="timelines")
                yield StepsPane(id="steps")
                yield TensorPane(id="tensors")
            with ContentSwitcher(initial="details", id="right"):
                yield DetailsPane(id="details")
                yield DiffPane(id="diff")
                yield ValidatePane(self._generation, id="validate")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.url
        self.show_message("opening…")
        self.query_one("#step-list").focus()
        self.load_steps()

    def on_unmount(self) -> None:
        heap.release()

    def show_message(self, text: str | None) -> None:
        """A message over the whole main area (bad path, empty store); ``None`` hides it."""
        self.message = text
        box = self.query_one("#message", Static)
        box.update(text or "")
        box.display = bool(text)
        self.query_one("#main").display = not text

    @property
    def leaves(self) -> list[Leaf]:
        """The chosen step's leaves, unfiltered (:class:`TensorPane`)."""
        return self.query_one(TensorPane).leaves

    def watch_mode(self, mode: str) -> None:
        self.query_one("#right", ContentSwitcher).current = mode

    @property
    def findings(self) -> list[Finding]:
        """The last validation's findings, errors first (:class:`ValidatePane`)."""
        return self.query_one(ValidatePane).findings

    @property
    def validated(self) -> bool:
        """Whether the last validation has finished."""
        return self.query_one(ValidatePane).validated

    # ---- steps ----------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="steps")
    def load_steps(self) -> None:
        """List the steps of timeline ``self.timeline`` (the current one the first time): its
        history, the steps its lineage lends it, then its own."""
        try:
            if self.root is None:
                self.root = PiecewiseStore(open_store(self.url, storage_options=self.storage_options))
            info = StoreTimelines.read(self.root)
            name = self.timeline if self.timeline in info.timelines else info.current
            view = self.root.on_timeline(name, info.timelines)
            self.call_from_thread(self._show_timeline, info, view)
            got: list[StepSummary] = []
            owners: dict[int, str] = {}
            for owner, summary in history(view):
                got.append(summary)
                owners[summary.step] = owner
                if len(got) % STEPS_BATCH == 0:
                    self.call_from_thread(self._set_steps, list(got), False, dict(owners))
            self.call_from_thread(self._set_steps, got, True, owners)
        except RavexError as exc:
            self.call_from_thread(self.show_message, _store_problem(self.url, exc))
        except Exception as exc:  # any storage failure is a message, never a traceback
            self.call_from_thread(self.show_message, f"Cannot read {self.url!r}: {one_line(exc)}")

    def _show_timeline(self, info: StoreTimelines, view: CheckpointStore) -> None:
        """Make ``view`` the timeline listed; another than before starts from no step chosen."""
        name = view.timeline.name
        moved = self.store is not None and self.store.timeline.name != name
        self.store, self.timeline, self.timelines = view, name, info
        box = self.query_one("#timelines", Static)
        box.update(info.text(name) if info.worth_showing else "")
        box.display = info.worth_showing
        box.border_title = "timelines" if len(info.timelines) > 1 else "tags"
        pane = self.query_one(StepsPane)
        pane.border_title = "steps" if len(info.timelines) == 1 else f"steps of {name}"
        if moved:
            self._generation.next()  # a diff or validation in flight answers a question nobody asks now
            self.step, self.leaf, self.base_step, self.diff_pair = None, None, None, None
            self._owners = {}
            self.query_one(TensorPane).clear()
            pane.set_steps([], final=False)
            self.mode = "details"
            self.query_one(DetailsPane).show(Text(f"timeline {name}: reading its steps…", style="dim"))

    def _set_steps(self, summaries: list[StepSummary], done: bool, owners: dict[int, str]) -> None:
        self.summaries = summaries
        self._owners = owners
        if not summaries:
            if done:
                self.show_message(
                    f"{self.url}\n\nThis store has no steps yet. A training run writes its first checkpoint "
                    "here; press r to look again, q to quit."
                )
            return
        self.show_message(None)
        tagged = {n for n, owner in owners.items() if self.timelines and self.timelines.tags_on(owner, n)}
        self.query_one(StepsPane).set_steps(summaries, final=done, tagged=tagged)
        if done and not any(s.complete for s in summaries):
            self.notify("No step is complete yet: a run may be writing its first checkpoint.", severity="warning")

    def _render_step(self, s: StepSummary, record: RunRecord | None = None, note: str | None = None) -> Text:
        """The details of step ``s``, with the timeline that holds it and its tags."""
        owner = self._owners.get(s.step, self.timeline or "")
        tags = self.timelines.tags_on(owner, s.step) if self.timelines is not None else []
        return render_step(s, record, note, timeline=owner, tags=tags)

    def on_steps_pane_chosen(self, event: StepsPane.Chosen) -> None:
        s = event.summary
        if s.step == self.step and s.complete == self._step_complete:
            return  # the same step again (a reload); a step that completed meanwhile is loaded
        self.step = s.step
        self._step_complete = s.complete
        self.leaf = None
        assert self.store is not None
        self.query_one(DetailsPane).show_step(s, functools.partial(self._render_step, s), self.store)
        tree = self.query_one(TensorTree)
        if not s.complete:
            self.query_one(TensorPane).clear()
            tree.loading = False
            return
        tree.loading = True  # a step of 10,000 tensors takes a moment to parse
        self.load_step(s.step)

    def reader(self, step: int) -> StepReader:
        """A cached reader for a complete step of the timeline listed (any thread)."""
        store = self.store
        assert store is not None
        return self._readers.get(store, step)

    @work(thread=True, exclusive=True, group="step")
    def load_step(self, step: int) -> None:
        try:
            with self._step_lock:  # one step read at a time: arrowing past ten steps reads two, not ten
                if step != self.step:
                    return  # the user moved on while another step was being read
                listed = self._listed()  # before the read: a timeline listed since drops the result
                reader = self.reader(step)
            with heap.parsing():  # ~10^5 small objects more, as acyclic as the manifests
                leaves = step_leaves(reader)
                nodes = tree_nodes(leaves)  # opening a group of 10,000 then scans nothing on the UI thread
        except Exception as exc:
            self.call_from_thread(self._step_failed, step, exc)
            return
        self.call_from_thread(self._set_leaves, step, leaves, nodes, listed)

    def _step_failed(self, step: int, exc: Exception) -> None:
        if step == self.step:
            self.query_one(TensorTree).loading = False
            self.notify(f"step_{step}: {one_line(exc)}", severity="error")

    def _listed(self) -> str | None:
        """The timeline listed now; a worker notes it before it reads, and its result is dropped
        when another is listed by the time it lands (the same step number is another step there)."""
        return None if self.store is None else self.store.timeline.name

    def _set_leaves(self, step: int, leaves: list[Leaf], nodes: TreeNodes, listed: str | None) -> None:
        if step != self.step or listed != self._listed():
            return  # stale: the user moved on
        self.query_one(TensorTree).loading = False
        self.query_one(TensorPane).set_leaves(leaves, nodes)
        if self._pending_tensor:
            name, self._pending_tensor = self._pending_tensor, None
            self.select_tensor(name)

    # ---- tensors and details -----------------------------------------------------------------

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[object]) -> None:
        leaf = event.node.data
        if not isinstance(leaf, Leaf) or self.step is None:
            return
        self.leaf = leaf
        if self.mode != "details":
            self.mode = "details"
        previous = self.query_one(StepsPane).previous_complete(self.step)
        self.query_one(DetailsPane).ask(self.step, leaf, self._listed(), self.reader, previous)

    def on_tree_node_selected(self, event: Tree.NodeSelected[object]) -> None:
        self.on_tree_node_highlighted(event)  # type: ignore[arg-type]

    def select_tensor(self, name: str) -> bool:
        """Open the tree down to ``name`` and put the cursor on it (clears the filter)."""
        return self.query_one(TensorPane).select(name)

    # ---- filter -------------------------------------------------------------------------------------

    def action_filter(self) -> None:
        if not self.message:
            self.query_one(TensorPane).open_filter()

    def action_go_back(self) -> None:
        if not self.query_one(TensorPane).close_filter():
            self.mode = "details"

    def action_details(self) -> None:
        self.mode = "details"

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_reload(self) -> None:
        self.load_steps()

    def action_next_timeline(self) -> None:
        """List the next timeline of the tree (spec §19)."""
        info = self.timelines
        if info is None or self.timeline is None or self.message:
            return
        if len(info.timelines) == 1:
            self.notify("This store has one timeline: resuming an older step (RAVEX_RESUME=60) starts another.")
            return
        self.timeline = info.after(self.timeline)
        self.load_steps()

    # ---- diff ------------------------------------------------------------------------------------

    def action_mark(self) -> None:
        step = self.query_one(StepsPane).highlighted_step
        if step is None:
            return
        self.base_step = step
        self.notify(f"step_{step} marked: d diffs it against the highlighted step")

    def action_diff(self) -> None:
        """Diff the highlighted step against the marked base step, or against the previous step."""
        steps = self.query_one(StepsPane)
        b = self.step
        if b is None or self.message:
            return
        a = self.base_step if self.base_step is not None and self.base_step != b else steps.previous_complete(b)
        summary = steps.summary(b)
        if a is None or summary is None or not summary.complete:
            self.notify("Diff needs two complete steps: pick a later step, or mark a base with m.", severity="warning")
            return
        generation = self._generation.next()
        self.diff_pair = (a, b)
        self.diff_rows = []
        self.mode = "diff"
        self.query_one(DiffPane).begin(a, b)
        self.run_diff(a, b, generation)

    @work(thread=True, exclusive=True, group="diff")
    def run_diff(self, a: int, b: int, generation: int) -> None:
        try:
            with heap.parsing():  # 10,000 entries compared, thousands of rows made: no GC walk meanwhile
                ra, rb = self.reader(a), self.reader(b)
                result = diff(ra, rb, stats=False)
                rows = sorted((t for t in result.tensors if t.status != "unchanged"), key=change_order)
                values = [v for v in result.values if v.status != "unchanged"]
                cells = _table_rows(rows, values)
        except Exception as exc:
            self.call_from_thread(self._diff_title, generation, Text(f"diff failed: {one_line(exc)}", "red"))
            return
        unchanged = len(result.tensors) - len(rows)
        self.call_from_thread(self._diff_rows, generation, list(rows), values, cells)  # type: ignore[arg-type]
        every, reported = max(1, len(rows) // PROGRESS_STEPS), 0
        for i, td in enumerate(rows):
            if not self._generation.current(generation):
                return
            if td.status != "changed":
                continue
            try:
                rows[i] = compare_tensor(ra, rb, td)
            except Exception as exc:
                self.call_from_thread(self.notify, f"{td.name}: {one_line(exc)}", severity="error")
                continue
            if i + 1 - reported >= every or i + 1 == len(rows):  # each report is a round trip to the UI
                reported = i + 1
                self.call_from_thread(self._diff_progress, generation, i + 1, len(rows))
        measured = [t for t in rows if t.status != "unchanged"]  # rechunked, same values: unchanged
        unchanged += len(rows) - len(measured)
        rows = sorted(measured, key=change_order)
        title = Text(f"step_{a} → step_{b}: ", style="bold")
        title.append(f"{len(rows)} changed, {unchanged} unchanged")
        if values:
            title.append(f", {len(values)} values changed", style="cyan")
        self.call_from_thread(self._diff_rows, generation, rows, values, _table_rows(rows, values))  # type: ignore[arg-type]
        self.call_from_thread(self._diff_title, generation, title)

    # (called through call_from_thread, whose type variable mypy cannot solve for a coroutine function)
    async def _diff_rows(
        self, generation: int, rows: list[TensorDiff], values: list[ValueDiff], cells: list[TableRow]
    ) -> None:
        """Changed tensors (most changed first), then changed values (lr, step ...): ``cells``, made
        by the worker, into the table in batches of :data:`TABLE_BATCH` (:meth:`DiffPane.fill`)."""
        if not self._generation.current(generation):
            return
        self.diff_rows = rows
        self.diff_values = values
        await self.query_one(DiffPane).fill(cells, TABLE_BATCH, lambda: self._generation.current(generation))

    def _diff_progress(self, generation: int, done: int, total: int) -> None:
        if self._generation.current(generation) and self.diff_pair:
            a, b = self.diff_pair
            self.query_one("#diff-title", Static).update(Text(f"step_{a} → step_{b}: measuring {done}/{total}…"))

    def _diff_title(self, generation: int, text: Text) -> None:
        if self._generation.current(generation):
            self.query_one("#diff-title", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "diff-table" and self.diff_pair and event.row_key.value is not None:
            key = event.row_key.value
            pane = self.query_one(DiffPane)
            if key.startswith("v"):
                vd = self.diff_values[int(key[1:])]
                a, b = self.diff_pair
                pane.show_sides(self.diff_pair, key, [render_value_side(vd.name, a, vd.a),
                                                      render_value_side(vd.name, b, vd.b)])
            elif int(key) < len(self.diff_rows):
                pane.ask_sides(self.diff_pair, key, self.diff_rows[int(key)].name, self.reader)

    # ---- validate -----------------------------------------------------------------------------------

    def action_validate(self) -> None:
        if self.root is None:
            return
        self.mode = "validate"
        self.query_one(ValidatePane).start(self.root)

    def on_validate_pane_open(self, event: ValidatePane.Open) -> None:
        finding = event.finding
        assert finding.tensor and finding.step is not None
        where = finding.timeline or MAIN
        if self._owners.get(finding.step) != where:
            self.notify(f"{finding_step(finding)} is not listed: press t until timeline {where} is",
                        severity="warning")
            return
        self.open_tensor(finding.step, tensor_shown(finding.tensor))

    def open_tensor(self, step: int, name: str) -> None:
        """Go to ``step`` and put the tree cursor on tensor ``name`` (used by validate findings)."""
        steps = self.query_one(StepsPane)
        summary = steps.summary(step)
        if summary is None or not summary.complete:
            self.notify(f"step_{step} is not complete: its tensors cannot be opened", severity="warning")
            return
        self.mode = "details"
        if self.step == step and self.leaves:
            self.select_tensor(name)
            return
        self._pending_tensor = name
        steps.highlight(step)


def _table_rows(rows: list[TensorDiff], values: list[ValueDiff]) -> list[TableRow]:
    """The diff table's cells and row keys (built in the worker: thousands of Rich Texts)."""
    return [(diff_cells(td), str(i)) for i, td in enumerate(rows)] + [
        (value_cells(vd), f"v{i}") for i, vd in enumerate(values)
    ]


def _store_problem(url: str, exc: Exception) -> str:
    from ravex.format import StoreNotFoundError

    if isinstance(exc, StoreNotFoundError):
        return (f"{url}\n\nis not a Ravex store (it has no ravex.json). Pass the folder or URL a training run "
                "writes its checkpoints to: ravex inspect PATH, or set storage in ravex.yaml.\n\nq quits.")
    return f"{url}\n\ncannot be read: {one_line(exc)}\n\nq quits."


__all__ = ["InspectorApp"]
