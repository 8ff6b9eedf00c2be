"""``torch.distributed.checkpoint`` through Ravex stores: round trips bit-exact in one process and
under real ``torchrun`` (gloo, CPU) resharded 2 -> 1 and 1 -> 2 ranks, delta reuse across saves,
and the store as every other reader sees it (the CLI, stock zarr through ``refs.json``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ravex.format import open_store
from ravex.integrations.dcp import DOC_KEY, RavexStorageReader, RavexStorageWriter

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("dcp_worker.py")
WATCHDOG_S = 240  # a safety net against a hung job


def same(a: Any, b: Any, where: str = "") -> None:
    """Equal trees, tensors bit for bit (dtype included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (where, list(a), list(b))
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAVEX_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC"))}
    env["PYTHONPATH"] = str(ROOT)
    env["OMP_NUM_THREADS"] = "1"
    return env


def torchrun(nproc: int, mode: str, store: Path, out: Path) -> None:
    """``python -m torch.distributed.run`` the worker; every rank is killed if it hangs."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            str(WORKER), mode, str(store), str(out)]
    proc = subprocess.Popen(argv, cwd=out, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=WATCHDOG_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output[-6000:]


def cli(*args: str) -> tuple[int, Any]:
    proc = subprocess.run([sys.executable, "-m", "ravex", *args], capture_output=True, text=True,
                          env=clean_env(), timeout=120)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.Tanh(), torch.nn.Linear(9, 3))
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model, opt = model_and_optimizer(seed)
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        model(torch.randn(4, 5, generator=gen)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


@pytest.fixture
def gloo_world_1(tmp_path):
    """A real gloo process group of one rank in this process, torn down afterwards."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_round_trip_in_one_process_is_bit_exact(tmp_path, gloo_world_1):
    store = tmp_path / "ckpt"
    model, opt = trained()
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "meta": {"epoch": 2, "seen": (1, 2.5, None, b"\x00")}},
             storage_writer=RavexStorageWriter(store))

    fresh, fresh_opt = model_and_optimizer(99)
    msd2, osd2 = get_state_dict(fresh, fresh_opt)
    state = {"model": msd2, "optim": osd2, "meta": {"epoch": 0, "seen": ()}}
    dcp.load(state, storage_reader=RavexStorageReader(store))
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    same(model.state_dict(), fresh.state_dict())
    same(opt.state_dict(), fresh_opt.state_dict())
    assert state["meta"] == {"epoch": 2, "seen": (1, 2.5, None, b"\x00")}

    reader = open_store(store).open_step("latest")
    assert reader.step == 0 and reader.world_size == 1
    assert {"model/0.weight", "model/2.bias", "optim/state/0.weight/exp_avg"} <= set(reader.arrays)
    assert DOC_KEY in reader.metadata
    np.testing.assert_array_equal(reader.read_array("model/0.weight"), model[0].weight.detach().numpy())
    assert reader.read()["meta"] == {"epoch": 2, "seen": (1, 2.5, None, b"\x00")}


def _objects(store: Path) -> set[str]:
    return {p.name for p in (store / "objects").rglob("*") if p.is_file()}


def test_a_second_save_writes_only_changed_chunks(tmp_path, gloo_world_1):
    store = tmp_path / "ckpt"
    big = {"a": torch.randn(400, 300), "b": torch.randn(400, 300), "step": 1}
    dcp.save(big, storage_writer=RavexStorageWriter(store))
    first = _objects(store)
    assert len(first) == 2  # 480 KB each: an object apiece

    dcp.save(big, storage_writer=RavexStorageWriter(store))
    assert _objects(store) == first
    stats = open_store(store).open_step(1).manifests[0].stats
    assert stats["new_chunks"] == 0 and stats["new_bytes"] == 0 and stats["reused_chunks"] == 2

    big["b"][7, 3] += 1.0
    dcp.save(big, storage_writer=RavexStorageWriter(store, step=10))
    assert len(_objects(store) - first) == 1
    reader = open_store(store).open_step("latest")
    assert reader.step == 10 and reader.manifests[0].stats["new_chunks"] == 1
    np.testing.assert_array_equal(reader.read_array("b"), big["b"].numpy())

    dcp.save(big, storage_writer=RavexStorageWriter(store))  # the next number after 10
    assert open_store(store).latest_step() == 11


