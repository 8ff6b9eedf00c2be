"""The inspector's left-hand widgets: the steps list and the tensor tree under its filter box.

The right-hand panes, which run workers of their own, have modules of their own
(:mod:`.details_pane`, :mod:`.diff_pane`, :mod:`.validate_pane`); the help is a screen
(:mod:`.screens`). Layout lives in ``app.tcss``."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.text import Span, Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, OptionList, Static, Tree
from textual.widgets.option_list import Option
from textual.widgets.tree import TreeNode

from ravex.format.reports.summary import StepSummary

from .formatting import loss_sparkline, sparkline
from .model import Leaf, children, filter_leaves, step_row, tree_index

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
    """The filter box (opened with ``/``) over the tensor tree: the pane holds the step's leaves and
    shows those the filter keeps."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.leaves: list[Leaf] = []
        self._tree_nodes: TreeNodes = {}  # the unfiltered tree's nodes, made by the worker that read the step

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter tensors (enter to keep, esc to clear)", id="filter")
        yield TensorTree(id="tree")

    def on_mount(self) -> None:
        self.border_title = "tensors"

    def set_leaves(self, leaves: list[Leaf], nodes: TreeNodes) -> None:
        """A step's leaves (``nodes``: their :func:`tree_nodes`), shown through the filter."""
        self.leaves, self._tree_nodes = leaves, nodes
        self.apply_filter()

    def clear(self) -> None:
        """No step's leaves (a step not read yet, or incomplete)."""
        self.leaves, self._tree_nodes = [], {}
        self.query_one(TensorTree).set_leaves([])

    def apply_filter(self) -> None:
        text = self.query_one("#filter", Input).value
        tree = self.query_one(TensorTree)
        if not text.strip():
            tree.set_leaves(self.leaves, nodes=self._tree_nodes)
        else:
            tree.set_leaves(filter_leaves(self.leaves, text), expand=True)

    def open_filter(self) -> None:
        self.add_class("-filtering")
        self.query_one("#filter", Input).focus()

    def close_filter(self) -> bool:
        """Clear and close the filter if it has the focus (esc); whether it had."""
        box = self.query_one("#filter", Input)
        if not box.has_focus:
            return False
        box.value = ""
        self.remove_class("-filtering")
        self.query_one(TensorTree).focus()
        return True

    def select(self, name: str) -> bool:
        """Open the tree down to ``name`` and put the cursor on it (clears the filter)."""
        box = self.query_one("#filter", Input)
        if box.value:
            box.value = ""
            self.apply_filter()
        tree = self.query_one(TensorTree)
        node = tree.find(name)
        if node is None:
            return False
        tree.focus()
        self.call_after_refresh(tree.move_cursor, node)  # once the opened groups have lines
        return True

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.apply_filter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            self.query_one(TensorTree).focus()
