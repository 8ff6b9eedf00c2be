"""examples/train_demo.py works unchanged under both entry points, across a SIGKILL."""

from __future__ import annotations

import signal

import pytest

from . import harness

DEMO = str(harness.ROOT / "examples" / "train_demo.py")


@pytest.fixture(scope="module")
def reference_digest(tmp_path_factory) -> str:
    ref_dir = tmp_path_factory.mktemp("demo-reference")
    ref = harness.run([harness.PYTHON, DEMO, "--epochs", "1", "--digest-out", "d.txt"], ref_dir,
                      harness.child_env())
    assert ref.returncode == 0, ref.stderr
    return (ref_dir / "d.txt").read_text()


@pytest.mark.parametrize("entry", ["enable", "activate"])
def test_demo_survives_sigkill_under_both_entry_points(tmp_path, entry, request, reference_digest):
    work = tmp_path / "run"
    work.mkdir()
    (work / "ravex.yaml").write_text("storage: ./checkpoints\ncheckpoint_every: 5\n")
    if entry == "enable":
        argv = [request.getfixturevalue("enabled_python"), DEMO, "--epochs", "1"]
    else:
        argv = [harness.PYTHON, DEMO, "--epochs", "1", "--activate"]
    first = harness.run(argv, work, harness.child_env(), kill_on=r"epoch 0 step\s+12 ")
    assert first.returncode == -signal.SIGKILL, first.stderr
    second = harness.run([*argv, "--digest-out", "d.txt"], work, harness.child_env())
    assert second.returncode == 0 and second.resumed_from in (5, 10), second.stderr
    assert (work / "d.txt").read_text() == reference_digest
