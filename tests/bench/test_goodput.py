"""Smoke test of ``python -m benchmarks goodput --quick``: every contender runs in its own
process, Ravex writes every checkpoint asked of it (the child fails otherwise), every
checkpoint is paired with a quiet cycle, the user's loop runs whole beside an unchecked one with
Ravex on its own cadence, and the figures join the budget table. Nothing
about the figures' sizes is checked (speed belongs to the benchmark, not to a test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(240)
def test_goodput_quick_runs(tmp_path):
    out = tmp_path / "goodput.json"
    scratch = tmp_path / "scratch"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "goodput", "--quick", "--plain", "--silent",
         "--out", str(out), "--dir", str(scratch)],
        cwd=REPO, capture_output=True, text=True, timeout=230,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    full = res["h_goodput"]["modes"]["full"]
    assert set(full["lost_per_checkpoint_s"]) == {"bare copy", "ravex", "dcp.async_save", "torch.save",
                                                  "copy + O_DIRECT write"}
    for name, runs in full["runs"].items():
        assert len(runs[0]["quiet_s"]) == len(runs[0]["checkpoint_s"]) == 2, name
        assert len(runs[0]["lost_s"]) == 2, name
        assert "training" in runs[0]["threads_cpu_median_s"], name  # where each checkpoint's CPU went
    assert "ravex-writer" in full["runs"]["ravex"][0]["threads_cpu_median_s"]
    assert all(r["checkpoints_written"] == 2 for r in full["runs"]["ravex"])
    assert "ravex_over_dcp_async" in full["ratios"]
    assert any(row["goal"].startswith("(h)") for row in res["budget"])
    assert "(h) full model" in proc.stdout
    loop = res["h_goodput"]["modes"]["loop"]  # the user's loop, Ravex on its own cadence
    assert set(loop["lost_per_checkpoint_s"]) == {"bare copy", "ravex", "dcp.async_save", "torch.save",
                                                  "copy + O_DIRECT write"}
    ravex_run = loop["runs"][0]["ravex"]
    assert ravex_run["checkpoints_written"] == 2 and len(ravex_run["stalls_s"]) == 2  # its own log lines
    assert all(len(r["no checkpoint"]["iteration_s"]) == 5 for r in loop["runs"])
    assert "ravex_over_copy_write" in loop["ratios"]
    assert "(h) the user's loop" in proc.stdout
    assert not list(scratch.iterdir()), "scratch folders left behind"
