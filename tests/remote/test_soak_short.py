"""The crash soak, short: SIGKILL writers and GC at random instants, validate and resume each time.

The full version is ``python benchmarks/soak.py --trials 100``, or this file with
``RAVEX_SOAK_FULL=1`` (marked slow).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.soak import run_soak, table


def _check(report: dict, min_commits: int | None = None) -> None:
    print("\n" + table(report))
    assert report["kills"]["writer"] + report["kills"]["gc"] >= report["trials"], report
    assert report["corrupt_resumes"] == 0, report["problems"]
    assert report["lost_complete_steps"] == 0, report["problems"]
    assert report["corrupt_steps"] == 0, report["problems"]
    assert report["validate_errors"] == 0, report["problems"]
    assert report["final_validate_ok"], report["problems"]
    assert report["commits"] >= (report["trials"] / 2 if min_commits is None else min_commits), report


def test_crash_soak_short(tmp_path):
    _check(run_soak(trials=20, seed=1, workdir=str(tmp_path), max_kill_seconds=1.0))


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RAVEX_SOAK_FULL"), reason="about 2-3 minutes; set RAVEX_SOAK_FULL=1")
def test_crash_soak_full(tmp_path):
    _check(run_soak(trials=100, seed=2, workdir=str(tmp_path)))


def test_crash_soak_short_over_s3(moto_server, s3_url):
    from rhelpers import options_for

    opts = options_for(moto_server.url)
    opts.pop("skip_instance_cache")
    # S3 LastModified has 1 s resolution: a grace of 3 s leaves a commit 2 s
    _check(run_soak(trials=5, seed=4, max_kill_seconds=1.5, full_validate_every=5, url=s3_url,
                    storage_options=opts, grace_seconds=3.0), min_commits=3)
