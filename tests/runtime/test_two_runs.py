"""Two runs, one timeline (issue 24): a second run started while the first still writes the same
timeline (a requeued job whose predecessor lives on, the same script launched twice) stops at its
start, in one line naming the first run, and writes nothing; once the first is SIGKILLed, its
lease is no obstacle: the rerun takes the timeline over at once and resumes.
"""

from __future__ import annotations

import json
import signal

from ravex.format import open_store

from . import harness

ARGV = [harness.PYTHON, str(harness.TRAINEE)]


def _store_files(root) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
            if p.is_file() and "leases" not in p.parts}


def test_a_second_run_of_a_live_timeline_stops_at_start_and_a_killed_ones_rerun_resumes(tmp_path):
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    env = harness.child_env(T_ENTRY="activate", T_WORKERS="0")
    with harness.hold(ARGV, tmp_path, dict(env, T_BLOCK_AT="step:7"), until="BLOCKED") as first:
        store = open_store(tmp_path / "ckpt")
        assert store.complete_steps() == [5]
        before = _store_files(tmp_path / "ckpt")

        second = harness.run(ARGV, tmp_path, env)
        assert second.returncode == 2, second.explain()
        line = second.stderr.strip()
        assert "\n" not in line, second.explain()
        assert line.startswith("ravex: timeline 'main' of ") and f"pid {first.pid}, started " in line, line
        assert "host " in line and "running on this machine" in line and "stop that run" in line, line
        assert second.losses == []  # it trained nothing
        assert _store_files(tmp_path / "ckpt") == before  # and touched no step or object of the first
        first.send_signal(signal.SIGKILL)
        first.wait()

    # the SIGKILLed run's lease names a process that is gone: the rerun takes over and resumes
    rerun = harness.run(ARGV, tmp_path, env)
    assert rerun.returncode == 0, rerun.explain()
    assert rerun.resumed_from == 5, rerun.explain()
    assert "FAILED" not in rerun.stderr and "unreachable" not in rerun.stderr, rerun.explain()
    [lease] = sorted((tmp_path / "ckpt" / "leases" / "main").glob("*.json"))
    doc = json.loads(lease.read_text())
    assert lease.name == "2.json" and doc["released"] is True  # generation 1 was the killed run's
    assert store.complete_steps()[-1] == 36
