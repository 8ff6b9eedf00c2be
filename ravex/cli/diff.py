"""``ravex diff``: two steps compared tensor by tensor, through :func:`ravex.format.reports.diff.diff`."""

from __future__ import annotations

import argparse

from ravex.format.reports.diff import StepDiff

from .common import (
    EXIT_OK,
    UsageError,
    Verb,
    console,
    json_argument,
    open_step_for,
    open_store_for,
    print_json,
    progress_bar,
    split_step,
    step_ref,
)


def cmd_diff(args: argparse.Namespace) -> int:
    """Compare two steps tensor by tensor; unchanged chunks are never read. RNG streams and
    loader positions are listed apart, after the training tensors and values."""
    from ravex.format.reports.diff import change_order, diff
    from ravex.format.steps.sections import named, object_names
    from ravex.tui.formatting import display_path

    if args.stray is not None:
        raise UsageError(f"diff takes two steps, A and B, and got three arguments: a store goes into A "
                         f"({args.a}@{args.b} {args.stray}); a bare B is read from A's store")
    store_a = open_store_for(split_step(args.a)[0])
    a = open_step_for(args.a, store_a)
    b = open_step_for(args.b, store_a if split_step(args.b)[0] is None else None)  # a bare step: A's store
    with progress_bar("diff") as progress:
        result = diff(a, b, stats=not args.no_stats, progress=progress)
    tensors = sorted(result.tensors, key=change_order)
    if not args.all:
        tensors = [t for t in tensors if t.status != "unchanged"]
    if args.threshold is not None:
        tensors = [t for t in tensors if t.status != "changed" or t.rel_l2 is None or not t.rel_l2 < args.threshold]
    values = [v for v in result.values if args.all or v.status != "unchanged"]
    kept = [t for t in result.bookkeeping if args.all or t.status != "unchanged"]
    kept_values = [v for v in result.bookkeeping_values if args.all or v.status != "unchanged"]
    names = {**object_names(a.manifests[0].tree), **object_names(b.manifests[0].tree)}

    def shown(name: str) -> str:
        return named(display_path(name), names)

    result.a, result.b = f"{a.store.url}@{step_ref(a)}", f"{b.store.url}@{step_ref(b)}"  # with their timelines
    if args.json:
        doc = result.to_json()
        doc["tensors"] = [t.to_json() for t in tensors]
        doc["values"] = [v.to_json() for v in values]
        doc["bookkeeping"] = [t.to_json() for t in kept]
        doc["bookkeeping_values"] = [v.to_json() for v in kept_values]
        doc["summary"] = _diff_summary(result)
        print_json(doc)
        return EXIT_OK
    from rich.table import Table

    from ravex.tui.formatting import change_style, number, shape_text

    out = console()
    summary = _diff_summary(result)
    out.print(f"[bold]{result.a}[/] → [bold]{result.b}[/]: " + ", ".join(f"{n} {k}" for k, n in summary.items()))
    if tensors:
        table = Table()
        for col, justify in (("tensor", "left"), ("status", "left"), ("chunks", "right"), ("shape", "right"),
                             ("max |a-b|", "right"), ("‖a-b‖/‖a‖", "right"), ("cosine", "right")):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for t in tensors:
            table.add_row(
                shown(t.name), t.status, f"{t.chunks_changed}/{t.chunks_total}", shape_text(t.shape),
                number(t.max_abs), number(t.rel_l2), number(t.cosine, 6), style=change_style(t.rel_l2, t.status),
            )
        out.print(table)
    if values:
        vt = Table(title="values", title_justify="left")
        for col in ("name", "status", "a", "b"):
            vt.add_column(col)
        for v in values:
            vt.add_row(shown(v.name), v.status, repr(v.a), repr(v.b))
        out.print(vt)
    if kept or kept_values:
        bt = Table(title="RNG and loader state", title_justify="left")
        for col in ("name", "status", "change"):
            bt.add_column(col)
        for t in kept:
            bt.add_row(display_path(t.name), t.status, f"{t.chunks_changed}/{t.chunks_total} chunks")
        for v in kept_values:
            bt.add_row(v.name, v.status, f"{_short(v.a)} → {_short(v.b)}")
        out.print(bt)
    return EXIT_OK


def _short(value: object, width: int = 40) -> str:
    """A value's repr cut to ``width`` (an RNG state is hundreds of numbers)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _diff_summary(result: StepDiff) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in result.tensors:
        counts[t.status] = counts.get(t.status, 0) + 1
    return counts


def _diff_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="reference step (step_100, latest, TIMELINE@100, STORE@step_100)")
    p.add_argument("b", metavar="B",
                   help="the step to compare with A (a bare step is in A's store, on its current timeline)")
    p.add_argument("stray", nargs="?", help=argparse.SUPPRESS)  # `ravex diff STORE 60 72`: named in an error
    p.add_argument("--threshold", type=float, default=None,
                   help="list only changed tensors with ‖a-b‖/‖a‖ at least this")
    p.add_argument("--all", action="store_true", help="also list unchanged tensors and values")
    p.add_argument("--no-stats", action="store_true", help="only what the manifests tell (read no tensor)")
    json_argument(p)


VERBS = (Verb("diff", cmd_diff, _diff_arguments),)
