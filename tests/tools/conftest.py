"""Fixtures for the tool tests: stores written by the format, the CLI as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from stores import write_run  # noqa: E402


@pytest.fixture(autouse=True)
def _fixed_clock(monkeypatch):
    """Manifests carry their creation time; fix it so that output (and snapshots) repeat."""
    import ravex.format.history.clock

    monkeypatch.setattr(ravex.format.history.clock, "now_iso", lambda: "2026-12-01T12:00:00.000+00:00")


@pytest.fixture
def run_store(tmp_path: Path) -> Path:
    """Steps 100, 200, 300 complete and 400 half-written (rank 0 of 2)."""
    return write_run(tmp_path / "ckpt", incomplete=400)


class Result:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self):
        return json.loads(self.out)

    def __repr__(self) -> str:
        return f"Result(rc={self.rc}, out={self.out[-2000:]!r}, err={self.err[-2000:]!r})"


@pytest.fixture
def cli(tmp_path: Path):
    """Run ``python -m ravex ARGS`` in a subprocess (cwd: the test's tmp dir by default)."""

    def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Result:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RAVEX_")}
        full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env["COLUMNS"] = "200"
        full_env.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-m", "ravex", *map(str, args)],
            cwd=cwd or tmp_path, env=full_env, capture_output=True, text=True, timeout=120,
        )
        return Result(proc)

    return run


async def settle(pilot) -> None:
    """Until no worker runs, every message they posted is handled (workers start workers) and
    every table has measured the rows added to it. A table measures new rows when its message
    queue is empty, and ``pilot.pause()`` judges idleness by the process's CPU time, which a
    busy machine can fool: a snapshot taken then drew a refilled table with its old widths."""
    app = pilot.app
    for _ in range(20):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not any(w.is_running for w in app.workers):
            await pilot.pause()
            if not any(w.is_running for w in app.workers) and not _tables_pending(app):
                return
    raise AssertionError("workers never settled")


def _tables_pending(app) -> bool:
    """Whether a DataTable still has rows to measure (Textual's ``_require_update_dimensions``)."""
    from textual.widgets import DataTable

    return any(getattr(table, "_require_update_dimensions", False) for table in app.query(DataTable))
