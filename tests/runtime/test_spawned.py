"""Processes that ``multiprocessing`` starts (``ravex.runtime.starting.spawned``).

- A DDP job whose ranks ``torch.multiprocessing.spawn`` starts (PyTorch's DDP tutorials), with
  ``ravex.activate()`` at the script's top or under ``ravex enable``: before, the spawning process
  held the store and wrote nothing, and the ranks started no runtime (no checkpoint at all, said
  nowhere). Now each rank checkpoints from its process group on; SIGKILLed and rerun, the job
  resumes bitwise; a finished job rerun trains nothing and leaves its file as it was.
- DataLoader workers started by the spawn method import the script again: its
  ``ravex.activate()`` started a runtime in each worker, which found the timeline held by the
  training process and exited 2 ("DataLoader worker exited unexpectedly"): the training crashed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ravex.format import open_store
from tests.distributed.dharness import free_port

from . import harness

SHAPES = Path(__file__).with_name("shapes")


def _losses(run: harness.Result) -> dict[tuple[int, int], str]:
    out = {}
    for line in run.stdout:
        if line.startswith("LOSS "):
            _, rank, step, value = line.split()
            out[(int(rank), int(step))] = value
    return out


@pytest.mark.parametrize("entry", ["activate", "enable"])
def test_a_job_started_by_mp_spawn_checkpoints_and_resumes_bitwise(tmp_path, entry, request):
    python = request.getfixturevalue("enabled_python") if entry == "enable" else harness.PYTHON
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    for d in (ref_dir, run_dir):
        d.mkdir()
        shutil.copy(SHAPES / "spawn_ddp.py", d)
    ref = harness.run([harness.PYTHON, "spawn_ddp.py"], ref_dir,
                      harness.child_env(T_ENTRY="none", T_PORT=str(free_port()), T_OUT=str(ref_dir / "final.pt")))
    assert ref.returncode == 0, ref.explain()
    (run_dir / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 3\n")

    first = harness.run([python, "spawn_ddp.py"], run_dir,
                        harness.child_env(T_ENTRY=entry, T_PORT=str(free_port()), T_BLOCK_AT="7"),
                        kill_on="^BLOCKED", tree=True)
    assert first.returncode != 0, first.explain()
    written = open_store(run_dir / "ckpt").step_info(6)  # written by the two ranks, each its own manifest
    assert written.complete and set(written.ranks) == {0, 1}, first.explain()

    out = run_dir / "final.pt"
    second = harness.run([python, "spawn_ddp.py"], run_dir, harness.child_env(T_ENTRY=entry, T_PORT=str(free_port()),
                                                                              T_OUT=str(out)), tree=True)
    assert second.returncode == 0, second.explain()
    assert second.resumed_from == 6 and "(2 ranks; rank 0: " in second.stderr, second.explain()
    resumed = _losses(second)
    assert min(step for _, step in resumed) == 7, second.explain()
    assert resumed == {k: v for k, v in _losses(ref).items() if k[1] >= 7}, second.explain()
    harness.assert_same_state(torch.load(out, weights_only=True), torch.load(ref_dir / "final.pt", weights_only=True))
    assert "NOT restored" not in second.stderr and "another run" not in second.stderr, second.explain()

    saved = out.read_bytes()
    again = harness.run([python, "spawn_ddp.py"], run_dir, harness.child_env(T_ENTRY=entry, T_PORT=str(free_port()),
                                                                             T_OUT=str(out)), tree=True)
    assert again.returncode == 0 and not _losses(again), again.explain()  # a finished job trains nothing
    assert out.read_bytes() == saved


DATALOADER_SPAWN = '''
import os
import ravex

ravex.activate()
import torch
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 8, generator=g))
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=2, multiprocessing_context="spawn")
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            print("LOSS", ravex.step(), loss.item().hex(), flush=True)


if __name__ == "__main__":
    main()
'''


def test_dataloader_workers_started_by_spawn_start_no_runtime(tmp_path):
    (tmp_path / "train.py").write_text(DATALOADER_SPAWN)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 5\n")
    run = harness.run([harness.PYTHON, "train.py"], tmp_path, harness.child_env())
    assert run.returncode == 0, run.explain()
    assert len(run.losses) == 16 and "another run" not in run.stderr, run.explain()
    assert sorted(int(p.name) for p in (tmp_path / "ckpt" / "steps").iterdir())[-1] == 16
