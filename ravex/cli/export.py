"""``ravex export``: one step as safetensors, a torch ``.pt`` file, a plain Zarr group, or fsspec
references, for tools that do not read Ravex stores."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ravex.tui.formatting import one_line

from .common import (
    EXIT_OK,
    UsageError,
    Verb,
    console,
    json_argument,
    open_step_for,
    print_json,
    progress_bar,
    step_argument,
    step_name,
)

if TYPE_CHECKING:
    from ravex.format import StepReader

EXPORT_FORMATS = ("safetensors", "pt", "zarr", "refs")


def cmd_export(args: argparse.Namespace) -> int:
    """Export a step as safetensors, a torch .pt file, a plain Zarr group, or fsspec references."""
    reader = open_step_for(args.step)
    try:
        exporter = _exporter(args.format)
    except ImportError as exc:
        raise UsageError(f"export to {args.format} is not available: {one_line(exc)}") from None
    with progress_bar(f"export {args.format}") as progress:
        progress(0, 0, os.fspath(args.out))
        try:
            result = exporter(reader, args.out)
        except (ValueError, TypeError, OSError) as exc:  # RavexError subclasses these too
            raise UsageError(f"export of {step_name(reader)} to {args.out!r} failed: {one_line(exc)}") from None
    if args.json:
        print_json({"step": reader.step, "timeline": reader.store.timeline.name, "format": args.format,
                    "out": os.fspath(args.out), "result": result})
    else:
        msg = f"exported {reader.store.url}@{step_name(reader)} to {args.out} ({args.format})"
        console().print(msg, soft_wrap=True)
    return EXIT_OK


def _exporter(fmt: str) -> Callable[[StepReader, str], Any]:
    """The export function for a format, imported only now (``pt`` imports torch)."""
    import importlib

    module_name, func_name = {
        "safetensors": ("ravex.format.interop.export", "export_safetensors"),
        "zarr": ("ravex.format.interop.export", "export_zarr"),
        "refs": ("ravex.format.steps.refs", "export_refs"),
        "pt": ("ravex.saving.export", "export_pt"),
    }[fmt]
    func = getattr(importlib.import_module(module_name), func_name)
    return lambda reader, out: func(reader.store, out, step=reader.step)


def _export_arguments(p: argparse.ArgumentParser) -> None:
    step_argument(p)
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    p.add_argument("out", metavar="OUT", help="output file (safetensors, pt, refs) or directory (zarr)")
    json_argument(p)


VERBS = (Verb("export", cmd_export, _export_arguments),)
