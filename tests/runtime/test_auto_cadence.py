"""``checkpoint_every: auto`` (issue 33, item 3): the interval from the measured cost of a
checkpoint and the stated MTBF, by Young's rule, no more often than ``max_overhead`` allows;
the first two checkpoints ten steps apart measure the cost; said in one line; a resume of an
auto run is exact as any other."""

from __future__ import annotations

import math
import re
import signal

import pytest
import torch

from ravex.runtime.config import RavexConfig
from ravex.runtime.counting.autocadence import FIRST_STEPS, AutoInterval, interval

from . import harness


def test_young_interval_and_the_overhead_bound():
    assert interval(0.5, 6 * 3600, 0.02) == pytest.approx(math.sqrt(2 * 0.5 * 6 * 3600))  # 147 s
    assert interval(0.5, 600, 0.02) == pytest.approx(25.0)  # sqrt(600) = 24.5 s would cost 2.04%


def _steps(auto: AutoInterval, now: float, durations: list[float]) -> float:
    for took in durations:
        now += took
        auto.stepped(now)
    return now


def test_the_cost_is_what_the_steps_after_a_checkpoint_took_beyond_a_plain_step():
    auto = AutoInterval(mtbf=3600.0, max_overhead=0.02)
    now = _steps(auto, 0.0, [0.1] * (FIRST_STEPS + 1))
    assert not auto.due_by_count(FIRST_STEPS - 1) and auto.due_by_count(FIRST_STEPS)
    assert auto.checkpointed() is None  # the first checkpoint: nothing measured yet
    now = _steps(auto, now, [0.3, 0.2] + [0.1] * (FIRST_STEPS - 2))  # its stall and write: 0.3 s more
    said = auto.checkpointed()
    assert auto.cost == pytest.approx(0.3)
    assert auto.seconds == pytest.approx(math.sqrt(2 * 0.3 * 3600))  # 46.5 s
    assert not auto.due_by_count(100)  # timed from now on
    assert said == ("ravex: checkpoint every 46.5 s (about 465 steps, checkpoint_every: auto): cost 0.30 s a "
                    "checkpoint, MTBF 1 h, expected loss per failure 23.5 s, overhead 0.6%")
    _steps(auto, now, [0.42] + [0.1] * 400)  # the same again: the interval hardly moves, nothing said
    assert auto.checkpointed() is None and auto.cost == pytest.approx(0.31)


@pytest.mark.parametrize(("key", "value", "why"), [
    ("checkpoint_every", "often", "expected a positive integer, 'auto'"),
    ("mtbf", "6x", "expected a duration such as 6h, 30m, 90s"),
    ("max_overhead", "200%", "expected a share of the training time such as 2% or 0.02"),
])
def test_bad_values_are_one_line_errors_naming_the_key(tmp_path, key, value, why):
    (tmp_path / "ravex.yaml").write_text(f"storage: ./ckpt\n{key}: {value}\n")
    with pytest.raises(ValueError, match=re.escape(why)) as raised:
        RavexConfig.load(cwd=str(tmp_path), environ={})
    assert key in str(raised.value) and "\n" not in str(raised.value)


def test_units_are_read():
    config = RavexConfig.load({"checkpoint_every": "auto", "mtbf": "6h", "max_overhead": "1%"}, environ={})
    assert (config.checkpoint_every, config.mtbf, config.max_overhead, config.fixed_every) == ("auto", 21600.0, 0.01,
                                                                                             None)


def test_an_auto_run_measures_says_and_resumes_bitwise(tmp_path, reference):
    """Checkpoints at steps 10 and 20 measure the cost; the interval is said once; SIGKILLed after
    step 24, the rerun resumes step 20 and ends bitwise as plain torch."""
    ref, ref_state = reference(0)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: auto\nmtbf: 6h\n")
    argv = [harness.PYTHON, str(harness.TRAINEE)]
    env = dict(T_ENTRY="activate", T_WORKERS="0")
    first = harness.run(argv, tmp_path, harness.child_env(**env, T_BLOCK_AT="step:24"), kill_on="BLOCKED")
    assert first.returncode == -signal.SIGKILL, first.explain()
    taken = [int(m) for m in re.findall(r"ravex: checkpoint step (\d+):", first.stderr)]
    assert taken == [FIRST_STEPS, 2 * FIRST_STEPS], first.explain()  # 6 h: the next is minutes away
    said = [line for line in first.stderr.splitlines() if "checkpoint_every: auto" in line]
    assert len(said) == 1 and said[0].startswith("ravex: checkpoint every ") and "MTBF 6 h" in said[0], first.explain()

    out = tmp_path / "final.pt"
    second = harness.run(argv, tmp_path, harness.child_env(**env, T_OUT=str(out)))
    assert second.returncode == 0 and second.resumed_from == 2 * FIRST_STEPS, second.explain()
    second.assert_verified()
    assert second.losses == ref.losses[2 * FIRST_STEPS:]
    harness.assert_same_state(torch.load(out, weights_only=False), ref_state)
