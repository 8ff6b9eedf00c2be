"""One checkpoint log line per checkpoint for the whole job, under real ``torchrun`` (2 ranks,
gloo, CPU): rank 0 prints it once the step is complete, naming the ranks, the slowest rank's
stall and the bytes summed over the ranks' manifests; the other ranks print none (64 ranks
would otherwise print 64 lines per checkpoint). Each rank's own stall and bytes stay in its
manifest, listed per rank by ``ravex show``."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from ravex.format import open_store
from ravex.format.reports.summary import summarize_step
from ravex.saving.logline import size

from . import dharness as h

LINE = re.compile(r"^ravex: checkpoint step (\d+)(.*)$")


def test_two_ranks_print_one_line_per_checkpoint_from_rank_0(tmp_path):
    cwd = h.workdir(tmp_path, every=4, keep_last=0)
    run = h.run(2, cwd, h.env(T_ENTRY="activate"))
    assert run.returncode == 0, run.explain()
    lines = [m for m in map(LINE.match, run.stderr.splitlines()) if m and "stall" in m.group(2)]
    steps = [int(m.group(1)) for m in lines]
    store = open_store(cwd / "ckpt")
    assert steps == sorted(store.complete_steps()) and len(steps) >= 4, run.explain()
    for m in lines:
        rest, step = m.group(2), int(m.group(1))
        assert rest.startswith(" (2 ranks): stall "), rest  # the job's line, printed by rank 0 alone
        assert re.search(r"\(slowest: rank [01]\)", rest), rest
        summary = summarize_step(store, step)
        assert f"{size(summary.new_bytes)} new, {size(summary.reused_bytes)} reused" in rest, rest
        assert summary.new_bytes + summary.reused_bytes > 1024  # both ranks' bytes, in KiB
    assert "FAILED" not in run.stderr, run.explain()
    # each rank's own figures stay in the store: `ravex show` lists them per rank
    shown = subprocess.run([sys.executable, "-m", "ravex", "show", str(steps[-1]), "--json"], cwd=cwd,
                           env=h.env(), capture_output=True, text=True, check=True)
    ranks = json.loads(shown.stdout)["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["stall_ms"] >= 0 for r in ranks), ranks
    assert f"stall {max(r['stall_ms'] for r in ranks):.1f} ms" in lines[-1].group(2)
