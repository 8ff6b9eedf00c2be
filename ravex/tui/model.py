"""What the inspector shows, computed without Textual: leaves of a step, details, rows.

Workers call the ``compute_*`` functions off the UI thread; widgets only place what the
``render_*`` functions return (Rich ``Text``), so tests can call both directly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from ravex.format import RavexError, StepReader
from ravex.format.history.runs import RunRecord
from ravex.format.reports.diff import TensorDiff, ValueDiff, step_values
from ravex.format.reports.summary import (
    ChunkShare,
    Progress,
    StepSummary,
    TensorStats,
    chunk_sharing,
    dtype_name,
    read_tensor_stats,
)
from ravex.format.steps.sections import named, object_names

from .formatting import (
    bar,
    change_style,
    chunk_map,
    display_path,
    histogram_lines,
    human_bytes,
    number,
    percent,
    run_lines,
    shape_text,
    short_bytes,
    short_time,
)


@dataclass(frozen=True)
class Leaf:
    """One entry of the tensor tree: a tensor (``path`` is its array path) or a plain value."""

    name: str  # the user's path, segments unescaped: "model/layer.0.weight", "models/netG/..."
    kind: str  # tensor | value
    path: str | None = None  # a tensor's array path; a value's path in the tree ("models/0/type")
    value: Any = None

    @property
    def group(self) -> str:
        return self.name.split("/", 1)[0]


def step_leaves(reader: StepReader) -> list[Leaf]:
    """Every tensor (all ranks) and every plain value (rank 0) of a step, sorted by name;
    a model or optimizer the script named is shown by that name (``models/netG/...``)."""
    scripts = object_names(reader.manifests[0].tree)
    leaves = [Leaf(named(display_path(p), scripts), "tensor", p) for p in reader.arrays]
    try:
        values = step_values(reader)
    except Exception:  # a tree that does not decode still lists its tensors
        values = {}
    leaves.extend(Leaf(named(name, scripts), "value", name, v) for name, v in values.items())
    return sorted(leaves, key=lambda leaf: natural_key(leaf.name))


def natural_key(name: str) -> tuple[int | str, ...]:
    """Sort ``layers.2`` before ``layers.10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def filter_leaves(leaves: list[Leaf], text: str) -> list[Leaf]:
    """Leaves whose name contains every space-separated word of ``text`` (case-insensitive)."""
    words = text.lower().split()
    if not words:
        return leaves
    return [leaf for leaf in leaves if all(w in leaf.name.lower() for w in words)]


#: A level with more entries than this is grouped by dotted prefix too (``layers.`` ...), the
#: way PyTorch names parameters, so that no node ever opens onto thousands of children.
SPLIT_MIN = 64


def children(
    leaves: list[Leaf], start: str = "", members: dict[str, list[Leaf]] | None = None
) -> list[tuple[str, Leaf | None, int, str]]:
    """The entries right below the names beginning with ``start`` (``""`` for the top).

    Each is ``(label, leaf, count, child_start)``: a leaf when exactly one name ends there
    (``leaf`` set), else a group of ``count`` names, opened with ``children(leaves, child_start)``.
    Levels split at ``/``; a level of more than :data:`SPLIT_MIN` entries also splits at ``.``.
    Computed on demand, so a tree of 10,000 tensors only builds the nodes that are open.
    ``members``, when given, receives each group's leaves under its ``child_start``: opening
    that group then needs to look at those leaves only, not at all of them again.
    """
    entries, groups = _level(leaves, start, "/")
    if len(entries) > SPLIT_MIN:
        dotted, dotted_groups = _level(leaves, start, "/.")
        if len(dotted) < len(entries):
            entries, groups = dotted, dotted_groups
    if members is not None:
        members.update(groups)
    return entries


def tree_index(leaves: list[Leaf]) -> dict[str, list[tuple[str, Leaf | None, int, str]]]:
    """:func:`children` of the top and of every group below it, in one go (for a worker thread:
    a group of 10,000 names then opens without any scan on the UI thread)."""
    index: dict[str, list[tuple[str, Leaf | None, int, str]]] = {}
    members: dict[str, list[Leaf]] = {}
    todo = [""]
    while todo:  # each child_start is longer than its start: this ends
        start = todo.pop()
        index[start] = entries = children(members.pop(start, leaves), start, members)
        todo.extend(child_start for _label, leaf, _n, child_start in entries if leaf is None)
    return index


_CUT = {"/": re.compile("/"), "/.": re.compile(r"[/.]")}


