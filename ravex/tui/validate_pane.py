"""The validate pane: ``v`` rehashes every object of the store in a worker of the pane's own,
showing its progress, then lists the findings, errors first; choosing one that names a tensor
asks the app to open it (:class:`ValidatePane.Open`).

Its answers pass the stale-result guard the app shares with it (:mod:`.generation`): a diff
started meanwhile, or another timeline listed, drops them.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, ProgressBar, Static

from ravex.format import CheckpointStore
from ravex.format.reports.validate import Finding, ValidationReport, validate

from .formatting import display_path, one_line
from .generation import Generation
from .manifests import PiecewiseStore

#: Manifests a validation keeps parsed: the ranks of the step being checked.
VALIDATE_CACHE = 16


class ValidatePane(Vertical):
    """Validator progress and its findings; selecting one opens the tensor it names."""

    class Open(Message):
        """A finding chosen that names a tensor of a step: the app goes there."""

        def __init__(self, finding: Finding) -> None:
            super().__init__()
            self.finding = finding

    def __init__(self, generation: Generation, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.generation = generation
        #: the last validation's findings, errors first; ``validated`` once it has finished
        self.findings: list[Finding] = []
        self.validated = False

    def compose(self) -> ComposeResult:
        yield Static("", id="validate-title")
        yield ProgressBar(id="validate-progress", show_eta=False)
        table: DataTable[Text] = DataTable(id="validate-table", cursor_type="row", zebra_stripes=True)
        table.add_columns(" ", "step", "tensor", "chunk", "kind")
        yield table
        yield Static("", id="validate-message")

    def on_mount(self) -> None:
        self.border_title = "validate"

    def start(self, root: CheckpointStore) -> None:
        """Validate every timeline's steps of ``root`` (the store's main timeline, as ``ravex
        validate`` does), the pane emptied and its table focused."""
        generation = self.generation.next()
        self.findings = []
        self.validated = False
        self.query_one("#validate-title", Static).update(Text("validating (rehashing every object)…", "bold"))
        self.query_one("#validate-table", DataTable).clear()
        self.query_one("#validate-message", Static).update("")
        bar = self.query_one("#validate-progress", ProgressBar)
        bar.update(total=None, progress=0)
        bar.display = True
        self.query_one("#validate-table", DataTable).focus()
        self.run_validate(root, generation)

    @work(thread=True, exclusive=True, group="validate")
    def run_validate(self, root: CheckpointStore, generation: int) -> None:
        last = [-1]

        def progress(done: int, total: int, what: str) -> None:
            step = max(1, total // 100)
            if done == total or done < last[0] or done - last[0] >= step:
                last[0] = done
                phase = "reading manifests" if what.startswith(("step", "manifests")) else "rehashing objects"
                self.app.call_from_thread(self._set_progress, generation, done, total, phase)

        try:
            # a store of its own, holding the manifests of a few steps at a time, not the readers' steps
            report = validate(PiecewiseStore(root, cache_size=VALIDATE_CACHE), full=True, progress=progress)
        except Exception as exc:
            failed = Text(f"validation failed: {one_line(exc)}", "red")
            self.app.call_from_thread(self._set_title, generation, failed)
            return
        self.app.call_from_thread(self._set_done, generation, report)

    def _set_progress(self, generation: int, done: int, total: int, phase: str) -> None:
        if self.generation.current(generation):
            self.query_one("#validate-progress", ProgressBar).update(total=total or None, progress=done)
            self.query_one("#validate-title", Static).update(Text(f"validating: {phase}…", "bold"))

    def _set_title(self, generation: int, text: Text) -> None:
        if self.generation.current(generation):
            self.query_one("#validate-title", Static).update(text)

    def _set_done(self, generation: int, report: ValidationReport) -> None:
        if not self.generation.current(generation):
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
                Text(finding_step(f)), Text(tensor_shown(f.tensor) or f.kind, style=style),
                Text(f.chunk or ""), Text(f.kind), key=str(i),
            )
        if self.findings:
            self.query_one("#validate-message", Static).update(Text(self.findings[0].message))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "validate-table" and event.row_key.value is not None:
            i = int(event.row_key.value)
            if i < len(self.findings):
                self.query_one("#validate-message", Static).update(Text(self.findings[i].message))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "validate-table" and event.row_key.value is not None:
            finding = self.findings[int(event.row_key.value)]
            if finding.tensor and finding.step is not None:
                self.post_message(self.Open(finding))


def finding_step(f: Finding) -> str:
    """A finding's step as the table shows it: ``step_60``, ``exp@step_60`` on another timeline."""
    if f.step is None:
        return ""
    return f"step_{f.step}" if f.timeline is None else f"{f.timeline}@step_{f.step}"


def tensor_shown(tensor: str | None) -> str:
    """A finding's tensor as the tree names it."""
    return display_path(tensor) if tensor else ""
