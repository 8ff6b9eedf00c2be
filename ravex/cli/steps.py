"""``ravex ls`` and ``ravex show``: the steps of a store, and what one step holds.

Both read the manifests only, except ``show TENSOR``, which reads that tensor for its statistics.
"""

from __future__ import annotations

import argparse
import difflib
import math
from typing import TYPE_CHECKING, Any

from .common import (
    EXIT_OK,
    UsageError,
    Verb,
    console,
    json_argument,
    open_step_for,
    open_store_for,
    positive_int,
    print_json,
    progress_bar,
    step_argument,
    step_name,
    step_ref,
    store_argument,
)

if TYPE_CHECKING:
    from rich.console import Console

    from ravex.format import StepReader
    from ravex.format.history.runs import ResumeCheck, RunRecord
    from ravex.format.reports.summary import StepSummary, TensorStats


def cmd_ls(args: argparse.Namespace) -> int:
    """List steps: time, training loss, ranks, tensors, logical bytes, new bytes written, reuse."""
    from ravex.format.history.timelines import MAIN
    from ravex.format.reports.summary import summarize_steps

    from .timelines import timeline_tree

    store = open_store_for(args.store)
    with progress_bar("listing") as progress:
        rows = list(summarize_steps(store, progress))
        tree = timeline_tree(store, rows)  # timelines (spec §19) and tags
    checks = _resume_checks(store, [r for branch in tree.branches() for r in branch.rows] or rows)
    if args.json:  # "steps": main's, as before timelines; "timelines": every timeline's own steps
        print_json({"url": store.url, "steps": [r.to_json() for r in rows], **tree.to_json(),
                    "resumes": [c.to_json() for c in checks.values()]})
        return EXIT_OK
    out = console()
    if not rows and not tree.interesting:
        out.print(f"{store.url}: no steps yet", soft_wrap=True)
        return EXIT_OK
    for branch in tree.branches():
        title = (store.url if branch.name == MAIN
                 else f"timeline {branch.name} (a history of its own, no parent)" if branch.parent is None
                 else f"timeline {branch.name} (forked at {branch.parent}@{branch.fork_step})")
        if branch.rows:
            _print_steps(out, title, branch.rows, tree.tagged(branch.name), checks)
    if tree.interesting:
        tree.print(out)
    return EXIT_OK


def _resume_checks(store: Any, rows: list[StepSummary]) -> dict[int, ResumeCheck]:
    """How each resume from a listed step checked itself (spec §22): from the records of the runs
    that wrote the listed steps (one read per run), by the step resumed from."""
    from ravex.format.history.runs import read_run

    checks: dict[int, ResumeCheck] = {}
    for run in sorted({r.run for r in rows if r.run}):
        try:
            record = read_run(store.storage, run)
        except Exception:  # a record is informative; `ravex show` names what is wrong with it
            continue
        if record is not None and record.resume is not None:
            checks[record.resume.from_step] = record.resume
    return checks


def _print_steps(out: Console, title: str, rows: list[StepSummary], tags: dict[int, list[str]],
                 checks: dict[int, ResumeCheck]) -> None:
    """One timeline's steps as a table; ``tags``: the tags' names by the step they name; ``checks``:
    how a resume from a step checked itself, by that step."""
    from rich.table import Table

    from ravex.tui.formatting import human_bytes, number, percent, short_time

    table = Table(title=title, title_justify="left")
    columns = [("step", "right"), ("time", "left"), ("loss", "right"), ("ranks", "right"), ("tensors", "right"),
               ("logical", "right"), ("new", "right"), ("reused", "right")]
    problems = any(not r.complete for r in rows)  # a column of its own only when some step has one
    resumed = {r.step: checks[r.step] for r in rows if r.step in checks}
    if tags:
        columns.append(("tags", "left"))
    if resumed:
        columns.append(("resume", "left"))
    if problems:
        columns.append(("problem", "left"))
    for col, justify in columns:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        ranks = f"{len(r.ranks)}/{r.world_size}" if r.world_size else str(len(r.ranks))
        cells = [f"step_{r.step}", short_time(r.created_at), number(r.loss, 6), ranks, str(r.tensors),
                 human_bytes(r.logical_bytes),
                 human_bytes(r.new_bytes), percent(r.reuse_ratio)]
        if tags:
            cells.append(f"[cyan]{', '.join(tags.get(r.step, []))}[/]")
        if resumed:
            cells.append(_verdict_cell(resumed.get(r.step)))
        if problems:
            cells.append("" if r.complete else f"[yellow]incomplete: {r.problem}[/]")
        table.add_row(*cells, style=None if r.complete else "dim")
    out.print(table)


def _verdict_cell(check: ResumeCheck | None) -> str:
    """``verified 11-13``, ``DIVERGED at 11`` (red), ``not verified``: a resume from this step."""
    if check is None:
        return ""
    if check.verdict == "verified":
        return f"[green]verified {check.steps[0]}-{check.steps[-1]}[/]"
    if check.verdict == "diverged":
        return f"[bold red]DIVERGED at {check.diverged_at}[/]"
    return "[yellow]not verified[/]"


