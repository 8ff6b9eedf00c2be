"""Benchmark (k): the simulation behind ``checkpoint_every: auto``'s figures in RESULTS.md."""

from __future__ import annotations

import random

import pytest

from benchmarks import cadence


def test_no_failure_costs_only_the_checkpoints():
    """An MTBF far beyond the job: every interval's checkpoint but the last is paid, nothing lost."""
    out = cadence.simulate(work=1000.0, interval_s=100.0, cost=2.0, mtbf=1e12, restart=60.0, rng=random.Random(0))
    assert out == {"checkpointing": pytest.approx(18.0), "lost": 0.0}


@pytest.mark.parametrize("mtbf_hours", [6.0, 1.0])
def test_auto_wastes_less_than_ten_times_shorter_or_longer(mtbf_hours):
    res = cadence.run(cost=0.8, mtbf=mtbf_hours * 3600, restart=60.0, work=86400.0, trials=60)
    waste = {r["cadence"]: r["waste_pct"] for r in res["rows"]}
    assert waste["auto"] < waste["10x shorter"] and waste["auto"] < waste["10x longer"], waste
    assert "| auto |" in cadence.table(res)
