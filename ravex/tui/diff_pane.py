"""The diff pane: the table of what changed between two steps, and the two sides of the
highlighted row, each side read in a worker of the pane's own.

The app runs the diff itself (:meth:`InspectorApp.run_diff`) and hands the pane the table's rows;
the pane clears itself for a new diff (:meth:`DiffPane.begin`), fills its table in batches
(:meth:`DiffPane.fill`) and answers which row's sides are wanted: a side read for another row,
another diff, or while the pane is hidden is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from ravex.format import StepReader

from .formatting import one_line
from .model import compute_details, render_side

Pair = tuple[int, int]
#: One row of the diff table: its cells and its row key.
TableRow = tuple[tuple[Text, ...], str]


class DiffPane(Vertical):
    """Changed tensors sorted by relative change, coloured by magnitude, and the two sides of one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._asked: tuple[Pair, str] | None = None  # the diff and the row whose sides are wanted

    def compose(self) -> ComposeResult:
        yield Static("", id="diff-title")
        table: DataTable[Text] = DataTable(id="diff-table", cursor_type="row", zebra_stripes=True)
        table.add_columns("tensor", "Δ rel", "chunks", "max|a-b|", "cosine", "status")
        yield table
        with Horizontal(id="diff-sides"):
            yield Static("", id="diff-a", classes="side")
            yield Static("", id="diff-b", classes="side")

    def on_mount(self) -> None:
        self.border_title = "diff"

    def begin(self, a: int, b: int) -> None:
        """A new diff of step ``a`` against step ``b``: the pane emptied, the table focused."""
        self.query_one("#diff-title", Static).update(Text(f"step_{a} → step_{b}: reading manifests…", "bold"))
        self.query_one("#diff-table", DataTable).clear()
        self.query_one("#diff-a", Static).update("")
        self.query_one("#diff-b", Static).update("")
        self.query_one("#diff-table", DataTable).focus()

    async def fill(self, cells: list[TableRow], batch: int, wanted: Callable[[], bool]) -> None:
        """The table's rows, ``cells``, the cursor kept where it was. The table measures every cell
        of the rows added since it was last idle, so thousands of rows go in runs of ``batch``, with
        a turn of the event loop between two, for as long as the diff is ``wanted``."""
        table = self.query_one("#diff-table", DataTable)
        cursor = table.cursor_row
        table.clear()
        for n, (row, key) in enumerate(cells):
            if n and n % batch == 0:
                await asyncio.sleep(0)
                if not wanted():
                    return  # another diff has the table now
            table.add_row(*row, key=key)
        if cells:
            table.move_cursor(row=min(cursor, len(cells) - 1))

    def show_sides(self, pair: Pair, key: str, texts: list[Text]) -> None:
        """The two sides of row ``key`` of the diff ``pair``, made already (a value's)."""
        self._asked = (pair, key)
        self._answer(pair, key, texts)

    def ask_sides(self, pair: Pair, key: str, path: str, reader: Callable[[int], StepReader]) -> None:
        """Read the two sides of tensor ``path`` (row ``key`` of the diff ``pair``) and show them."""
        self._asked = (pair, key)
        self.load_sides(pair, key, path, reader)

    @work(thread=True, exclusive=True, group="diff-sides")
    def load_sides(self, pair: Pair, key: str, path: str, reader: Callable[[int], StepReader]) -> None:
        a, b = pair
        texts = []
        for step in (a, b):
            current = reader(step)
            if path not in current.arrays:
                texts.append(Text(f"step_{step}: no such tensor", "dim"))
                continue
            try:
                other = reader(a if step == b else b)
                d = compute_details(current, path, other if step == b else None, stats=True)
                texts.append(render_side(d))
            except Exception as exc:
                texts.append(Text(one_line(exc), "red"))
        self.app.call_from_thread(self._answer, pair, key, texts)

    def _answer(self, pair: Pair, key: str, texts: list[Text]) -> None:
        if (pair, key) == self._asked and self.display:  # hidden: the app shows another pane now
            self.query_one("#diff-a", Static).update(texts[0])
            self.query_one("#diff-b", Static).update(texts[1])