def _find_tensors(reader: StepReader, names: list[str]) -> list[str]:
    from ravex.format.steps.sections import named, object_names
    from ravex.tui.formatting import display_path

    by_display = {display_path(p): p for p in reader.arrays}
    scripts = object_names(reader.manifests[0].tree)
    by_display.update({named(d, scripts): p for d, p in list(by_display.items())})  # models/netG/...
    found: list[str] = []
    for name in names:
        name = name.strip("/")
        if name in reader.arrays:
            found.append(name)
        elif name in by_display:
            found.append(by_display[name])
        else:
            under = [p for d, p in by_display.items() if d.startswith(name + "/")]
            if not under:
                close = difflib.get_close_matches(name, list(by_display), n=3)
                hint = (f"; did you mean {', '.join(close)}?" if close
                        else f"; `ravex show {step_name(reader)}` lists them")
                raise UsageError(f"step {step_ref(reader)} has no tensor {name!r}{hint}")
            found.extend(under)
    return found


def cmd_show(args: argparse.Namespace) -> int:
    """Show a step's tree, or tensors' metadata, statistics and histogram."""
    from ravex.format.reports.diff import step_values
    from ravex.format.reports.summary import dtype_name, read_tensor_stats, step_loss
    from ravex.tui.formatting import display_path

    reader = open_step_for(args.step)
    if not args.tensors:
        tensors = sorted(reader.arrays)
        values = step_values(reader)
        record, record_problem = _run_record(reader)
        tags = _tags_of(reader)
        if args.json:
            loss = step_loss(reader.metadata)
            print_json({
                "url": reader.store.url, "step": reader.step, "timeline": reader.store.timeline.name,
                "world_size": reader.world_size,
                "metadata": reader.metadata,
                "loss": loss if loss is None or math.isfinite(loss) else repr(loss),
                "run": reader.manifests[0].run,
                "ranks": _ranks_json(reader),
                "run_record": record.to_json() if record is not None else None,
                "tags": tags,
                "tensors": [_tensor_json(reader, p) for p in tensors],
                "values": values,
            })
            return EXIT_OK
        _print_run(reader, record, record_problem, tags)
        _print_tree(reader, tensors, values)
        return EXIT_OK
    all_values = step_values(reader)
    values = {n.strip("/"): all_values[n.strip("/")] for n in args.tensors if n.strip("/") in all_values}
    paths = _find_tensors(reader, [n for n in args.tensors if n.strip("/") not in values])
    results = []
    with progress_bar("statistics") as progress:
        for i, path in enumerate(paths):
            progress(i, len(paths), display_path(path))
            results.append((path, read_tensor_stats(reader, path, bins=args.bins)))
    if args.json:
        print_json({
            "url": reader.store.url, "step": reader.step, "timeline": reader.store.timeline.name,
            "tensors": [dict(_tensor_json(reader, p), stats=s.to_json()) for p, s in results],
            "values": values,
        })
        return EXIT_OK
    out = console()
    for name, value in values.items():
        out.print(f"{step_name(reader)}  {name} = [cyan]{value!r}[/]", soft_wrap=True)
    for path, stats in results:
        _print_tensor(out, reader, path, stats, dtype_name(reader.arrays[path]))
    return EXIT_OK


def _ranks_json(reader: StepReader) -> list[dict[str, Any]]:
    """Each rank's own figures (the log prints one line for the job: its slowest stall and
    the sums): its stall as recorded in its manifest's metadata, and its commit's bytes."""
    from ravex.saving.logline import STALL_KEY

    out = []
    for m in reader.manifests:
        stall = m.metadata.get(STALL_KEY)
        out.append({"rank": m.rank, "stall_ms": float(stall) if stall is not None else None,
                    **{k: m.stats.get(k) for k in ("new_bytes", "reused_bytes", "logical_bytes")}})
    return out


def _run_record(reader: StepReader) -> tuple[RunRecord | None, str | None]:
    """The record of the run that wrote the step, or why there is none to show."""
    from ravex.format.errors import RavexError
    from ravex.format.history.runs import read_run

    try:
        record = read_run(reader.store.storage, reader.manifests[0].run)
    except RavexError as exc:
        return None, str(exc)
    return record, None if record is not None else "no run record (a store written before 1.1)"


def _tags_of(reader: StepReader) -> list[str]:
    """The names of the tags on the step ``reader`` reads (spec §19)."""
    from ravex.format.history.tags import read_tags

    return sorted(t.name for t in read_tags(reader.store.storage).values()
                  if (t.timeline, t.step) == (reader.store.timeline.name, reader.step))


