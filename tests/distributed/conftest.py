"""Fixtures shared by the distributed tests (each torchrun job costs seconds on 2 cores)."""

from __future__ import annotations

import pytest
import torch

from . import dharness as h

STEPS = 16  # 2 epochs x 8 batches per rank at 2 ranks


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory):
    """The uninterrupted 2-rank DDP run without Ravex: its result and final state."""
    cwd = tmp_path_factory.mktemp("ddp-reference")
    out = cwd / "final.pt"
    result = h.run(2, cwd, h.env(T_ENTRY="none", T_OUT=str(out)))
    assert result.returncode == 0, result.explain()
    assert len(result.losses(0)) == STEPS and len(result.losses(1)) == STEPS
    return result, torch.load(out, weights_only=False)
