"""The inspector verbs of the ``ravex`` command: ls, show, diff, validate, gc, export, inspect.

They read through :mod:`ravex.format` only (never the runtime) and import nothing heavy until a
verb runs: no torch, and Textual only for ``inspect``.

Naming: ``STORE`` defaults to ``$RAVEX_STORAGE``, else the ``storage`` of ``./ravex.yaml``, else
``./checkpoints``. A step is ``step_100``, ``100``, ``latest``, or ``STORE@step_100`` to name
another store. Exit status: 0 ok, 1 a finding (a failed validation), 2 bad usage or an
unreadable store, with a one-line error that names the fix.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ravex.errors import ConfigError  # cheap: ravex.format loads its errors only

if TYPE_CHECKING:
    from rich.console import Console

    from ravex.format import CheckpointStore, StepReader

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2
_STEP = re.compile(r"^(latest|step_\d+|\d+)$")

VERBS = ("ls", "show", "diff", "validate", "gc", "export", "inspect")


class UsageError(Exception):
    """Bad usage or an unreadable store: printed as one line, exit status 2."""


# ---- naming a store and a step ------------------------------------------------------------


def default_store(cwd: str | None = None, env: dict[str, str] | None = None) -> tuple[str, dict | None]:
    """The store a verb uses when none is named, and its fsspec ``storage_options``.

    Read by the runtime's own configuration reader (:meth:`ravex.runtime.config.RavexConfig.load`), so
    the CLI and training agree: ``$RAVEX_STORAGE`` overrides the ``storage`` of ``./ravex.yaml``
    (or ``$RAVEX_CONFIG``), ``./checkpoints`` is the default, and a malformed file raises the
    same one-line :class:`~ravex.errors.ConfigError` that ``ravex status`` prints.
    """
    from ravex.runtime.config import RavexConfig

    cwd = cwd or os.getcwd()
    storage = RavexConfig.load(environ=os.environ if env is None else env, cwd=cwd).storage
    if storage.is_remote:
        return storage.url, storage.storage_options() or None
    url = os.path.expanduser(storage.url)
    if "://" not in url and not os.path.isabs(url):
        url = os.path.normpath(os.path.join(cwd, url))
    return url, None


def split_step(spec: str) -> tuple[str | None, str]:
    """``STORE@step_100`` -> ``(STORE, "step_100")``; ``step_100`` -> ``(None, "step_100")``."""
    if "@" in spec:
        store, step = spec.rsplit("@", 1)
        if _STEP.match(step) and store:
            return store, step
        raise UsageError(f"{spec!r}: after '@' comes a step (step_100, 100 or latest)")
    if not _STEP.match(spec):
        raise UsageError(f"{spec!r} is not a step; use step_100, 100, latest or STORE@step_100")
    return None, spec


def open_store_for(url: str | None) -> CheckpointStore:
    """Open the named store (or the default one); every failure becomes a one-line UsageError."""
    from ravex.format import RavexError, StoreNotFoundError, open_store

    opts = None
    named = url is not None
    if url is None:
        url, opts = default_store()
    elif "://" not in url:
        url = os.path.abspath(os.path.expanduser(url))
    try:
        return open_store(url, storage_options=opts)
    except StoreNotFoundError:
        fix = ("check the path or URL" if named
               else "pass STORE, or set storage in ./ravex.yaml or $RAVEX_STORAGE")
        raise UsageError(f"{url!r} is not a Ravex store (it has no ravex.json); {fix}") from None
    except RavexError as exc:
        raise UsageError(_one_line(exc)) from None
    except (OSError, ValueError, ImportError) as exc:
        raise UsageError(f"cannot open store {url!r}: {_one_line(exc)}; check the path or URL") from None


def open_step_for(spec: str, default: CheckpointStore | None = None) -> StepReader:
    """A reader for ``step_100`` / ``100`` / ``latest`` / ``STORE@...``."""
    from ravex.format import RavexError

    store_url, step = split_step(spec)
    store = default if store_url is None and default is not None else open_store_for(store_url)
    try:
        return store.open_step(step)
    except RavexError as exc:
        raise UsageError(_one_line(exc)) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# ---- output ---------------------------------------------------------------------------------


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(_jsonable(doc), indent=2, allow_nan=False) + "\n")


@contextlib.contextmanager
def _progress(label: str) -> Iterator[Callable[[int, int, str], None]]:
    """A ``progress(done, total, what)`` callback drawing a bar on stderr, only on a terminal."""
    if not sys.stderr.isatty():
        yield lambda done, total, what: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[what]}", style="dim"), console=_console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task(label, total=None, what="")

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total or None, what=what[-40:])

        yield update


# ---- verbs ------------------------------------------------------------------------------------


def cmd_ls(args: argparse.Namespace) -> int:
    """List steps: time, ranks, tensors, logical bytes, new bytes written, reuse."""
    from ravex.format.inspect import summarize_steps
    from ravex.tui.formatting import human_bytes, percent, short_time

    store = open_store_for(args.store)
    with _progress("listing") as progress:
        rows = list(summarize_steps(store, progress))
    if args.json:
        _print_json({"url": store.url, "steps": [r.to_json() for r in rows]})
        return EXIT_OK
    from rich.table import Table

    console = _console()
    if not rows:
        console.print(f"{store.url}: no steps yet", soft_wrap=True)
        return EXIT_OK
    table = Table(title=store.url, title_justify="left")
    for col, justify in (("step", "right"), ("time", "left"), ("ranks", "right"), ("tensors", "right"),
                         ("logical", "right"), ("new", "right"), ("reused", "right"), ("", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        ranks = f"{len(r.ranks)}/{r.world_size}" if r.world_size else str(len(r.ranks))
        note = "" if r.complete else f"[yellow]incomplete: {r.problem}[/]"
        table.add_row(
            f"step_{r.step}", short_time(r.created_at), ranks, str(r.tensors), human_bytes(r.logical_bytes),
            human_bytes(r.new_bytes), percent(r.reuse_ratio), note, style=None if r.complete else "dim",
        )
    console.print(table)
    return EXIT_OK


def _find_tensors(reader: StepReader, names: list[str]) -> list[str]:
    from ravex.format.inspect import display_path

    by_display = {display_path(p): p for p in reader.arrays}
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
                        else f"; `ravex show step_{reader.step}` lists them")
                raise UsageError(f"step {reader.step} has no tensor {name!r}{hint}")
            found.extend(under)
    return found


def cmd_show(args: argparse.Namespace) -> int:
    """Show a step's tree, or tensors' metadata, statistics and histogram."""
    from ravex.format.inspect import display_path, dtype_name, read_tensor_stats, step_values

    reader = open_step_for(args.step)
    if not args.tensors:
        tensors = sorted(reader.arrays)
        values = step_values(reader)
        if args.json:
            _print_json({
                "url": reader.store.url, "step": reader.step, "world_size": reader.world_size,
                "metadata": reader.metadata,
                "tensors": [_tensor_json(reader, p) for p in tensors],
                "values": values,
            })
            return EXIT_OK
        _print_tree(reader, tensors, values)
        return EXIT_OK
    all_values = step_values(reader)
    values = {n.strip("/"): all_values[n.strip("/")] for n in args.tensors if n.strip("/") in all_values}
    paths = _find_tensors(reader, [n for n in args.tensors if n.strip("/") not in values])
    results = []
    with _progress("statistics") as progress:
        for i, path in enumerate(paths):
            progress(i, len(paths), display_path(path))
            results.append((path, read_tensor_stats(reader, path, bins=args.bins)))
    if args.json:
        _print_json({
            "url": reader.store.url, "step": reader.step,
            "tensors": [dict(_tensor_json(reader, p), stats=s.to_json()) for p, s in results],
            "values": values,
        })
        return EXIT_OK
    console = _console()
    for name, value in values.items():
        console.print(f"step_{reader.step}  {name} = [cyan]{value!r}[/]", soft_wrap=True)
    for path, stats in results:
        _print_tensor(console, reader, path, stats, dtype_name(reader.arrays[path]))
    return EXIT_OK


def _tensor_json(reader: StepReader, path: str) -> dict[str, Any]:
    from ravex.format.inspect import display_path, dtype_name

    e = reader.arrays[path]
    itemsize = max(1, _itemsize(e))
    return {
        "path": path, "name": display_path(path), "shape": list(e.shape), "dtype": dtype_name(e),
        "chunk_shape": list(e.chunk_shape), "chunks": len(e.chunks),
        "logical_bytes": math.prod(e.shape) * itemsize, "stored_bytes": e.stored_bytes(),
    }


def _itemsize(entry: Any) -> int:
    from ravex.format.dtypes import data_type

    try:
        return data_type(entry.data_type).itemsize
    except Exception:
        return 0


def _print_tree(reader: StepReader, tensors: list[str], values: dict[str, Any]) -> None:
    from rich.tree import Tree

    from ravex.format.inspect import display_path, dtype_name
    from ravex.tui.formatting import human_bytes, shape_text

    console = _console()
    root = Tree(f"[bold]{reader.store.url}@step_{reader.step}[/]  "
                f"({reader.world_size} rank(s), {len(tensors)} tensors)")
    nodes: dict[str, Any] = {"": root}

    def node_for(parts: list[str]) -> Any:
        key = "/".join(parts)
        if key not in nodes:
            nodes[key] = node_for(parts[:-1]).add(f"[bold]{parts[-1]}[/]")
        return nodes[key]

    leaves: list[tuple[str, str]] = []
    for p in tensors:
        e = reader.arrays[p]
        leaves.append((display_path(p), f"{shape_text(e.shape)} {dtype_name(e)}  "
                       f"[dim]{len(e.chunks)} chunks, {human_bytes(e.stored_bytes())} stored[/]"))
    for name, value in values.items():
        leaves.append((name, f"[cyan]{value!r}[/]"))
    for name, text in sorted(leaves):
        parts = name.split("/")
        node_for(parts[:-1]).add(f"{parts[-1]}  {text}")
    console.print(root)


def _print_tensor(console: Console, reader: StepReader, path: str, stats: Any, dtype: str) -> None:
    from rich.table import Table

    from ravex.format.inspect import display_path
    from ravex.tui.formatting import histogram_lines, human_bytes, number, shape_text

    e = reader.arrays[path]
    table = Table(title=f"step_{reader.step}  {display_path(path)}", title_justify="left", show_header=False)
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
    console.print(table)
    for line in histogram_lines(stats.hist_counts, stats.hist_edges, width=40):
        console.print("  " + line)


def cmd_diff(args: argparse.Namespace) -> int:
    """Compare two steps tensor by tensor; unchanged chunks are never read."""
    from ravex.format.inspect import change_order, diff_steps, display_path

    a = open_step_for(args.a)
    b = open_step_for(args.b, default=a.store if split_step(args.b)[0] is None else None)
    with _progress("diff") as progress:
        result = diff_steps(a, b, stats=not args.no_stats, progress=progress)
    tensors = sorted(result.tensors, key=change_order)
    if not args.all:
        tensors = [t for t in tensors if t.status != "unchanged"]
    if args.threshold is not None:
        tensors = [t for t in tensors if t.status != "changed" or t.rel_l2 is None or not t.rel_l2 < args.threshold]
    values = [v for v in result.values if args.all or v.status != "unchanged"]
    if args.json:
        doc = result.to_json()
        doc["tensors"] = [t.to_json() for t in tensors]
        doc["values"] = [v.to_json() for v in values]
        doc["summary"] = _diff_summary(result)
        _print_json(doc)
        return EXIT_OK
    from rich.table import Table

    from ravex.tui.formatting import change_style, number, shape_text

    console = _console()
    summary = _diff_summary(result)
    console.print(f"[bold]{result.a}[/] → [bold]{result.b}[/]: " + ", ".join(f"{n} {k}" for k, n in summary.items()))
    if tensors:
        table = Table()
        for col, justify in (("tensor", "left"), ("status", "left"), ("chunks", "right"), ("shape", "right"),
                             ("max |a-b|", "right"), ("‖a-b‖/‖a‖", "right"), ("cosine", "right")):
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for t in tensors:
            table.add_row(
                display_path(t.name), t.status, f"{t.chunks_changed}/{t.chunks_total}", shape_text(t.shape),
                number(t.max_abs), number(t.rel_l2), number(t.cosine, 6), style=change_style(t.rel_l2, t.status),
            )
        console.print(table)
    if values:
        vt = Table(title="values", title_justify="left")
        for col in ("name", "status", "a", "b"):
            vt.add_column(col)
        for v in values:
            vt.add_row(v.name, v.status, repr(v.a), repr(v.b))
        console.print(vt)
    return EXIT_OK


def _diff_summary(result: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in result.tensors:
        counts[t.status] = counts.get(t.status, 0) + 1
    return counts


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a store; exit 1 when it is damaged."""
    from ravex.format.inspect import validate_with_progress

    store = open_store_for(args.store)
    with _progress("validate --full" if args.full else "validate") as progress:
        report = validate_with_progress(store, full=args.full, progress=progress)
    if args.json:
        _print_json(report.to_json())
        return EXIT_OK if report.ok else EXIT_FINDING
    console = _console()
    errors = [f for f in report.findings if f.severity == "error"]
    warnings = [f for f in report.findings if f.severity != "error"]
    if report.findings:
        from rich.table import Table

        table = Table()
        for col in ("severity", "kind", "step", "rank", "tensor", "chunk", "message"):
            table.add_column(col, overflow="fold")
        for f in errors + warnings:
            table.add_row(
                f"[red]{f.severity}[/]" if f.severity == "error" else f"[yellow]{f.severity}[/]", f.kind,
                _opt(f.step), _opt(f.rank), f.tensor or "", f.chunk or "", f.message,
            )
        console.print(table)
    checked = f"{len(report.steps_checked)} steps"
    if args.full:
        checked += f", {report.objects_checked} objects rehashed"
    if report.ok:
        console.print(f"[green]ok[/]: {report.url} ({checked}; {len(warnings)} warnings)")
        return EXIT_OK
    console.print(f"[red]{len(errors)} errors[/] in {report.url} ({checked}; {len(warnings)} warnings)")
    return EXIT_FINDING