def _print_run(reader: StepReader, record: RunRecord | None, problem: str | None, tags: list[str]) -> None:
    """The step's loss, its tags and what the run that wrote it was: a few lines above the tree."""
    from ravex.format.reports.summary import step_loss
    from ravex.tui.formatting import number, run_lines

    out = console()
    out.print(f"[bold]{step_name(reader)}[/]  loss [cyan]{number(step_loss(reader.metadata), 8)}[/]  "
              f"run {reader.manifests[0].run}" + (f"  [cyan]tags: {', '.join(tags)}[/]" if tags else ""),
              soft_wrap=True)
    if reader.world_size > 1:
        from ravex.saving.logline import size

        for r in _ranks_json(reader):
            stall = "-" if r["stall_ms"] is None else f"{r['stall_ms']:.1f}"
            out.print(f"  rank {r['rank']}: stall {stall} ms, {size(r['new_bytes'] or 0)} new, "
                      f"{size(r['reused_bytes'] or 0)} reused", soft_wrap=True, highlight=False)
    if record is None:
        out.print(f"  [dim]{problem}[/]", soft_wrap=True)
        return
    for line in run_lines(record):
        out.print(f"  {line}", soft_wrap=True, markup=False, highlight=False)


def _tensor_json(reader: StepReader, path: str) -> dict[str, Any]:
    from ravex.format.reports.summary import dtype_name
    from ravex.format.steps.sections import is_bookkeeping, named, object_names
    from ravex.tui.formatting import display_path

    e = reader.arrays[path]
    itemsize = max(1, _itemsize(e))
    return {
        "path": path, "name": named(display_path(path), object_names(reader.manifests[0].tree)),
        "bookkeeping": is_bookkeeping(path), "shape": list(e.shape), "dtype": dtype_name(e),
        "chunk_shape": list(e.chunk_shape), "chunks": len(e.chunks),
        "logical_bytes": math.prod(e.shape) * itemsize, "stored_bytes": e.stored_bytes(),
    }


def _itemsize(entry: Any) -> int:
    from ravex.format.objects.dtypes import data_type

    try:
        return data_type(entry.data_type).itemsize
    except Exception:
        return 0


def _print_tree(reader: StepReader, tensors: list[str], values: dict[str, Any]) -> None:
    from rich.tree import Tree

    from ravex.format.reports.summary import dtype_name
    from ravex.format.steps.sections import is_bookkeeping, named, object_names
    from ravex.tui.formatting import display_path, human_bytes, shape_text

    out = console()
    kept = sum(1 for p in tensors if is_bookkeeping(p))
    root = Tree(f"[bold]{reader.store.url}@{step_name(reader)}[/]  ({reader.world_size} rank(s), "
                f"{len(tensors) - kept} tensors" + (f", {kept} of RNG and loader state)" if kept else ")"))
    scripts = object_names(reader.manifests[0].tree)
    nodes: dict[str, Any] = {"": root}

    def node_for(parts: list[str]) -> Any:
        key = "/".join(parts)
        if key not in nodes:
            nodes[key] = node_for(parts[:-1]).add(f"[bold]{parts[-1]}[/]")
        return nodes[key]

    leaves: list[tuple[str, str]] = []
    for p in tensors:
        e = reader.arrays[p]
        leaves.append((named(display_path(p), scripts), f"{shape_text(e.shape)} {dtype_name(e)}  "
                       f"[dim]{len(e.chunks)} chunks, {human_bytes(e.stored_bytes())} stored[/]"))
    for name, value in values.items():
        leaves.append((named(name, scripts), f"[cyan]{value!r}[/]"))
    for name, text in sorted(leaves):
        parts = name.split("/")
        node_for(parts[:-1]).add(f"{parts[-1]}  {text}")
    out.print(root)


def _print_tensor(out: Console, reader: StepReader, path: str, stats: TensorStats, dtype: str) -> None:
    from rich.table import Table

    from ravex.tui.formatting import display_path, histogram_lines, human_bytes, number, shape_text

    e = reader.arrays[path]
    table = Table(title=f"{step_name(reader)}  {display_path(path)}", title_justify="left", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    logical = math.prod(e.shape) * _itemsize(e)
    rows = [
        ("shape", shape_text(e.shape)), ("dtype", dtype),
        ("chunks", f"{len(e.chunks)} of {shape_text(e.chunk_shape)}"),
        ("stored / logical", f"{human_bytes(e.stored_bytes())} / {human_bytes(logical)}"),
        ("min", number(stats.min)), ("max", number(stats.max)), ("mean", number(stats.mean)),
        ("std", number(stats.std)), ("L2", number(stats.l2)),
        ("NaN / Inf", f"{stats.nan} / {stats.inf}"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    out.print(table)
    for line in histogram_lines(stats.hist_counts, stats.hist_edges, width=40):
        out.print("  " + line)


def _ls_arguments(p: argparse.ArgumentParser) -> None:
    store_argument(p)
    json_argument(p)


def _show_arguments(p: argparse.ArgumentParser) -> None:
    step_argument(p)
    p.add_argument("tensors", nargs="*", metavar="TENSOR", help="tensor paths such as model/layer.0.weight")
    p.add_argument("--bins", type=positive_int, default=20, help="histogram bins (default 20)")
    json_argument(p)


VERBS = (Verb("ls", cmd_ls, _ls_arguments), Verb("show", cmd_show, _show_arguments))
