"""Smoke tests of the request-counting benchmarks: ``python -m benchmarks.resume_requests`` (j)
at a few ranks, whose counts do not depend on the machine and are checked against what
docs/SCALE.md says of them, and ``python -m benchmarks tiers --quick`` (l), which only has to run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(300)
def test_resume_requests_counts_stay_flat_for_ranks_other_than_0(tmp_path):
    out = tmp_path / "rr.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.resume_requests", "--ranks", "12", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = {r["mode"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"before", "after", "step", "fork"}
    for mode in ("after", "step", "fork"):  # O(1) per rank: a few listings, its own manifest, rank 0's
        assert rows[mode]["other_rank"]["GET manifest"] <= 4, (mode, rows[mode]["other_rank"])
        assert rows[mode]["other_rank_requests"] < rows["before"]["other_rank_requests"] / 2, rows[mode]
    assert rows["before"]["other_rank"]["GET manifest"] == 3 * 12  # every manifest of the 3 steps
    assert rows["after"]["rank0"]["GET manifest"] == 12  # the newest step's, not every step's
    assert rows["step"]["rank0"]["GET manifest"] == 2 * 12  # the newest and the step named


@pytest.mark.timeout(300)
def test_tiers_quick_runs(tmp_path):
    pytest.importorskip("moto")
    out = tmp_path / "tiers.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "tiers", "--quick", "--dir", str(tmp_path),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "persist_every 10" in proc.stdout, proc.stdout
    assert out.stat().st_size > 0
