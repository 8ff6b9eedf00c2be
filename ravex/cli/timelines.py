"""Timelines and tags on the command line: the tree ``ravex ls`` shows, and ``ravex tag``.

A store's timelines (spec/FORMAT.md §19) print as a tree: each with its own step range and
where it forked, the current one (what a plain rerun continues) marked. ``ravex tag NAME STEP``
names a step so that retention and ``ravex gc`` never collect it; ``ravex tag`` lists the tags,
``ravex tag --delete NAME`` removes one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ravex.tui.formatting import one_line

from .common import (
    EXIT_OK,
    STORE_HELP,
    UsageError,
    Verb,
    console,
    json_argument,
    open_store_for,
    print_json,
    split_step,
)

if TYPE_CHECKING:
    from rich.console import Console

    from ravex.format import CheckpointStore
    from ravex.format.history.tags import Tag
    from ravex.format.reports.summary import StepSummary


@dataclass
class Branch:
    """One timeline as ``ls`` shows it: its document, its own steps, its children."""

    name: str
    parent: str | None
    fork_step: int | None
    store: CheckpointStore
    rows: list[StepSummary] = field(default_factory=list)
    children: list[Branch] = field(default_factory=list)

    def span(self) -> str:
        done = [r.step for r in self.rows if r.complete]
        if not done:
            return "no steps yet"
        return f"steps {done[0]}..{done[-1]} ({len(done)})" if len(done) > 1 else f"step {done[0]}"


@dataclass
class TimelineTree:
    """Every timeline of a store and its tags: ``main`` at the root, then each root timeline
    (a fresh run's own history, ``resume: never``), each with the timelines forked from it."""

    roots: list[Branch]
    current: str
    tags: list[Tag]

    def branches(self) -> list[Branch]:
        """Depth first, ``main``'s tree first, children by fork step then name."""
        out: list[Branch] = []
        stack = list(reversed(self.roots))
        while stack:
            branch = stack.pop()
            out.append(branch)
            stack.extend(reversed(branch.children))
        return out

    def tagged(self, timeline: str) -> dict[int, list[str]]:
        """The names of the tags on ``timeline``'s steps, by step."""
        out: dict[int, list[str]] = {}
        for t in self.tags:
            if t.timeline == timeline:
                out.setdefault(t.step, []).append(t.name)
        return out

    @property
    def interesting(self) -> bool:
        """Worth printing beside the steps: a store with another timeline or a tag."""
        return len(self.roots) > 1 or bool(self.roots[0].children or self.tags)

    def to_json(self) -> dict[str, Any]:
        return {
            "current_timeline": self.current,
            "timelines": [
                {"name": b.name, "parent": b.parent, "fork_step": b.fork_step, "current": b.name == self.current,
                 "steps": [r.to_json() for r in b.rows]}
                for b in self.branches()
            ],
            "tags": [t.to_json() for t in self.tags],
        }

    def print(self, out: Console) -> None:
        from rich.tree import Tree

        tagged: dict[tuple[str, int], list[str]] = {}
        for t in self.tags:
            tagged.setdefault((t.timeline, t.step), []).append(t.name)

        def label(b: Branch) -> str:
            where = f"  forked at {b.parent}@{b.fork_step}" if b.parent is not None else ""
            here = "  [green]<- current[/]" if b.name == self.current and self.interesting else ""
            tags = [f"{', '.join(names)} -> {s}" for (tl, s), names in sorted(tagged.items()) if tl == b.name]
            tag_text = f"  [cyan]tags: {'; '.join(tags)}[/]" if tags else ""
            return f"[bold]{b.name}[/]  {b.span()}{where}{here}{tag_text}"

        tree = Tree("timelines")
        nodes = {None: tree}
        for b in self.branches():
            nodes[b.name] = nodes[b.parent].add(label(b))  # type: ignore[index]
        out.print(tree)


def timeline_tree(store: CheckpointStore, main_rows: list[StepSummary]) -> TimelineTree:
    """The tree of ``store``'s timelines; ``main_rows`` are main's summaries, already read."""
    from ravex.format.reports.summary import summarize_steps

    timelines = store.timelines()
    branches = {
        name: Branch(name, t.parent, t.fork_step, store.on_timeline(name, timelines))
        for name, t in timelines.items()
    }
    roots = [b for b in branches.values() if b.parent is None]  # main first (read_timelines)
    for b in sorted(branches.values(), key=lambda b: (b.fork_step or 0, b.name)):
        b.rows = main_rows if b is roots[0] else list(summarize_steps(b.store))
        if b.parent in branches:
            branches[b.parent].children.append(b)
    current = store.current().timeline.name if len(branches) > 1 else roots[0].name
    return TimelineTree(roots, current, sorted(store.tags().values(), key=lambda t: t.name))


def cmd_tag(args: argparse.Namespace) -> int:
    """Name a step so that retention and gc never collect it (NAME STEP); no NAME: list the tags.

    ``--delete NAME`` removes a tag. A bare step is one of the current timeline."""
    from ravex.format import RavexError

    store_url: str | None = args.store
    step = args.step
    if step is not None:
        named_store, step = split_step(step)
        store_url = named_store or store_url
    store = open_store_for(store_url)
    try:
        if args.delete is not None:
            if args.name is not None:
                raise UsageError("give either NAME STEP to tag or --delete NAME, not both")
            tag = store.untag(args.delete)
            _report(args, {"deleted": tag.to_json()}, f"deleted tag {tag.name} (was {tag.ref})")
            return EXIT_OK
        if args.name is None:
            tags = sorted(store.tags().values(), key=lambda t: t.name)
            if args.json:
                print_json({"url": store.url, "tags": [t.to_json() for t in tags]})
                return EXIT_OK
            out = console()
            if not tags:
                out.print(f"{store.url}: no tags", soft_wrap=True)
            for t in tags:
                out.print(f"{t.name}  -> {t.ref}  [dim]{t.created_at}[/]", soft_wrap=True)
            return EXIT_OK
        if step is None:
            raise UsageError(f"which step should {args.name!r} name? `ravex tag {args.name} STEP` (e.g. latest)")
        tag = (store if "@" in step else store.current()).tag(args.name, step)  # a bare step: the current timeline
    except RavexError as exc:
        raise UsageError(one_line(exc)) from None
    _report(args, {"tagged": tag.to_json()}, f"tagged {tag.ref} as {tag.name}")
    return EXIT_OK


def _report(args: argparse.Namespace, doc: dict[str, Any], text: str) -> None:
    if args.json:
        print_json(doc)
    else:
        console().print(text, soft_wrap=True, markup=False)


def _tag_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", metavar="NAME", help="the tag's name (letters, digits, . _ -)")
    p.add_argument("step", nargs="?", metavar="STEP", help="the step it names: 100, latest, TIMELINE@100, STORE@100")
    p.add_argument("--delete", metavar="NAME", default=None, help="delete this tag (its step may then be collected)")
    p.add_argument("--store", metavar="STORE", default=None, help=STORE_HELP)
    json_argument(p)


VERBS = (Verb("tag", cmd_tag, _tag_arguments),)