def _level(
    leaves: list[Leaf], start: str, seps: str
) -> tuple[list[tuple[str, Leaf | None, int, str]], dict[str, list[Leaf]]]:
    out: dict[str, tuple[str, Leaf | None, int, str]] = {}
    groups: dict[str, list[Leaf]] = {}
    cut = _CUT[seps].search
    n = len(start)
    for leaf in leaves:
        name = leaf.name
        if not name.startswith(start):
            continue
        m = cut(name, n)
        if m is None:
            rest = name[n:]
            out[rest] = (rest, leaf, 1, name)
            continue
        end = m.end()
        key = name[n:end]
        have = out.get(key)
        out[key] = (key.rstrip("/"), None, (have[2] if have else 0) + 1, name[:end])
        groups.setdefault(name[:end], []).append(leaf)
    return list(out.values()), groups


# ---- steps pane --------------------------------------------------------------------------------


def step_row(s: StepSummary, max_new: int, width: int = 6, tagged: bool = False) -> Text:
    """One line of the steps pane: name, size, a bar of the bytes it added, those bytes, and
    ``◆`` when a tag names it.

    ``step_300  42.3K ██▌   +14.0K``; an incomplete step is marked instead.
    """
    label = Text(f"step_{s.step}".ljust(9), style="bold" if s.complete else "dim")
    if tagged:
        label.append("◆", style="cyan")
    else:
        label.append(" ")
    if not s.complete:
        label.append("✗ incomplete", style="yellow")
        return label
    label.append(f"{short_bytes(s.logical_bytes):>6} ", style="dim")
    label.append(bar(s.new_bytes, max_new, width), style="green")
    label.append(f" +{short_bytes(s.new_bytes)}")
    return label


def render_step(
    s: StepSummary, record: RunRecord | None = None, note: str | None = None,
    timeline: str = "main", tags: list[str] | None = None,
) -> Text:
    """The details pane for a step (no tensor selected yet): what it holds, its training loss,
    its tags, and the record of the run that wrote it (``note`` says why there is none, once
    looked for). ``timeline``: the one that holds the step (spec §19), named unless ``main``."""
    t = Text()
    t.append(f"step_{s.step}" if timeline == "main" else f"{timeline}@step_{s.step}", style="bold")
    if tags:
        t.append(f"  ◆ {', '.join(tags)}", style="cyan")
    t.append("\n")
    if not s.complete:
        t.append(f"incomplete: {s.problem}\n", style="yellow")
        t.append("Readers ignore this step; a writer may still be working on it.\n")
    t.append(f"saved     {short_time(s.created_at)}\n")
    t.append(f"ranks     {len(s.ranks)}" + (f" of {s.world_size}" if s.world_size else "") + "\n")
    t.append(f"tensors   {s.tensors}\n")
    t.append(f"logical   {human_bytes(s.logical_bytes)}\n")
    t.append(f"written   {human_bytes(s.new_bytes)} new, {human_bytes(s.reused_bytes)} reused "
             f"({percent(s.reuse_ratio)})\n")
    t.append(f"loss      {number(s.loss, 8)}\n")
    if s.run:
        t.append(f"run       {s.run}\n")
    if record is not None:
        t.append("\n")
        for line in run_lines(record):
            t.append(line + "\n")
    elif note:
        t.append(f"\n{note}\n", style="dim")
    t.append("\nPick a tensor on the left (tab, arrows, enter).", style="dim")
    return t


# ---- tensor details ----------------------------------------------------------------------------


@dataclass
class TensorDetails:
    """Everything the details pane shows for one tensor of one step."""

    step: int
    name: str
    path: str
    shape: tuple[int, ...]
    dtype: str
    chunk_shape: tuple[int, ...]
    stored_bytes: int
    logical_bytes: int
    previous: int | None
    shares: list[ChunkShare] = field(default_factory=list)
    stats: TensorStats | None = None
    error: str | None = None


def compute_details(
    reader: StepReader, path: str, previous: StepReader | None, stats: bool = True, progress: Progress | None = None
) -> TensorDetails:
    """Metadata, chunk sharing with ``previous`` and (``stats=True``) statistics of one tensor.

    ``progress`` is called between the blocks of a large tensor; it may raise to stop.
    """
    e = reader.arrays[path]
    dt = dtype_name(e)
    try:
        import numpy as np

        itemsize = np.dtype(dt).itemsize
    except TypeError:
        itemsize = 0
    d = TensorDetails(
        reader.step, display_path(path), path, e.shape, dt, e.chunk_shape, e.stored_bytes(),
        math.prod(e.shape) * itemsize, previous.step if previous else None,
        chunk_sharing(e, previous.arrays.get(path) if previous else None),
    )
    if stats:
        try:
            d.stats = read_tensor_stats(reader, path, progress=progress)
        except RavexError as exc:  # corrupt or missing chunks: show why, do not crash
            d.error = " ".join(str(exc).split())
    return d


