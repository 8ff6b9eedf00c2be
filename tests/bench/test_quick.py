"""Smoke test of the benchmark suite: ``python -m benchmarks all --quick`` runs and writes
its JSON (every scenario present) and its plot. It checks nothing about the figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIOS = ("a_stall", "b_frozen", "c_sparse", "d_ten_checkpoints", "e_load", "f_patch_overhead", "g_bf16")


@pytest.mark.timeout(300)
def test_all_quick_runs(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("safetensors")
    out = tmp_path / "all.json"
    plot = tmp_path / "all.png"
    scratch = tmp_path / "scratch"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "all", "--quick", "--plain", "--silent",
         "--out", str(out), "--plot", str(plot), "--dir", str(scratch)],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(out.read_text())
    missing = [k for k in (*SCENARIOS, "format", "budget") if k not in res]
    assert not missing, f"scenarios missing from the JSON: {missing}"
    assert plot.stat().st_size > 0
    assert not [p for p in scratch.iterdir()], "scratch folders left behind"
