"""Two torchrun jobs, one timeline (issue 24): a second job started on the store of a job that is
still training (a requeue whose predecessor lives) stops before training: its rank 0 says, in one
line, which run holds the timeline, and torchrun ends the job non-zero. The first job's steps are
untouched.
"""

from __future__ import annotations

import subprocess

from ravex.format import open_store

from . import dharness as h


def test_a_second_job_on_a_live_timeline_stops_before_training(tmp_path):
    cwd = h.workdir(tmp_path, every=4)
    argv = [h.TORCHRUN, "--standalone", "--nproc_per_node=2", str(h.TRAINEE)]
    first = subprocess.Popen(argv, cwd=cwd, env=h.env(T_ENTRY="activate", T_BLOCK_AT="6"), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        lines: list[str] = []
        assert first.stdout is not None
        for raw in first.stdout:  # until both ranks flushed step 4 and block
            lines.append(raw)
            if h.all_ranks("BLOCKED", 2)(lines):
                break
        store = open_store(cwd / "ckpt")
        assert store.complete_steps() == [4]

        second = h.run(2, cwd, h.env(T_ENTRY="activate"))
        assert second.returncode != 0 and not second.killed, second.explain()
        said = [ln for ln in second.stderr.splitlines() if ln.startswith("ravex: ")]
        assert len(said) == 1 and "timeline 'main' of " in said[0] and "is being written by another run" in said[0]
        assert "running on this machine" in said[0] and ", pid " in said[0] and ", started " in said[0], said
        assert not second.losses(0) and not second.losses(1)  # no rank trained
        assert store.complete_steps() == [4] and store.step_numbers() == [4]
    finally:
        h.kill_job(first.pid)
        first.wait()
