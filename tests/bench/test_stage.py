"""``python -m benchmarks stage`` (m): its quick run writes a JSON with the copy alone and the copy
hashing at each block size, and the shipped block size is left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ravex.saving import copier

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_stage_quick_measures_the_copy_and_the_hash(tmp_path):
    out = tmp_path / "stage.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "stage", "--quick", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["run"]["rows"]
    assert [r["variant"] for r in rows] == ["copy", "copy + hash, 1024 KiB blocks", "copy + hash, 256 KiB blocks"]
    assert all(r["median_s"] > 0 and len(r["runs_s"]) == 1 for r in rows), rows
    assert rows[0]["over_copy_s"] == 0
    assert "copy + hash, 1024 KiB blocks" in proc.stdout


def test_the_stage_benchmark_puts_the_shipped_block_back():
    from benchmarks import stage

    shipped = copier.HASH_BLOCK_BYTES
    stage.run(8, 1, blocks_kib=(64,))
    assert copier.HASH_BLOCK_BYTES == shipped