def _opt(v: Any) -> str:
    return "" if v is None else str(v)


def cmd_gc(args: argparse.Namespace) -> int:
    """Apply retention and delete objects no kept step names."""
    store = open_store_for(args.store)
    with _progress("gc (dry run)" if args.dry_run else "gc") as progress:
        progress(0, 0, "listing")
        try:
            report = store.gc(
                keep_last=args.keep_last, keep_every=args.keep_every, grace_seconds=args.grace, dry_run=args.dry_run
            )
        except ValueError as exc:
            raise UsageError(_one_line(exc)) from None
    if args.json:
        _print_json(report.to_json())
        return EXIT_OK
    from ravex.tui.formatting import human_bytes

    verb = "would delete" if args.dry_run else "deleted"
    _console().print(
        f"{store.url}: kept {len(report.kept_steps)} steps, {verb} {len(report.deleted_steps)} steps "
        f"{_step_list(report.deleted_steps)}and {report.deleted_objects} objects "
        f"({human_bytes(report.deleted_bytes)}); "
        f"{report.young_unreferenced} unreferenced objects are younger than the grace period",
        soft_wrap=True,
    )
    return EXIT_OK


def _step_list(steps: list[int]) -> str:
    if not steps:
        return ""
    shown = ", ".join(f"step_{s}" for s in steps[:8]) + (", ..." if len(steps) > 8 else "")
    return f"({shown}) "


