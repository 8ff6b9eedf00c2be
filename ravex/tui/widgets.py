"""The inspector's widgets: small, each owning one pane. Layout lives in ``app.tcss``."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.cells import cell_len
from rich.text import Span, Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, OptionList, ProgressBar, Static, Tree
from textual.widgets.option_list import Option
from textual.widgets.tree import TreeNode

from ravex.format.reports.summary import StepSummary

from .formatting import loss_sparkline, sparkline
from .model import Leaf, children, step_row, tree_index

#: Tree nodes opened by a filter at most; more matches stay collapsed (still lazily expandable).
FILTER_EXPAND_MAX = 200


class StepsPane(Vertical):
    """Steps with the bytes each one added: sparklines over the run (bytes added, training loss)
    and one bar per step."""

    class Chosen(Message):
        def __init__(self, summary: StepSummary) -> None:
            self.summary = summary
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.summaries: list[StepSummary] = []

    def compose(self) -> ComposeResult:
        yield Static("", id="spark")
        yield OptionList(id="step-list")

    def on_mount(self) -> None:
        self.border_title = "steps"

    def set_steps(self, summaries: list[StepSummary], final: bool = True, tagged: set[int] | None = None) -> None:
        """Replace the list, keeping the highlighted step. ``final``: the listing is done, so
        highlight the newest complete step if nothing is highlighted yet (while a long listing
        is still loading, batches only add rows and move nothing). ``tagged``: the steps a tag
        names, marked."""
        options = self.query_one(OptionList)
        keep = self.highlighted_step
        self.summaries = list(summaries)
        top = max((s.new_bytes for s in self.summaries if s.complete), default=0)
        options.clear_options()
        tagged = tagged or set()
        options.add_options([Option(step_row(s, top, tagged=s.step in tagged), id=str(s.step))
                             for s in self.summaries])
        self._draw_sparkline()
        if not self.summaries:
            return
        complete = [s.step for s in self.summaries if s.complete]
        self.border_subtitle = f"{len(complete)} complete" + (
            f", {len(self.summaries) - len(complete)} incomplete" if len(complete) < len(self.summaries) else ""
        )
        if keep is not None:
            self.highlight(keep)
        elif final:
            self.highlight(complete[-1] if complete else self.summaries[-1].step)
        else:
            options.highlighted = None

    def _draw_sparkline(self) -> None:
        """The bytes each step added and, where steps recorded one, the training loss across them."""
        width = self.content_size.width - 8
        spark = sparkline([s.new_bytes for s in self.summaries], width=width if width > 4 else None)
        text = Text.assemble(("added ", "dim"), (spark, "green"))
        losses = [s.loss for s in self.summaries if s.complete and s.loss is not None]
        if losses:
            text.append_text(Text.assemble(("\nloss  ", "dim"),
                                           (loss_sparkline(losses, width=width if width > 4 else None), "cyan")))
        self.query_one("#spark", Static).update(text)

    def on_resize(self) -> None:
        if self.summaries:
            self._draw_sparkline()

    @property
    def highlighted_step(self) -> int | None:
        options = self.query_one(OptionList)
        if options.highlighted is None or options.option_count == 0:
            return None
        return int(options.get_option_at_index(options.highlighted).id or 0)

    def highlight(self, step: int) -> None:
        options = self.query_one(OptionList)
        for i, s in enumerate(self.summaries):
            if s.step == step:
                options.highlighted = i
                return

    def summary(self, step: int) -> StepSummary | None:
        return next((s for s in self.summaries if s.step == step), None)

    def previous_complete(self, step: int) -> int | None:
        older = [s.step for s in self.summaries if s.complete and s.step < step]
        return older[-1] if older else None

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        s = self.summary(int(event.option.id or 0))
        if s is not None:
            self.post_message(self.Chosen(s))


class TensorTree(Tree[object]):
    """The state tree of a step, grouped by top-level key, built lazily as nodes open.

    A group can still open onto thousands of children (``layers.0.`` ... ``layers.4999.``): those
    are added in one batch (one layout, not one per node), each group remembers its own leaves
    so that opening it does not scan all of them, and label widths are counted, not rendered.
    """

    _batch = 0  # inside _populate: invalidate once at the end, not per node (Tree's __init__ invalidates)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("state", **kwargs)
        self.show_root = False
        self.guide_depth = 2
        self.leaves: list[Leaf] = []
        self._members: dict[str, list[Leaf]] = {}  # group start -> the leaves below it
        self._made_nodes: TreeNodes = {}  # group start -> its child nodes, when made ahead

    def set_leaves(self, leaves: list[Leaf], expand: bool = False, nodes: TreeNodes | None = None) -> None:
        """Show ``leaves``; ``nodes``: their :func:`tree_nodes`, when a worker has made them already."""
        self.clear()
        self.leaves = leaves
        self._members = {}
        self._made_nodes = nodes or {}
        self.root.data = ""
        self._populate(self.root)
        if expand and len(leaves) <= FILTER_EXPAND_MAX:
            self._expand_all(self.root)
        self.root.expand()
        self.cursor_line = 0 if leaves else -1

    def _populate(self, node: TreeNode[object]) -> None:
        if node.children or not isinstance(node.data, str):
            return
        made = self._made_nodes.get(node.data)
        if made is None:
            below = self._members.get(node.data, self.leaves)
            made = [_node(entry) for entry in children(below, node.data, self._members)]
        self._batch += 1
        try:
            for label, data, is_leaf in made:
                node.add(label, data=data, allow_expand=not is_leaf)
        finally:
            self._batch -= 1
        if not self._batch:
            self._invalidate()

    def _invalidate(self) -> None:
        if not self._batch:  # Tree calls this for every node added
            super()._invalidate()

    def process_label(self, label: str | Text) -> Text:
        if isinstance(label, Text) and "\n" not in label.plain:
            return label  # the first line of a one-line Text is itself (the Tree would copy it)
        return super().process_label(label)

    def get_label_width(self, node: TreeNode[object]) -> int:
        """What ``render_label`` would measure, without rendering (the Tree measures every open line)."""
        icon = (self.ICON_NODE_EXPANDED if node.is_expanded else self.ICON_NODE) if node.allow_expand else ""
        return cell_len(icon) + node.label.cell_len  # type: ignore[union-attr]

    def _expand_all(self, node: TreeNode[object]) -> None:
        for child in node.children:
            if isinstance(child.data, str):
                self._populate(child)
                child.expand()
                self._expand_all(child)

    def on_tree_node_expanded(self, event: Tree.NodeExpanded[object]) -> None:
        self._populate(event.node)

    def find(self, name: str) -> TreeNode[object] | None:
        """Open the groups down to the leaf ``name`` and return its node (None if absent)."""
        node = self.root
        while True:
            self._populate(node)
            for child in node.children:
                if isinstance(child.data, Leaf):
                    if child.data.name == name:
                        return child
                elif isinstance(child.data, str) and name.startswith(child.data):
                    child.expand()
                    node = child
                    break
            else:
                return None


#: Each group's child nodes, ``(label, data, is_leaf)``, by the group's start (``""``: the top).
TreeNodes = dict[str, list[tuple[Text, object, bool]]]


def tree_nodes(leaves: list[Leaf]) -> TreeNodes:
    """The tree's nodes for every group at once, labels made: for a worker thread, so that opening
    a group of thousands only adds nodes on the UI thread."""
    return {start: [_node(entry) for entry in entries] for start, entries in tree_index(leaves).items()}


def _node(entry: tuple[str, Leaf | None, int, str]) -> tuple[Text, object, bool]:
    label, leaf, count, child_start = entry
    if leaf is None:
        return _group_label(label, count), child_start, False
    text = Text(label)
    if leaf.kind == "value":
        text.append(f" = {_short(leaf.value)}", style="cyan")
    return text, leaf, True


def _group_label(label: str, count: int) -> Text:
    """``layers. (5000)``: what ``Text.assemble((label, "bold"), (f" ({count})", "dim"))`` makes, built directly
    (a group can open onto thousands of these)."""
    n, tail = len(label), f" ({count})"
    return Text(label + tail, spans=[Span(0, n, "bold")] * bool(n) + [Span(n, n + len(tail), "dim")])


def _short(value: object, n: int = 24) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 1] + "…"


class TensorPane(Vertical):
    """The filter box (opened with ``/``) over the tensor tree."""

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter tensors (enter to keep, esc to clear)", id="filter")
        yield TensorTree(id="tree")

    def on_mount(self) -> None:
        self.border_title = "tensors"


class DetailsPane(VerticalScroll):
    """Metadata, chunk map, statistics and histogram of the selected tensor (or the step)."""

    def compose(self) -> ComposeResult:
        yield Static("", id="details-body")

    def on_mount(self) -> None:
        self.border_title = "details"

    def show(self, text: Text | str) -> None:
        self.query_one("#details-body", Static).update(text)


class DiffPane(Vertical):
    """Changed tensors sorted by relative change, coloured by magnitude, and the two sides of one."""

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


class ValidatePane(Vertical):
    """Validator progress and its findings; selecting one opens the tensor it names."""

    def compose(self) -> ComposeResult:
        yield Static("", id="validate-title")
        yield ProgressBar(id="validate-progress", show_eta=False)
        table: DataTable[Text] = DataTable(id="validate-table", cursor_type="row", zebra_stripes=True)
        table.add_columns(" ", "step", "tensor", "chunk", "kind")
        yield table
        yield Static("", id="validate-message")

    def on_mount(self) -> None:
        self.border_title = "validate"


HELP_KEYS = (
    ("↑ ↓  mouse", "move in the focused pane"),
    ("tab", "next pane: steps, tensors, the right pane"),
    ("enter", "open a group, select a row"),
    ("/", "filter tensors by name (esc clears)"),
    ("d", "diff this step with the marked one, or the previous"),
    ("m", "mark the highlighted step as the diff base"),
    ("v", "validate the store (rehash every object)"),
    ("i  esc", "back to details"),
    ("r", "reload the steps (a run may still be writing)"),
    ("t", "next timeline (resuming an older step forks one)"),
    ("?", "this help"),
    ("q", "quit"),
)


def help_text() -> Text:
    """The help screen's text: keys, then how to read the panes."""
    t = Text()
    t.append("ravex inspect", style="bold")
    t.append(" — browse a checkpoint store\n\n")
    for key, what in HELP_KEYS:
        t.append(f"{key:<12}", style="bold")
        t.append(f"{what}\n")
    t.append("\nSteps: the bar is the bytes a step added; ✗ incomplete, ◆ tagged.\n")
    t.append("Chunk map: █ written by this step, ░ shared with the previous one.\n")
    t.append("Diff: ")
    t.append("red", style="bold red")
    t.append(" ≥ 10% relative change, ")
    t.append("yellow", style="yellow")
    t.append(" ≥ 0.1%, ")
    t.append("green", style="green")
    t.append(" smaller.")
    return t


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        yield Static(help_text(), id="help")

    def on_click(self) -> None:
        self.dismiss()