def test_a_value_ravex_cannot_store_is_refused_by_name(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: "no process group, assuming one process"
        # DCP reports each rank's error inside its own CheckpointException
        with pytest.raises(CheckpointException, match=r"'meta.when': a set is neither a tensor nor a plain value"):
            dcp.save({"w": torch.ones(2), "meta": {"when": {1, 2}}},
                     storage_writer=RavexStorageWriter(tmp_path / "ckpt"))
    assert not (tmp_path / "ckpt" / "steps" / "0" / "rank-0.json").exists()


def test_a_step_written_without_dcp_is_refused_with_the_way_to_read_it(tmp_path):
    store = open_store(tmp_path / "ckpt", create=True)
    with store.writer() as w:
        w.commit(1, {"w": np.ones(3, "float32")})
    with pytest.raises(ValueError, match=r"not written by RavexStorageWriter.*ravex\.load"):
        RavexStorageReader(tmp_path / "ckpt").read_metadata()


@pytest.fixture(scope="module")
def saved_at_2(tmp_path_factory):
    """A 2-rank FSDP2 save (dimension-0 shards), with a tensor sharded on dimension 1 and one
    whose second shard is empty."""
    out = tmp_path_factory.mktemp("dcp-2")
    torchrun(2, "save", out / "store", out)
    return out


def test_save_at_2_ranks_loads_at_1(saved_at_2, tmp_path):
    torchrun(1, "load", saved_at_2 / "store", tmp_path)
    saved = torch.load(saved_at_2 / "save.pt", weights_only=False)
    same(saved, torch.load(tmp_path / "load.pt", weights_only=False))
    assert saved["meta"] == {"epoch": 3, "tag": "dcp"}


def test_a_dimension_0_shard_is_one_global_array(saved_at_2):
    reader = open_store(saved_at_2 / "store").open_step("latest")
    saved = torch.load(saved_at_2 / "save.pt", weights_only=False)
    assert reader.world_size == 2
    for rank, m in enumerate(reader.manifests):  # each rank holds its own rows' chunks
        assert set(m.arrays["model/2.weight"].chunks) == {f"c/{rank}/0"}
    assert reader.arrays["model/2.weight"].shape == (7, 10)  # FSDP2: rows 4 + 3
    np.testing.assert_array_equal(reader.read_array("model/2.weight"), saved["model"]["2.weight"].numpy())
    np.testing.assert_array_equal(
        reader.read_array("optim/state/2.weight/exp_avg"), saved["optim"]["state"]["2.weight"]["exp_avg"].numpy()
    )
    # sharded on dimension 1: one array per piece, named by its offsets in the global tensor
    assert {"extra/cols/offset-0.0", "extra/cols/offset-0.3"} <= set(reader.arrays)
    assert reader.arrays["extra/tiny"].shape == (1, 3)  # rank 1's shard is empty
    assert reader.arrays["extra/tiny"].chunk_shape == (1, 3)  # a chunk is stored padded: no spare rows
    assert reader.arrays["model/2.weight"].chunk_shape == (4, 10)  # divides the shard boundary at row 4
    # rank 0's tree names every tensor of the model and optimizer
    tree = reader.tree(0)
    assert set(tree["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert set(tree["optim"]["state"]["0.bias"]) == {"exp_avg", "exp_avg_sq", "step"}


def test_the_cli_reads_a_dcp_store(saved_at_2):
    url = str(saved_at_2 / "store")
    rc, ls = cli("ls", "--json", url)
    assert rc == 0 and [(s["step"], s["complete"], s["world_size"]) for s in ls["steps"]] == [(0, True, 2)], ls
    rc, report = cli("validate", "--full", "--json", url)
    assert rc == 0 and report["ok"] and report["steps_checked"] == [0], report
    rc, shown = cli("show", "--json", f"{url}@latest", "model/2.weight")
    assert rc == 0 and "model/2.weight" in json.dumps(shown), shown
    rc, diff = cli("diff", "--json", f"{url}@0", "0")
    arrays = len(open_store(url).open_step(0).arrays)  # 16 of model and optimizer, 2 pieces of cols, tiny
    assert rc == 0 and diff["summary"] == {"unchanged": arrays} and arrays == 19, diff


def test_stock_zarr_reads_a_tensor_through_refs_json(saved_at_2, tmp_path):
    root = saved_at_2 / "store"
    assert (root / "steps" / "0" / "refs.json").exists()
    code = f"""
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ravex", "torch"):
            raise ImportError(name + " is blocked in this test")
sys.meta_path.insert(0, _Block())
import numpy as np, zarr
root = {str(root)!r}
array = zarr.open_array("reference://", path="model/2.weight", mode="r", storage_options={{
    "fo": root + "/steps/0/refs.json", "template_overrides": {{"u": root}}}})
np.save({str(tmp_path / "w.npy")!r}, array[...])
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    saved = torch.load(saved_at_2 / "save.pt", weights_only=False)
    got = np.load(tmp_path / "w.npy")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, saved["model"]["2.weight"].numpy())


def test_save_at_1_rank_loads_at_2(tmp_path):
    torchrun(1, "save", tmp_path / "store", tmp_path)
    saved = torch.load(tmp_path / "save.pt", weights_only=False)
    (tmp_path / "save.pt").rename(tmp_path / "saved.pt")
    torchrun(2, "load", tmp_path / "store", tmp_path)
    same(saved, torch.load(tmp_path / "load.pt", weights_only=False))


async def _settle(pilot: Any) -> None:
    """Until no worker of the app runs and every message they posted is handled."""
    app = pilot.app
    for _ in range(20):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not any(w.is_running for w in app.workers):
            await pilot.pause()
            if not any(w.is_running for w in app.workers):
                return
    raise AssertionError("workers never settled")


def test_the_inspector_opens_a_dcp_store(saved_at_2):
    from ravex.tui.app import InspectorApp
    from ravex.tui.widgets import TensorTree

    async def drive() -> None:
        app = InspectorApp(str(saved_at_2 / "store"))
        async with app.run_test(size=(100, 30)) as pilot:
            await _settle(pilot)
            assert [s.step for s in app.summaries] == [0] and app.step == 0
            groups = [str(n.label).split(" ")[0] for n in app.query_one(TensorTree).root.children]
            assert groups == ["extra", "meta", "model", "optim"], groups

    asyncio.run(drive())
