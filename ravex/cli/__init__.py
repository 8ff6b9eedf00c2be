"""The ``ravex`` command: one parser, one dispatch, one error policy.

Each verb is a :class:`~ravex.cli.common.Verb` declared by the module of its group:
:mod:`~ravex.cli.activation` (enable, disable, status), :mod:`~ravex.cli.steps` (ls, show),
:mod:`~ravex.cli.timelines` (tag), :mod:`~ravex.cli.diff`, :mod:`~ravex.cli.maintenance` (validate,
gc), :mod:`~ravex.cli.export` and :mod:`~ravex.cli.browse` (inspect). A verb reads stores through
:mod:`ravex.format` and imports nothing heavy until it runs: no torch, and Textual only for ``inspect``.

Exit status: 0 ok, 1 a finding (a failed validation), 2 bad usage, a bad ``ravex.yaml`` or an
unreadable store, with one line on stderr that names the fix; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import sys

from ravex import __version__
from ravex.errors import RavexError

from . import activation, browse, diff, export, maintenance, steps, timelines
from .common import EXIT_OK, EXIT_USAGE, UsageError, Verb

#: Every verb, in the order ``ravex --help`` lists them.
VERBS: tuple[Verb, ...] = (
    *activation.VERBS, *steps.VERBS, *timelines.VERBS, *diff.VERBS, *maintenance.VERBS, *export.VERBS,
    *browse.VERBS,
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every verb; the parsed namespace's ``verb`` is the :class:`Verb` to run."""
    parser = argparse.ArgumentParser(prog="ravex", description="Crash-proof PyTorch training with zero code changes.")
    parser.add_argument("--version", action="version", version=f"ravex {__version__}")
    sub = parser.add_subparsers(dest="verb_name", metavar="VERB")
    for verb in VERBS:
        p = sub.add_parser(verb.name, help=verb.help, description=verb.description)
        verb.add_arguments(p)
        p.set_defaults(verb=verb)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ravex`` console script and ``python -m ravex``: the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb_name is None:
        parser.print_help()
        return EXIT_USAGE
    verb: Verb = args.verb
    try:
        return verb.run(args)
    except UsageError as exc:
        sys.stderr.write(f"ravex {verb.name}: error: {exc}\n")
        return EXIT_USAGE
    except RavexError as exc:  # a bad ravex.yaml or RAVEX_*: the very line `ravex status` prints
        sys.stderr.write(f"ravex: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:  # `ravex ls | head`
        return EXIT_OK


__all__ = ["VERBS", "build_parser", "main"]
