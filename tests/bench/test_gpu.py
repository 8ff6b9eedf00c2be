"""``python -m benchmarks gpu`` (issue 34): its CPU rehearsal runs here, so that the one run a lent
device gets is a run of a script that works; the CUDA case runs where a GPU is, and skips elsewhere.

The rehearsal is a real resume: the trainee SIGKILLs itself after a step, the rerun resumes from
Ravex's checkpoint, and the final model, optimizer and GradScaler state must be bitwise those of
the uninterrupted run, with the witness saying so."""

from __future__ import annotations

import pytest
import torch

from benchmarks import gpu


def _check_resume(res: dict) -> None:
    assert set(res) == {"bf16", "fp16", "bf16, non-deterministic"}, res
    for name, case in res.items():
        assert case["returncodes"] == [0, -9, 0] and case["bitwise"] is True, (name, case)
        assert case["resumed"] and "resumed from step" in case["resumed"], (name, case)
        assert len(case["witness"]) == 1 and case["witness"][0].startswith("ravex: resume verified"), (name, case)
    assert "within" in res["bf16, non-deterministic"]["witness"][0]  # the tolerant witness says what it measured


def test_the_cpu_rehearsal_resumes_bitwise_and_measures_every_part():
    res = gpu.run("cpu", quick=True, parts=["resume", "goodput", "stall"], log=lambda line: None)
    _check_resume(res["resume"])
    st = res["stall"]
    assert st["state_bytes"] > 0 and len(st["bare_copy_s"]) == 2 and len(st["ravex_stalls_s"]) == 3, st
    assert st["ravex_load_s"] > 0 and st["torch_load_s"] > 0, st
    assert set(res["goodput"]["lost_per_checkpoint_s"]) == {"copy + O_DIRECT write", "ravex", "dcp.async_save",
                                                             "torch.save"}, res["goodput"]
    text = gpu.table(res)
    assert "resume bf16: bitwise True" in text and "Ravex / DCP async_save" in text and "restore:" in text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_resume_is_bitwise():
    _check_resume(gpu.run("cuda", quick=True, parts=["resume"], log=lambda line: None)["resume"])
