"""``ravex inspect``: the terminal UI of :mod:`ravex.tui` on a store (Textual is imported only now)."""

from __future__ import annotations

import argparse
import os

from .common import EXIT_OK, Verb, default_store, store_argument


def cmd_inspect(args: argparse.Namespace) -> int:
    """Browse a store in a terminal UI."""
    if args.store is None:
        url, opts = default_store()
    else:
        url, opts = (args.store if "://" in args.store else os.path.abspath(args.store)), None
    from ravex.tui.app import InspectorApp

    InspectorApp(url, storage_options=opts).run()
    return EXIT_OK


VERBS = (Verb("inspect", cmd_inspect, store_argument),)
