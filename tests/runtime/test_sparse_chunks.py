"""A sparse embedding table under ``ravex.activate()``: its weight and SparseAdam's moments get
small row chunks, so a checkpoint after an interval that touched ~1% of the rows writes a
small fraction of the state (manifest included); resuming from such deltas is bitwise."""

from __future__ import annotations

import copy
import gc
import json
import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ravex
from ravex.format import open_store
from ravex.format.objects.chunktable import ChunkTable
from ravex.runtime.state.chunking import SPARSE_CHUNK_BYTES

ROWS, DIM, HOT, STEPS = 8192, 64, 82, 6  # 82 rows = 1% of the table per step


pytestmark = pytest.mark.usefixtures("ravex_clean")


class Recommender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(ROWS, DIM, sparse=True)
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids)).square().mean()


def _objects(seed: int = 0):
    torch.manual_seed(seed)
    model = Recommender()
    sparse = torch.optim.SparseAdam(model.emb.parameters(), lr=1e-2)
    dense = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    batches = torch.stack([torch.randperm(ROWS, generator=g)[:HOT] for _ in range(STEPS)])
    loader = DataLoader(TensorDataset(batches), batch_size=None, shuffle=False)
    return model, sparse, dense, loader


def _train(model, sparse, dense, loader, stop_after: int | None = None) -> list[float]:
    losses = []
    for (ids,) in loader:
        sparse.zero_grad(set_to_none=True)
        dense.zero_grad(set_to_none=True)
        loss = model(ids)
        loss.backward()
        sparse.step()
        dense.step()
        losses.append(loss.item())
        if stop_after is not None and len(losses) == stop_after:
            break
    return losses


def _state(model, sparse, dense) -> dict:
    return {"model": model.state_dict(), "sparse": sparse.state_dict()["state"], "dense": dense.state_dict()["state"]}


def _assert_bitwise(got, want, where: str = "state") -> None:
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for k in want:
            _assert_bitwise(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, torch.Tensor):
        assert torch.equal(got, want) and got.dtype == want.dtype, where
    else:  # SparseAdam's step count is a plain int
        assert type(got) is type(want) and got == want, where


def test_sparse_table_deltas_are_small_and_resume_is_bitwise(tmp_path):
    store = str(tmp_path / "ck")
    reference_objects = _objects()
    reference = _train(*reference_objects)  # no ravex
    want = copy.deepcopy(_state(*reference_objects[:3]))
    del reference_objects
    gc.collect()  # activate() adopts live objects: the reference run's must be gone
    ravex.activate(storage=store, checkpoint_every=1, keep_last=10, checkpoint_on_exit=False)
    first = _train(*_objects(), stop_after=4)  # checkpoints of steps 1..3
    ravex.flush()
    assert ravex.status()["last_written_step"] == 3
    ravex.deactivate()

    st = open_store(store)
    m = st.manifest(3, 0)
    rows = {p: e.zarr["chunk_grid"]["configuration"]["chunk_shape"][:1] for p, e in m.arrays.items()}
    small = SPARSE_CHUNK_BYTES // (DIM * 4)
    assert sum(r == [small] for r in rows.values()) == 3, rows  # one table: weight, exp_avg, exp_avg_sq
    assert rows["models/0/state/emb.weight"] == [small]
    assert rows["optimizers/0/state/emb.weight/exp_avg"] == rows["optimizers/0/state/emb.weight/exp_avg_sq"] == [small]
    assert rows["models/0/state/head.weight"] == [1] and rows["optimizers/1/state/head.weight/exp_avg"] == [1]
    tables = {p for p, e in m.arrays.items() if isinstance(e.chunks, ChunkTable)}  # 1024 chunks each: tables
    assert tables == {p for p, r in rows.items() if r == [small]}, tables
    for step in (2, 3):  # each an interval that touched 1% of the rows
        stats = st.manifest(step, 0).stats
        manifest = os.path.getsize(os.path.join(store, "steps", str(step), "rank-0.json"))
        written = stats["new_bytes"] + manifest
        assert written * 6 <= stats["logical_bytes"], (step, json.dumps(stats), manifest)

    ravex.activate(storage=store, checkpoint_every=1000, checkpoint_on_exit=False)
    objects = _objects(seed=99)  # other initial weights: only a restore makes them equal
    second = _train(*objects)
    assert ravex.status()["resumed_from"] == 3
    assert first == reference[:4] and second == reference[3:]
    _assert_bitwise(_state(*objects[:3]), want)
