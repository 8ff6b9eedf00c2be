"""Two runs, one timeline, over ``s3://`` (issue 24; the local case is
tests/runtime/test_two_runs.py): the lease's generations are created with ``If-None-Match: *``
against the moto server, so of several processes taking one timeline exactly one wins; a second
training run beside a live one stops at its start naming it; the first one SIGKILLed, its rerun
takes the timeline over at once and resumes.
"""

from __future__ import annotations

import json
import signal
import uuid

from rhelpers import BUCKET, KEY, SECRET, options_for

from ravex.format import open_store
from ravex.format.history.leases import generations, read_holder
from ravex.format.storage import open_storage
from tests.format.test_leases import race
from tests.runtime import harness

ARGV = [harness.PYTHON, str(harness.TRAINEE)]


def test_processes_racing_for_one_lease_on_s3_one_wins(moto_server, s3_url):
    options = options_for(moto_server.url)
    race(s3_url, options)
    race(s3_url, options)  # the holder exited without releasing: on this machine that frees it at once
    assert generations(open_storage(s3_url, options), "main") == [2]


def test_a_second_run_over_s3_stops_at_start_and_a_killed_ones_rerun_resumes(moto_server, tmp_path):
    url = f"s3://{BUCKET}/two-runs-{uuid.uuid4().hex[:12]}"
    (tmp_path / "ravex.yaml").write_text(
        f"storage:\n  url: {url}\n  endpoint: {moto_server.url}\n  region: us-east-1\n  path_style: true\n"
        "checkpoint_every: 5\n")
    env = harness.child_env(T_ENTRY="activate", AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
    with harness.hold(ARGV, tmp_path, dict(env, T_BLOCK_AT="step:7"), until="BLOCKED") as first:
        store = open_store(url, storage_options=options_for(moto_server.url))
        second = harness.run(ARGV, tmp_path, env)
        assert second.returncode == 2, second.explain()
        line = second.stderr.strip()
        assert "\n" not in line and line.startswith(f"ravex: timeline 'main' of '{url}'"), line
        assert f"pid {first.pid}, started " in line and "running on this machine" in line, line
        assert second.losses == [] and store.complete_steps() == [5]
        first.send_signal(signal.SIGKILL)
        first.wait()
    rerun = harness.run(ARGV, tmp_path, env)
    assert rerun.returncode == 0 and rerun.resumed_from == 5, rerun.explain()
    assert "FAILED" not in rerun.stderr, rerun.explain()
    holder = read_holder(store.storage, "main")
    assert holder.generation == 2 and holder.released
    assert json.loads(store.storage.read("leases/main/2.json"))["pid"] != first.pid
