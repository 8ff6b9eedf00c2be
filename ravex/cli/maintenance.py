"""``ravex validate`` and ``ravex gc``: checking a store, and collecting what no kept step needs."""

from __future__ import annotations

import argparse

from ravex.format.maintenance.gc import DEFAULT_GRACE_SECONDS, GCReport
from ravex.format.reports.validate import Finding
from ravex.tui.formatting import one_line

from .common import (
    EXIT_FINDING,
    EXIT_OK,
    UsageError,
    Verb,
    console,
    json_argument,
    open_store_for,
    positive_int,
    print_json,
    progress_bar,
    store_argument,
)


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a store; exit 1 on an error (damage a step reads), 0 on warnings alone (damage no step
    reads, orphans, incomplete steps: what crashes leave and GC collects)."""
    from ravex.format.reports.validate import validate

    store = open_store_for(args.store)
    with progress_bar("validate --full" if args.full else "validate") as progress:
        report = validate(store, full=args.full, progress=progress)
    if args.json:
        print_json(report.to_json())
        return EXIT_OK if report.ok else EXIT_FINDING
    out = console()
    errors = [f for f in report.findings if f.severity == "error"]
    warnings = [f for f in report.findings if f.severity != "error"]
    orphans = sum(f.kind == "orphan_object" for f in warnings)
    if report.findings:
        shown = errors + _orphans_folded(warnings, orphans)
        from rich.table import Table

        table = Table()
        for col in ("severity", "kind", "step", "rank", "tensor", "chunk", "message"):
            table.add_column(col, overflow="fold")
        for f in shown:
            table.add_row(
                f"[red]{f.severity}[/]" if f.severity == "error" else f"[yellow]{f.severity}[/]", f.kind,
                _opt(f.step) if f.timeline is None else f"{f.timeline}@{f.step}", _opt(f.rank),
                f.tensor or "", f.chunk or "", f.message,
            )
        out.print(table)
    checked = f"{len(report.steps_checked)} steps"
    counted = f"{len(warnings)} warnings" + (f", {orphans} of them orphan objects" if orphans > ORPHAN_ROWS else "")
    if args.full:
        checked += f", {report.objects_checked} objects rehashed"
    if report.ok:
        out.print(f"[green]ok[/]: {report.url} ({checked}; {counted})")
        return EXIT_OK
    out.print(f"[red]{len(errors)} errors[/] in {report.url} ({checked}; {counted})")
    return EXIT_FINDING


#: More orphan objects than this are one row of the table (``--json`` lists each).
ORPHAN_ROWS = 3


def _orphans_folded(warnings: list[Finding], orphans: int) -> list[Finding]:
    """``warnings`` with its ``orphans`` orphan objects as one row where there are many: every
    run's store holds some for an hour (the objects of the steps retention removed wait out GC's
    grace), and a row each buried whatever else the table said."""
    if orphans <= ORPHAN_ROWS:
        return warnings
    folded = Finding("orphan_object", (
        f"{orphans} objects are named by no manifest: garbage, not damage (the objects of steps "
        f"retention removed wait out gc's {DEFAULT_GRACE_SECONDS / 60:.0f} min grace; a killed commit "
        f"leaves some too). `ravex gc` removes them; `--json` lists each"))
    return [f for f in warnings if f.kind != "orphan_object"] + [folded]


def _opt(v: int | None) -> str:
    return "" if v is None else str(v)


def cmd_gc(args: argparse.Namespace) -> int:
    """Apply retention and delete objects no kept step names."""
    store = open_store_for(args.store)
    with progress_bar("gc (dry run)" if args.dry_run else "gc") as progress:
        progress(0, 0, "listing")
        try:
            report = store.gc(
                keep_last=args.keep_last, keep_every=args.keep_every, grace_seconds=args.grace, dry_run=args.dry_run
            )
        except ValueError as exc:
            raise UsageError(one_line(exc)) from None
    if args.json:
        print_json(report.to_json())
        return EXIT_OK
    from ravex.tui.formatting import human_bytes

    verb = "would delete" if args.dry_run else "deleted"
    console().print(
        f"{store.url}: kept {len(report.kept_steps)} steps, {verb} {len(report.deleted_steps)} steps "
        f"{_step_list(report.deleted_steps)}and {report.deleted_objects} objects "
        f"({human_bytes(report.deleted_bytes)}); "
        f"{report.young_unreferenced} unreferenced objects are younger than the grace period"
        f"{_repack_line(report, args.dry_run)}",
        soft_wrap=True,
    )
    if report.skipped_objects_because:
        kept = f"kept {_step_list(report.unreadable_steps)}and " if report.unreadable_steps else ""
        console().print(
            f"[yellow]ravex gc: {kept}deleted no object: {report.skipped_objects_because}; `ravex validate` "
            "names the damage, or upgrade ravex if a newer version wrote it[/]", soft_wrap=True)
    return EXIT_OK


def _repack_line(report: GCReport, dry_run: bool) -> str:
    """What GC's repack did (spec §14, 3b): packs whose live chunks were copied, and the share of
    the object bytes the kept steps do not read, before and after."""
    from ravex.tui.formatting import human_bytes

    r = report.repack
    if r is None or not r.total_bytes:
        return ""
    share = f"{r.dead_bytes_after / r.total_bytes:.0%} of object bytes read by no kept step"
    if not r.packs:
        line = f"; {share}"
    else:
        verb = "would repack" if dry_run else "repacked"
        line = (f"; {verb} {r.packs} packs ({human_bytes(r.copied_bytes)} copied, {r.manifests_rewritten} "
                f"manifests rewritten): {share} (was {r.dead_bytes_before / r.total_bytes:.0%})")
    if report.retired_waiting:
        line += f"; {report.retired_waiting} repacked packs wait for the grace period"
    return line


def _step_list(steps: list[int | str]) -> str:
    if not steps:
        return ""
    shown = ", ".join(f"step_{s}" if isinstance(s, int) else str(s) for s in steps[:8])
    shown += ", ..." if len(steps) > 8 else ""
    return f"({shown}) "


def _validate_arguments(p: argparse.ArgumentParser) -> None:
    store_argument(p)
    p.add_argument("--full", action="store_true",
                   help="also rehash every object and decode every inline chunk, naming the damaged chunks")
    json_argument(p)


def _gc_arguments(p: argparse.ArgumentParser) -> None:
    store_argument(p)
    p.add_argument("--keep-last", type=positive_int, default=None, metavar="N", help="keep the newest N steps")
    p.add_argument("--keep-every", type=positive_int, default=None, metavar="K",
                   help="keep every step divisible by K")
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_SECONDS, metavar="SECONDS",
                   help=f"keep unreferenced objects younger than this (default {DEFAULT_GRACE_SECONDS:g})")
    p.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")
    json_argument(p)


VERBS = (Verb("validate", cmd_validate, _validate_arguments), Verb("gc", cmd_gc, _gc_arguments))
