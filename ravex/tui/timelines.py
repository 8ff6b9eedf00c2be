"""The timelines and tags of a store as the inspector shows them, above the steps: each timeline
with its own step range and where it forked, the current one (what a plain rerun continues)
marked, and every tag with the step it names (spec/FORMAT.md §19)."""

from __future__ import annotations

from rich.text import Text

from ravex.format import CheckpointStore


def timeline_text(store: CheckpointStore) -> Text | None:
    """The tree as text; None for a store with one timeline and no tag (nothing to say)."""
    timelines = store.timelines()
    tags = sorted(store.tags().values(), key=lambda t: t.name)
    if len(timelines) == 1 and not tags:
        return None
    current = store.current().timeline.name
    children: dict[str | None, list[str]] = {}
    for name, t in sorted(timelines.items(), key=lambda kv: (kv[1].fork_step or 0, kv[0])):
        children.setdefault(t.parent, []).append(name)
    out = Text()

    def walk(name: str, depth: int) -> None:
        t = timelines[name]
        steps = store.on_timeline(name, timelines).complete_steps()
        span = "no steps yet" if not steps else f"{steps[0]}..{steps[-1]} ({len(steps)})"
        out.append("  " * depth + ("└ " if depth else ""))
        out.append(name, style="bold green" if name == current else "bold")
        out.append(f"  {span}")
        if t.parent is not None:
            out.append(f"  from {t.parent}@{t.fork_step}", style="dim")
        if name == current:
            out.append("  current", style="green")
        out.append("\n")
        for child in children.get(name, []):
            walk(child, depth + 1)

    for root in children.get(None, []):
        walk(root, 0)
    for tag in tags:
        out.append(f"tag {tag.name}", style="cyan")
        out.append(f" -> {tag.ref}\n")
    out.rstrip()
    return out