def render_details(d: TensorDetails, width: int = 40, hist: bool = True) -> Text:
    """The details pane for one tensor."""
    t = Text()
    t.append(f"{d.name}\n", style="bold")
    t.append(f"step_{d.step}  {shape_text(d.shape)}  {d.dtype}\n")
    t.append(f"chunks    {len(d.shares)} of {shape_text(d.chunk_shape)}\n")
    t.append(f"stored    {human_bytes(d.stored_bytes)} / logical {human_bytes(d.logical_bytes)}\n")
    counts = {k: sum(1 for s in d.shares if s.status == k) for k in ("shared", "changed", "new")}
    if d.previous is None:
        t.append("first step: every chunk is new\n", style="dim")
    else:
        t.append(f"vs step_{d.previous}: ")
        t.append(f"{counts['shared']} shared", style="green")
        t.append(f", {counts['changed']} changed", style="yellow" if counts["changed"] else "")
        t.append(f", {counts['new']} new\n", style="magenta" if counts["new"] else "")
    t.append("chunk map ", style="dim")
    t.append(chunk_map([s.status for s in d.shares], max(8, width - 10)) + "\n", style="cyan")
    t.append("          █ written  ░ shared\n", style="dim")
    t.append("\n")
    s = _stats_or_notice(t, d, "computing statistics…")
    if s is None:
        return t
    t.append(f"min  {number(s.min):>11}   max {number(s.max):>11}\n")
    t.append(f"mean {number(s.mean):>11}   std {number(s.std):>11}\n")
    t.append(f"L2   {number(s.l2):>11}   ")
    bad = s.nan + s.inf
    t.append(f"NaN {s.nan} Inf {s.inf}\n", style="bold red" if bad else "")
    if hist:
        for line in histogram_lines(s.hist_counts, s.hist_edges, width=max(4, width - 30)):
            t.append(line + "\n", style="blue")
    return t


def _stats_or_notice(t: Text, d: TensorDetails, computing: str) -> TensorStats | None:
    """The tensor's statistics, or None after saying why there are none yet (unreadable, or
    still being computed in a worker)."""
    if d.error:
        t.append(f"cannot read: {d.error}\n", style="bold red")
        return None
    if d.stats is None:
        t.append(f"{computing}\n", style="dim italic")
    return d.stats


def render_side(d: TensorDetails) -> Text:
    """One side of a diff: the step's statistics of the tensor, compact enough for half a pane."""
    t = Text()
    t.append(f"step_{d.step}\n", style="bold")
    s = _stats_or_notice(t, d, "computing…")
    if s is None:
        return t
    for label, value in (("min", s.min), ("max", s.max), ("mean", s.mean), ("std", s.std), ("L2", s.l2)):
        t.append(f"{label:<5}{number(value):>11}\n")
    t.append(f"NaN {s.nan} Inf {s.inf}\n", style="bold red" if s.nan + s.inf else "dim")
    return t


def render_value(leaf: Leaf, step: int, previous_value: Any = None, has_previous: bool = False) -> Text:
    t = Text()
    t.append(f"{leaf.name}\n", style="bold")
    t.append(f"step_{step}  {type(leaf.value).__name__}\n")
    t.append(f"\n{leaf.value!r}\n", style="cyan")
    if has_previous:
        same = previous_value == leaf.value
        t.append(f"\nprevious: {previous_value!r}", style="dim" if same else "yellow")
    return t


# ---- diff ------------------------------------------------------------------------------------------


def diff_cells(td: TensorDiff) -> tuple[Text, ...]:
    """The cells of one diff-table row, coloured by the size of the change."""
    style = change_style(td.rel_l2, td.status)
    rel = td.rel_l2 if td.rel_l2 is not None else None
    return (
        Text(display_path(td.name), style=style),
        Text(number(rel) if rel is not None else "…" if td.status == "changed" else td.status,
             style=style, justify="right"),
        Text(f"{td.chunks_changed}/{td.chunks_total}", justify="right"),
        Text(number(td.max_abs), justify="right"),
        Text(number(td.cosine, 6), justify="right"),
        Text(td.status, style=style),
    )


def value_cells(vd: ValueDiff) -> tuple[Text, ...]:
    """The cells of a diff-table row for a changed plain value (lr, step ...): the change goes last,
    where its width cannot push the tensors' numbers out of an 80-column view."""
    change = f"{_short(vd.a)} → {_short(vd.b)}" if vd.status == "changed" else vd.status
    return (Text(vd.name, style="cyan"), Text("value", style="cyan", justify="right"), Text(""), Text(""), Text(""),
            Text(change, style="cyan"))


def render_value_side(name: str, step: int, value: Any) -> Text:
    t = Text()
    t.append(f"step_{step}\n", style="bold")
    t.append(f"{name}\n", style="dim")
    t.append(repr(value), style="cyan")
    return t


def _short(value: Any, n: int = 16) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 1] + "…"
