"""FSDP2 ``fully_shard`` under real ``torchrun`` (gloo, CPU; it runs there in torch 2.13):
each rank writes its own rows of every sharded parameter and optimizer moment as whole
chunks of the global array (uneven last shard: 33 rows -> 17 + 16), a SIGKILLed job resumes
bitwise, and the checkpoint loads at another world size (2 -> 1, 1 -> 2) exactly.
"""

from __future__ import annotations

import pytest
import torch

from ravex.format import open_store

from . import dharness as h

STEPS = 16


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("fsdp-reference")
    out = cwd / "final.pt"
    result = h.run(2, cwd, h.env(T_ENTRY="none", T_MODE="fsdp", T_OUT=str(out)))
    assert result.returncode == 0, result.explain()
    assert len(result.losses(0)) == STEPS
    return result, torch.load(out, weights_only=False)


def test_fsdp_sigkill_resume_bitwise_then_reshard_to_one_rank(tmp_path, reference):
    ref, ref_state = reference
    cwd = h.workdir(tmp_path, every=4)
    first = h.run(2, cwd, h.env(T_ENTRY="activate", T_MODE="fsdp", T_BLOCK_AT="7"),
                  kill_when=h.all_ranks("BLOCKED", 2))
    assert first.killed, first.explain()
    out = tmp_path / "two.pt"
    second = h.run(2, cwd, h.env(T_ENTRY="activate", T_MODE="fsdp", T_OUT=str(out)))
    assert second.returncode == 0, second.explain()
    for rank in (0, 1):
        assert second.restored(rank) == 4, second.explain()
        assert second.losses(rank) == {s: v for s, v in ref.losses(rank).items() if s > 4}
    h.assert_same_state(torch.load(out, weights_only=False), ref_state)

    reader = open_store(cwd / "ckpt").open_step(STEPS)
    for path in ("models/0/state/0.weight", "models/0/state/0.bias"):
        assert reader.arrays[path].shape[0] == 33 and reader.arrays[path].chunk_shape[0] == 17
        assert all(k.startswith("c/0") for k in reader.manifests[0].arrays[path].chunks)
        assert all(k.startswith("c/1") for k in reader.manifests[1].arrays[path].chunks)
    moments = [p for p in reader.arrays if p.startswith("optimizers/") and p.endswith("exp_avg")]
    assert moments and all(reader.manifests[1].arrays[p].chunks for p in moments)

    one = tmp_path / "one.pt"  # 2 -> 1: the run is over; its final state is what was restored
    solo = h.run(1, cwd, h.env(T_ENTRY="activate", T_MODE="fsdp", T_OUT=str(one)))
    assert solo.returncode == 0, solo.explain()
    h.assert_same_state(torch.load(one, weights_only=False), ref_state)


@pytest.mark.slow
def test_fsdp_one_rank_checkpoint_loads_at_two(tmp_path):
    cwd = h.workdir(tmp_path, every=8)
    out1, out2 = tmp_path / "one.pt", tmp_path / "two.pt"
    solo = h.run(1, cwd, h.env(T_ENTRY="activate", T_MODE="fsdp", T_OUT=str(out1)))
    assert solo.returncode == 0, solo.explain()
    pair = h.run(2, cwd, h.env(T_ENTRY="activate", T_MODE="fsdp", T_OUT=str(out2)))
    assert pair.returncode == 0, pair.explain()
    h.assert_same_state(torch.load(out2, weights_only=False), torch.load(out1, weights_only=False))
