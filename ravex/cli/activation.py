"""``ravex enable``, ``ravex disable`` and ``ravex status``: the autoloader and the configuration.

``enable`` installs a ``.pth`` file that activates Ravex in scripts run where a ``ravex.yaml``
is found; ``status`` says what would apply there, and why, and what the last run configured by
that file did with the checkpoint it found (``ravex.runtime.recording.runrecord``).
"""

from __future__ import annotations

import argparse
import os
import site
import sys
import sysconfig
from typing import Any

from ravex import __version__
from ravex.runtime.autoload import PTH_NAME, pth_line, source_file

from .common import EXIT_OK, Verb


def _site_dir(args: argparse.Namespace) -> str:
    if getattr(args, "site_dir", None):
        return os.path.abspath(str(args.site_dir))
    if getattr(args, "user", False):
        return site.getusersitepackages()
    purelib: str = sysconfig.get_paths()["purelib"]
    return purelib


def _add_site_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="the user site-packages")
    where.add_argument("--site-dir", metavar="DIR",
                       help="a site directory of your choice (default: this interpreter's)")


def cmd_enable(args: argparse.Namespace) -> int:
    """Install the .pth autoloader; it activates Ravex where a ravex.yaml is found."""
    from ravex.format.storage import atomic_write

    directory = _site_dir(args)
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, PTH_NAME)
    text = "# Installed by `ravex enable`; remove with `ravex disable`.\n" + pth_line(source_file())
    atomic_write(target, text.encode("utf-8"))  # an interpreter starting meanwhile sees no half line
    print(f"ravex {__version__}: autoloader installed in {target}")
    print("Scripts run from a directory with a ravex.yaml (or with RAVEX_CONFIG set) are now "
          "checkpointed and resumed.")
    return EXIT_OK


def cmd_disable(args: argparse.Namespace) -> int:
    """Remove the .pth autoloader."""
    target = os.path.join(_site_dir(args), PTH_NAME)
    if not os.path.exists(target):
        print(f"ravex: not enabled in {os.path.dirname(target)} (nothing to remove)")
        return EXIT_OK
    os.remove(target)
    print(f"ravex: autoloader removed from {target}")
    return EXIT_OK


def enabled_in() -> list[str]:
    """Every ``.pth`` autoloader this interpreter would run."""
    dirs = list(dict.fromkeys([*site.getsitepackages(), site.getusersitepackages(),
                               sysconfig.get_paths()["purelib"], *sys.path]))
    return [os.path.join(d, PTH_NAME) for d in dirs if d and os.path.isfile(os.path.join(d, PTH_NAME))]


def cmd_status(args: argparse.Namespace) -> int:
    """Version, enabled or not, the config that would apply (and why), the latest step, and
    the last run's resume outcome."""
    from ravex.runtime.config import RavexConfig, find_config_file
    from ravex.runtime.recording import runrecord

    print(f"ravex {__version__}")
    found = enabled_in()
    print(f"autoloader: {'enabled (' + ', '.join(found) + ')' if found else 'not enabled'}")
    path = args.config or os.environ.get("RAVEX_CONFIG") or find_config_file()
    config = RavexConfig.load(path=path)
    print(f"config file: {config.config_file or 'none (defaults and RAVEX_* only)'}")
    if found and not config.config_file:
        print("  (the autoloader does nothing here: no ravex.yaml in this directory)")
    for key, value in config.describe().items():
        print(f"  {key:<26} {value!r:<32} [{config.source_of(key)}]")
    print(f"latest step: {_latest_step(config)}")
    if config.local is not None:
        print(f"latest step in local: {_latest_step(config, config.local)}")
    if config.config_file:
        record = runrecord.read(config)
        if record is None:
            print("last run: none recorded for this store")
        else:
            print(f"last run: pid {record.pid}, ended {record.ended}, {record.steps} optimizer steps"
                  f"{', crashed' if record.crashed else ''}")
            print(f"  resume: {record.resume_line()}")
    return EXIT_OK


def _latest_step(config: Any, local: str | None = None) -> str:
    """The newest step of the store ``storage:`` names, or of the local tier ``local``."""
    try:
        if config.backend == "torch_save":
            import glob

            path = config.storage.local_path
            files = sorted(glob.glob(os.path.join(path, "step_*.pt"))) if path else []
            return str(int(files[-1].rsplit("_", 1)[1][:-3])) if files else "none"
        from ravex.format import StoreNotFoundError, open_store

        try:
            store = open_store(local or config.storage.url, create=False,
                               storage_options=None if local else config.storage.storage_options())
        except StoreNotFoundError:
            return f"none (no store at {local or config.storage.url})"
        latest = store.latest_step()
        return "none" if latest is None else f"{latest} ({store.url})"
    except Exception as exc:
        return f"unknown ({type(exc).__name__}: {exc})"


def _status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="a ravex.yaml other than ./ravex.yaml")


VERBS = (
    Verb("enable", cmd_enable, _add_site_options),
    Verb("disable", cmd_disable, _add_site_options),
    Verb("status", cmd_status, _status_arguments),
)
