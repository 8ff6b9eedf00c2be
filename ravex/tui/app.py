"""``ravex inspect``: browse a checkpoint store — steps, tensors, diffs, validation.

Every read happens in a thread worker; each worker carries the selection it was started for
and its result is dropped when the selection has moved on (the stale-result guard), so the UI
never waits on storage and never shows an answer to an old question.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import ContentSwitcher, DataTable, Footer, Header, Input, ProgressBar, Static, Tree
from textual.worker import get_current_worker

from ravex.format import CheckpointStore, RavexError, StepReader, open_store
from ravex.format.history.runs import RunRecord, read_run
from ravex.format.history.timelines import MAIN
from ravex.format.reports.diff import TensorDiff, ValueDiff, change_order, compare_tensor, diff, step_values
from ravex.format.reports.summary import StepSummary
from ravex.format.reports.validate import Finding, ValidationReport, validate

from . import heap
from .formatting import display_path, one_line
from .manifests import PiecewiseStore
from .model import (
    Leaf,
    compute_details,
    diff_cells,
    filter_leaves,
    render_details,
    render_side,
    render_step,
    render_value,
    render_value_side,
    step_leaves,
    value_cells,
)
from .timelines import StoreTimelines, history
from .widgets import (
    DetailsPane,
    DiffPane,
    HelpScreen,
    StepsPane,
    TensorPane,
    TensorTree,
    TreeNodes,
    ValidatePane,
    tree_nodes,
)

#: Step readers kept in memory (a step of 10,000 tensors holds its parsed manifests).
READER_CACHE = 4
#: Steps summarised between two refreshes of the steps pane while a long listing loads.
STEPS_BATCH = 16
#: Diff rows added to the table per turn of the event loop (the table measures new rows when idle).
TABLE_BATCH = 200
#: Progress reports while a diff measures its changed tensors, at most.
PROGRESS_STEPS = 100
#: One row of the diff table: its cells and its row key.
TableRow = tuple[tuple[Text, ...], str]
#: Manifests a validation keeps parsed: the ranks of the step being checked.
VALIDATE_CACHE = 16


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
        self.leaves: list[Leaf] = []
        self._made_nodes: TreeNodes = {}  # the unfiltered tree's nodes, made by the worker that read the step
        self.leaf: Leaf | None = None
        self.diff_pair: tuple[int, int] | None = None
        self.diff_rows: list[TensorDiff] = []
        self.diff_values: list[ValueDiff] = []
        self._sides_key: str | None = None  # the diff row whose two sides are wanted
        self.findings: list[Finding] = []
        self.validated = False
        self.message: str | None = None
        self._readers: OrderedDict[tuple[str, int], StepReader] = OrderedDict()  # by (timeline listed, step)
        self._readers_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._generation = 0  # bumped by every new diff or validation; older workers' results are dropped
        self._pending_tensor: str | None = None
        self._step_complete = False
        self._runs: dict[str, RunRecord] = {}  # run records read so far, by run id

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
                yield ValidatePane(id="validate")
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

    def watch_mode(self, mode: str) -> None:
        self.query_one("#right", ContentSwitcher).current = mode

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
            self._generation += 1  # a diff or validation in flight answers a question nobody asks now
            self.step, self.leaf, self.base_step, self.diff_pair = None, None, None, None
            self._owners = {}
            self.leaves, self._made_nodes = [], {}
            self.query_one(TensorTree).set_leaves([])
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
        self.query_one(DetailsPane).show(self._render_step(s))
        if s.run:
            self.load_run(s)
        tree = self.query_one(TensorTree)
        if not s.complete:
            self.leaves, self._made_nodes = [], {}
            tree.set_leaves([])
            tree.loading = False
            return
        tree.loading = True  # a step of 10,000 tensors takes a moment to parse
        self.load_step(s.step)

    @work(thread=True, exclusive=True, group="run")
    def load_run(self, s: StepSummary) -> None:
        """The record of the run that wrote step ``s`` (spec §20), into the step's details."""
        assert s.run is not None and self.store is not None
        record, note = self._runs.get(s.run), None
        if record is None:
            try:
                record = read_run(self.store.storage, s.run)
            except Exception as exc:  # a damaged record is a line in the pane, never a traceback
                note = f"run record unreadable: {one_line(exc)}"
            else:
                if record is None:
                    note = "no run record (a store written before 1.1)"
                else:
                    self._runs[s.run] = record
        self.call_from_thread(self._show_run, s, record, note)

    def _show_run(self, s: StepSummary, record: RunRecord | None, note: str | None) -> None:
        if s.step == self.step and self.leaf is None:
            self.query_one(DetailsPane).show(self._render_step(s, record, note))

    def reader(self, step: int) -> StepReader:
        """A cached reader for a complete step (any thread)."""
        store = self.store
        assert store is not None
        key = (store.timeline.name, step)
        with self._readers_lock:
            r = self._readers.get(key)
            if r is not None:
                self._readers.move_to_end(key)
                return r
        with heap.parsing():  # megabytes of JSON: parsed in pieces, no GC pause on what it builds
            r = store.open_step(step)  # a step the lineage lends is read from its own timeline
        with self._readers_lock:
            self._readers[key] = r
            while len(self._readers) > READER_CACHE:
                _, old = self._readers.popitem(last=False)
                old.store.forget(old.step)  # the store would keep its manifests too (and the GC walk them)
        return r

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
        self.leaves = leaves
        self._made_nodes = nodes
        self._apply_filter()
        if self._pending_tensor:
            name, self._pending_tensor = self._pending_tensor, None
            self.select_tensor(name)

    def _apply_filter(self) -> None:
        text = self.query_one("#filter", Input).value
        tree = self.query_one(TensorTree)
        if not text.strip():
            tree.set_leaves(self.leaves, nodes=self._made_nodes)
        else:
            tree.set_leaves(filter_leaves(self.leaves, text), expand=True)

    # ---- tensors and details -----------------------------------------------------------------

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[object]) -> None:
        leaf = event.node.data
        if not isinstance(leaf, Leaf) or self.step is None:
            return
        self.leaf = leaf
        if self.mode != "details":
            self.mode = "details"
        if leaf.kind == "value":
            self.show_value(self.step, leaf)
        else:
            self.load_details(self.step, leaf)

    def on_tree_node_selected(self, event: Tree.NodeSelected[object]) -> None:
        self.on_tree_node_highlighted(event)  # type: ignore[arg-type]

    @work(thread=True, exclusive=True, group="details")
    def show_value(self, step: int, leaf: Leaf) -> None:
        listed = self._listed()
        prev_step = self.query_one(StepsPane).previous_complete(step)
        prev_value, has_prev = None, False
        if prev_step is not None:
            try:
                values = step_values(self.reader(prev_step))
                key = leaf.path or leaf.name
                has_prev = key in values
                prev_value = values.get(key)
            except Exception:
                pass
        text = render_value(leaf, step, prev_value, has_prev)
        self.call_from_thread(self._show_details, step, leaf, text, listed)

    @work(thread=True, exclusive=True, group="details")
    def load_details(self, step: int, leaf: Leaf) -> None:
        assert leaf.path is not None
        listed = self._listed()
        try:
            reader = self.reader(step)
            prev_step = self.query_one(StepsPane).previous_complete(step)
            previous = self.reader(prev_step) if prev_step is not None else None
            d = compute_details(reader, leaf.path, previous, stats=False)
            width = self._details_width()
            self.call_from_thread(self._show_details, step, leaf, render_details(d, width), listed)
            worker = get_current_worker()
            if worker.is_cancelled:
                return  # the user moved on before the statistics were read

            def progress(done: int, total: int, what: str) -> None:
                if worker.is_cancelled:  # a large tensor streams in blocks: stop between two
                    raise _Cancelled

            d = compute_details(reader, leaf.path, previous, stats=True, progress=progress)
            self.call_from_thread(self._show_details, step, leaf, render_details(d, width), listed)
        except _Cancelled:
            return
        except Exception as exc:
            self.call_from_thread(self._show_details, step, leaf, Text(f"{leaf.name}: {one_line(exc)}", "red"),
                                  listed)

    def _details_width(self) -> int:
        return max(20, self.query_one(DetailsPane).size.width - 2)

    def _show_details(self, step: int, leaf: Leaf, text: Text, listed: str | None) -> None:
        if step == self.step and leaf == self.leaf and listed == self._listed():
            self.query_one(DetailsPane).show(text)

    def select_tensor(self, name: str) -> bool:
        """Open the tree down to ``name`` and put the cursor on it (clears the filter)."""
        box = self.query_one("#filter", Input)
        if box.value:
            box.value = ""
            self._apply_filter()
        tree = self.query_one(TensorTree)
        node = tree.find(name)
        if node is None:
            return False
        tree.focus()
        self.call_after_refresh(tree.move_cursor, node)  # once the opened groups have lines
        return True

    # ---- filter -------------------------------------------------------------------------------------

    def action_filter(self) -> None:
        if self.message:
            return
        self.query_one(TensorPane).add_class("-filtering")
        self.query_one("#filter", Input).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self._apply_filter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            self.query_one(TensorTree).focus()

    def action_go_back(self) -> None:
        box = self.query_one("#filter", Input)
        if box.has_focus:
            box.value = ""
            self.query_one(TensorPane).remove_class("-filtering")
            self.query_one(TensorTree).focus()
            return
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
        self._generation += 1
        self.diff_pair = (a, b)
        self.diff_rows = []
        self.mode = "diff"
        self.query_one("#diff-title", Static).update(Text(f"step_{a} → step_{b}: reading manifests…", "bold"))
        self.query_one("#diff-table", DataTable).clear()
        self.query_one("#diff-a", Static).update("")
        self.query_one("#diff-b", Static).update("")
        self.query_one("#diff-table", DataTable).focus()
        self.run_diff(a, b, self._generation)

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
            if generation != self._generation:
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
        by the worker. The table measures every cell of the rows added since it was last idle, so
        thousands of rows go in batches, with a turn of the event loop between two."""
        if generation != self._generation:
            return
        self.diff_rows = rows
        self.diff_values = values
        table = self.query_one("#diff-table", DataTable)
        cursor = table.cursor_row
        table.clear()
        for n, (row, key) in enumerate(cells):
            if n and n % TABLE_BATCH == 0:
                await asyncio.sleep(0)
                if generation != self._generation:
                    return  # another diff has the table now
            table.add_row(*row, key=key)
        if cells:
            table.move_cursor(row=min(cursor, len(cells) - 1))

    def _diff_progress(self, generation: int, done: int, total: int) -> None:
        if generation == self._generation and self.diff_pair:
            a, b = self.diff_pair
            self.query_one("#diff-title", Static).update(Text(f"step_{a} → step_{b}: measuring {done}/{total}…"))

    def _diff_title(self, generation: int, text: Text) -> None:
        if generation == self._generation:
            self.query_one("#diff-title", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "validate-table" and event.row_key.value is not None:
            i = int(event.row_key.value)
            if i < len(self.findings):
                self.query_one("#validate-message", Static).update(Text(self.findings[i].message))
            return
        if event.data_table.id == "diff-table" and self.diff_pair and event.row_key.value is not None:
            key = event.row_key.value
            self._sides_key = key
            if key.startswith("v"):
                vd = self.diff_values[int(key[1:])]
                a, b = self.diff_pair
                sides = [render_value_side(vd.name, a, vd.a), render_value_side(vd.name, b, vd.b)]
                self._show_sides(self.diff_pair, key, sides)
            elif int(key) < len(self.diff_rows):
                self.load_sides(self.diff_pair, key, self.diff_rows[int(key)].name)

    @work(thread=True, exclusive=True, group="diff-sides")
    def load_sides(self, pair: tuple[int, int], key: str, path: str) -> None:
        a, b = pair
        texts = []
        for step in (a, b):
            reader = self.reader(step)
            if path not in reader.arrays:
                texts.append(Text(f"step_{step}: no such tensor", "dim"))
                continue
            try:
                other = self.reader(a if step == b else b)
                d = compute_details(reader, path, other if step == b else None, stats=True)
                texts.append(render_side(d))
            except Exception as exc:
                texts.append(Text(one_line(exc), "red"))
        self.call_from_thread(self._show_sides, pair, key, texts)

    def _show_sides(self, pair: tuple[int, int], key: str, texts: list[Text]) -> None:
        if pair == self.diff_pair and key == self._sides_key and self.mode == "diff":
            self.query_one("#diff-a", Static).update(texts[0])
            self.query_one("#diff-b", Static).update(texts[1])

    # ---- validate -----------------------------------------------------------------------------------

    def action_validate(self) -> None:
        if self.root is None:
            return
        self._generation += 1
        self.findings = []
        self.validated = False
        self.mode = "validate"
        self.query_one("#validate-title", Static).update(Text("validating (rehashing every object)…", "bold"))
        self.query_one("#validate-table", DataTable).clear()
        self.query_one("#validate-message", Static).update("")
        bar = self.query_one("#validate-progress", ProgressBar)
        bar.update(total=None, progress=0)
        bar.display = True
        self.query_one("#validate-table", DataTable).focus()
        self.run_validate(self._generation)

    @work(thread=True, exclusive=True, group="validate")
    def run_validate(self, generation: int) -> None:
        assert self.root is not None
        last = [-1]

        def progress(done: int, total: int, what: str) -> None:
            step = max(1, total // 100)
            if done == total or done < last[0] or done - last[0] >= step:
                last[0] = done
                phase = "reading manifests" if what.startswith(("step", "manifests")) else "rehashing objects"
                self.call_from_thread(self._set_validation_progress, generation, done, total, phase)

        try:
            # a store of its own, holding the manifests of a few steps at a time, not the readers' steps
            # every timeline's steps (from the store's main timeline, as `ravex validate` does)
            report = validate(PiecewiseStore(self.root, cache_size=VALIDATE_CACHE), full=True, progress=progress)
        except Exception as exc:
            failed = Text(f"validation failed: {one_line(exc)}", "red")
            self.call_from_thread(self._set_validation_title, generation, failed)
            return
        self.call_from_thread(self._set_validation_done, generation, report)

    def _set_validation_progress(self, generation: int, done: int, total: int, phase: str) -> None:
        if generation == self._generation:
            self.query_one("#validate-progress", ProgressBar).update(total=total or None, progress=done)
            self.query_one("#validate-title", Static).update(Text(f"validating: {phase}…", "bold"))

    def _set_validation_title(self, generation: int, text: Text) -> None:
        if generation == self._generation:
            self.query_one("#validate-title", Static).update(text)

    def _set_validation_done(self, generation: int, report: ValidationReport) -> None:
        if generation != self._generation:
            return
        errors = [f for f in report.findings if f.severity == "error"]
        self.findings = errors + [f for f in report.findings if f.severity != "error"]
        self.validated = True
        self.query_one("#validate-progress", ProgressBar).display = False  # the title says it is done
        title = Text()
        if report.ok:
            title.append("✓ ok", style="bold green")
        else:
            title.append(f"✗ {len(errors)} error{'s' if len(errors) != 1 else ''}", style="bold red")
        title.append(f": {len(report.steps_checked)} steps, {report.objects_checked} objects rehashed, "
                     f"{len(self.findings) - len(errors)} warnings")
        self.query_one("#validate-title", Static).update(title)
        table = self.query_one("#validate-table", DataTable)
        table.clear()
        for i, f in enumerate(self.findings):
            style = "red" if f.severity == "error" else "yellow"
            table.add_row(
                Text("✗" if f.severity == "error" else "!", style=f"bold {style}"),
                Text(_finding_step(f)), Text(_display(f.tensor) or f.kind, style=style),
                Text(f.chunk or ""), Text(f.kind), key=str(i),
            )
        if self.findings:
            self.query_one("#validate-message", Static).update(Text(self.findings[0].message))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "validate-table" and event.row_key.value is not None:
            finding = self.findings[int(event.row_key.value)]
            if finding.tensor and finding.step is not None:
                where = finding.timeline or MAIN
                if self._owners.get(finding.step) != where:
                    self.notify(f"{_finding_step(finding)} is not listed: press t until timeline {where} is",
                                severity="warning")
                    return
                self.open_tensor(finding.step, _display(finding.tensor))

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


class _Cancelled(Exception):
    """Raised inside a worker whose result nobody wants any more."""


def _finding_step(f: Finding) -> str:
    """A finding's step as the table shows it: ``step_60``, ``exp@step_60`` on another timeline."""
    if f.step is None:
        return ""
    return f"step_{f.step}" if f.timeline is None else f"{f.timeline}@step_{f.step}"


def _display(tensor: str | None) -> str:
    return display_path(tensor) if tensor else ""


def _store_problem(url: str, exc: Exception) -> str:
    from ravex.format import StoreNotFoundError

    if isinstance(exc, StoreNotFoundError):
        return (f"{url}\n\nis not a Ravex store (it has no ravex.json). Pass the folder or URL a training run "
                "writes its checkpoints to: ravex inspect PATH, or set storage in ravex.yaml.\n\nq quits.")
    return f"{url}\n\ncannot be read: {one_line(exc)}\n\nq quits."


__all__ = ["InspectorApp"]
