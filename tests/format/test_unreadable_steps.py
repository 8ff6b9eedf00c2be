"""A step whose manifest is there but cannot be read (written by a newer Ravex, or damaged) is no
crashed write: neither GC's retention nor a resuming run's cleanup deletes it, GC then deletes no
object, and ``ravex gc`` says why in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ravex.format import open_store
from ravex.format.objects.names import object_key


def _store_with_a_newer_step(root: Path) -> dict[str, np.ndarray]:
    """Steps 1 and 2; step 2's manifest claims format 2.0; every file two hours old."""
    rng = np.random.default_rng(0)
    trees = {}
    store = open_store(str(root), create=True)
    with store.writer() as w:
        for step in (1, 2):
            trees[step] = {"w": rng.standard_normal((64, 64)).astype(np.float32)}
            w.commit(step, trees[step])
    path = root / "steps" / "2" / "rank-0.json"
    doc = json.loads(path.read_bytes())
    doc["version"] = "2.0"
    path.write_text(json.dumps(doc))
    old = time.time() - 7200
    for dirpath, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (old, old))
    return trees


def _objects_of(root: Path, step: int) -> set[str]:
    doc = json.loads((root / "steps" / str(step) / "rank-0.json").read_bytes())
    return {c["object"] for a in doc["arrays"].values() for c in a["chunks"].values() if "object" in c}


def test_gc_keeps_a_step_it_cannot_read_and_every_object(tmp_path: Path) -> None:
    _store_with_a_newer_step(tmp_path)
    objects = _objects_of(tmp_path, 2)
    report = open_store(str(tmp_path)).gc(keep_last=1, grace_seconds=60)
    assert report.unreadable_steps == [2]
    assert 2 in report.kept_steps and report.deleted_objects == 0
    assert "2.0" in (report.skipped_objects_because or "")
    assert (tmp_path / "steps" / "2" / "rank-0.json").exists()
    assert all((tmp_path / object_key(name)).exists() for name in objects)


def test_a_resuming_run_does_not_discard_a_step_it_cannot_read(tmp_path: Path) -> None:
    _store_with_a_newer_step(tmp_path)
    assert open_store(str(tmp_path)).discard_incomplete_above(1) == []
    assert (tmp_path / "steps" / "2" / "rank-0.json").exists()


@pytest.mark.timeout(60)
def test_ravex_gc_says_why_it_deleted_nothing(tmp_path: Path) -> None:
    _store_with_a_newer_step(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "ravex", "gc", str(tmp_path), "--keep-last", "1"],
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "kept (step_2) and deleted no object" in out and "upgrade ravex" in out, out
