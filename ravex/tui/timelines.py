"""The timelines and tags of a store as the inspector shows them (spec/FORMAT.md §19).

The inspector shows one timeline at a time: its *history*, the steps its parent lends it up to
the fork (and its grandparent's before that) followed by its own, so that the loss sparkline
runs across the whole training that led to its newest step. It opens on the current timeline
(the one a plain rerun continues); ``t`` moves to the next. Above the steps a small tree shows
every timeline with its own step range and where it forked, marks the one shown and the
current one, and lists the tags with the steps they name.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from rich.text import Text

from ravex.format import CheckpointStore
from ravex.format.history.tags import Tag
from ravex.format.history.timelines import MAIN, Timeline
from ravex.format.reports.summary import StepSummary, summarize_step, summarize_steps


@dataclass
class StoreTimelines:
    """A store's timelines and tags, read once per listing."""

    timelines: dict[str, Timeline]
    current: str
    tags: list[Tag] = field(default_factory=list)
    #: Each timeline's own complete steps (not its lineage's).
    own_steps: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def read(cls, store: CheckpointStore) -> StoreTimelines:
        timelines = store.timelines()
        current = store.current().timeline.name if len(timelines) > 1 else next(iter(timelines))
        own = {name: store.on_timeline(name, timelines).complete_steps() for name in timelines}
        return cls(timelines, current, sorted(store.tags().values(), key=lambda t: t.name), own)

    def order(self) -> list[str]:
        """Every timeline, depth first from ``main``, children by fork step then name: the order
        of the tree and of ``t``."""
        children: dict[str | None, list[str]] = {}
        for name, t in sorted(self.timelines.items(), key=lambda kv: (kv[0] != MAIN, kv[1].fork_step or 0, kv[0])):
            children.setdefault(t.parent, []).append(name)
        out: list[str] = []

        def walk(name: str) -> None:
            out.append(name)
            for child in children.get(name, []):
                walk(child)

        for root in children.get(None, []):
            walk(root)
        return out

    def after(self, name: str) -> str:
        """The timeline ``t`` moves to from ``name`` (round the tree)."""
        order = self.order()
        return order[(order.index(name) + 1) % len(order)] if name in order else order[0]

    @property
    def worth_showing(self) -> bool:
        """A store with one timeline and no tag has no tree to show."""
        return len(self.timelines) > 1 or bool(self.tags)

    def tags_on(self, timeline: str, step: int) -> list[str]:
        """The names of the tags on ``timeline@step``."""
        return [t.name for t in self.tags if t.timeline == timeline and t.step == step]

    def text(self, shown: str) -> Text:
        """The tree, a line a timeline (the pane is narrow): ``└ exp at 60: 70..90`` forked from
        the line above it at its step 60 and holds steps 70 to 90; ``▶`` marks the timeline
        listed below, ``●`` the current one (what a plain rerun continues); then the tags."""
        out = Text()
        for name in self.order():
            t = self.timelines[name]
            depth = self._depth(name)
            steps = self.own_steps.get(name, [])
            span = "no steps yet" if not steps else f"{steps[0]}..{steps[-1]}"
            out.append("▶ " if name == shown else "  ", style="bold")
            out.append("  " * max(depth - 1, 0) + ("└ " if depth else ""))
            out.append(name, style="bold green" if name == self.current else "bold")
            if t.parent is not None:  # the tree says which parent; the fork step is the parent's step
                out.append(f" at {t.fork_step}:", style="dim")
            out.append(f" {span}")
            if name == self.current:
                out.append(" ●", style="green")
            out.append("\n")
        for tag in self.tags:
            out.append(f"tag {tag.name}", style="cyan")
            out.append(f" -> {tag.ref}\n")
        if len(self.timelines) > 1:
            out.append("▶ listed  ● current  t: next", style="dim")
        out.rstrip()
        return out

    def _depth(self, name: str) -> int:
        depth, t = 0, self.timelines[name]
        while t.parent is not None and t.parent in self.timelines and depth < len(self.timelines):
            depth, t = depth + 1, self.timelines[t.parent]
        return depth


def history(view: CheckpointStore) -> Iterator[tuple[str, StepSummary]]:
    """The steps the inspector lists for timeline ``view``, oldest first, each with the timeline
    that holds it: the complete steps its lineage lends it (:meth:`CheckpointStore.lineage_steps`),
    then every step of its own, incomplete ones included. Step numbers do not repeat: a lent
    step is at most the fork step, an own step is above it."""
    if view.timeline.parent is not None:
        for owner, step in view.lineage_steps():
            if owner.timeline.name != view.timeline.name:
                yield owner.timeline.name, summarize_step(owner, step)
    for summary in summarize_steps(view):
        yield view.timeline.name, summary