EXPORT_FORMATS = ("safetensors", "pt", "zarr", "refs")


def cmd_export(args: argparse.Namespace) -> int:
    """Export a step as safetensors, a torch .pt file, a plain Zarr group, or fsspec references."""
    reader = open_step_for(args.step)
    try:
        exporter = _exporter(args.format)
    except ImportError as exc:
        raise UsageError(f"export to {args.format} is not available: {_one_line(exc)}") from None
    with _progress(f"export {args.format}") as progress:
        progress(0, 0, os.fspath(args.out))
        try:
            result = exporter(reader, args.out)
        except (ValueError, TypeError, OSError) as exc:  # RavexError subclasses these too
            raise UsageError(f"export of step_{reader.step} to {args.out!r} failed: {_one_line(exc)}") from None
    if args.json:
        _print_json({"step": reader.step, "format": args.format, "out": os.fspath(args.out), "result": result})
    else:
        msg = f"exported {reader.store.url}@step_{reader.step} to {args.out} ({args.format})"
        _console().print(msg, soft_wrap=True)
    return EXIT_OK


def _exporter(fmt: str) -> Callable[[StepReader, str], Any]:
    """The export function for a format, imported only now (``pt`` imports torch)."""
    import importlib

    module_name, func_name = {
        "safetensors": ("ravex.format.export", "export_safetensors"),
        "zarr": ("ravex.format.export", "export_zarr"),
        "refs": ("ravex.format.refs", "export_refs"),
        "pt": ("ravex._export_torch", "export_pt"),
    }[fmt]
    func = getattr(importlib.import_module(module_name), func_name)
    return lambda reader, out: func(reader.store, out, step=reader.step)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Browse a store in a terminal UI."""
    if args.store is None:
        url, opts = default_store()
    else:
        url, opts = (args.store if "://" in args.store else os.path.abspath(args.store)), None
    from ravex.tui.app import InspectorApp

    InspectorApp(url, storage_options=opts).run()
    return EXIT_OK


# ---- argparse ---------------------------------------------------------------------------------


def _add(subparsers: Any, name: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    doc = (func.__doc__ or "").strip().splitlines()[0]
    p = subparsers.add_parser(name, help=doc, description=doc)
    p.set_defaults(func=func, _ravex_verb=func)
    return p


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", nargs="?", metavar="STORE",
                   help="store path or URL (default: $RAVEX_STORAGE, ravex.yaml's storage, ./checkpoints)")


def _json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def _add_ls(sub: Any) -> None:
    p = _add(sub, "ls", cmd_ls)
    _store_arg(p)
    _json_arg(p)


def _add_show(sub: Any) -> None:
    p = _add(sub, "show", cmd_show)
    p.add_argument("step", metavar="STEP", help="step_100, 100, latest or STORE@step_100")
    p.add_argument("tensors", nargs="*", metavar="TENSOR", help="tensor paths such as model/layer.0.weight")
    p.add_argument("--bins", type=_positive_int, default=20, help="histogram bins (default 20)")
    _json_arg(p)


def _add_diff(sub: Any) -> None:
    p = _add(sub, "diff", cmd_diff)
    p.add_argument("a", metavar="A", help="reference step (step_100, latest, STORE@step_100)")
    p.add_argument("b", metavar="B", help="the step to compare with A (a bare step is in A's store)")
    p.add_argument("--threshold", type=float, default=None,
                   help="list only changed tensors with ‖a-b‖/‖a‖ at least this")
    p.add_argument("--all", action="store_true", help="also list unchanged tensors and values")
    p.add_argument("--no-stats", action="store_true", help="only what the manifests tell (read no tensor)")
    _json_arg(p)


def _add_validate(sub: Any) -> None:
    p = _add(sub, "validate", cmd_validate)
    _store_arg(p)
    p.add_argument("--full", action="store_true", help="also read and rehash every object")
    _json_arg(p)


def _add_gc(sub: Any) -> None:
    p = _add(sub, "gc", cmd_gc)
    _store_arg(p)
    p.add_argument("--keep-last", type=_positive_int, default=None, metavar="N", help="keep the newest N steps")
    p.add_argument("--keep-every", type=_positive_int, default=None, metavar="K",
                   help="keep every step divisible by K")
    p.add_argument("--grace", type=float, default=3600.0, metavar="SECONDS",
                   help="keep unreferenced objects younger than this (default 3600)")
    p.add_argument("--dry-run", action="store_true", help="report what would be deleted, delete nothing")
    _json_arg(p)


def _add_export(sub: Any) -> None:
    p = _add(sub, "export", cmd_export)
    p.add_argument("step", metavar="STEP", help="step_100, 100, latest or STORE@step_100")
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    p.add_argument("out", metavar="OUT", help="output file (safetensors, pt, refs) or directory (zarr)")
    _json_arg(p)


def _add_inspect(sub: Any) -> None:
    p = _add(sub, "inspect", cmd_inspect)
    _store_arg(p)


#: verb -> (declare its arguments on a subparsers object, run it): the shape of ``ravex.cli.VERBS``.
VERBS: dict[str, tuple[Callable[[Any], None], Callable[[argparse.Namespace], int]]] = {
    name: (add, lambda args: run(args))
    for name, add in (("ls", _add_ls), ("show", _add_show), ("diff", _add_diff), ("validate", _add_validate),
                      ("gc", _add_gc), ("export", _add_export), ("inspect", _add_inspect))
}


def register(subparsers: Any) -> None:
    """Add the inspector verbs to an ``argparse`` subparsers object.

    Each verb sets ``func`` to a callable taking the parsed namespace and returning the exit
    status; call it through :func:`run` to turn errors into one-line messages and status 2.
    """
    for add, _run in VERBS.values():
        add(subparsers)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def run(args: argparse.Namespace) -> int:
    """Run the verb a parsed namespace names; errors become one line on stderr and status 2."""
    try:
        return args._ravex_verb(args)
    except UsageError as exc:
        sys.stderr.write(f"ravex {_verb_name(args)}: error: {exc}\n")
        return EXIT_USAGE
    except ConfigError as exc:  # ravex.yaml / RAVEX_*: the very line `ravex status` prints
        sys.stderr.write(f"ravex: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK


def _verb_name(args: argparse.Namespace) -> str:
    return {v: k for k, v in _HANDLERS.items()}.get(args._ravex_verb, "")


_HANDLERS = {
    "ls": cmd_ls, "show": cmd_show, "diff": cmd_diff, "validate": cmd_validate,
    "gc": cmd_gc, "export": cmd_export, "inspect": cmd_inspect,
}


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point for the inspector verbs (``python -m ravex.cli_verbs ls``)."""
    parser = argparse.ArgumentParser(prog="ravex", description="Inspect Ravex checkpoint stores.")
    register(parser.add_subparsers(dest="command", required=True, metavar="VERB"))
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
