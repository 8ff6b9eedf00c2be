"""A DCP save or load at any world size, launched by the tests with ``torchrun`` (gloo, CPU).

``python dcp_worker.py save|load STORE OUT``: the model is FSDP2-sharded (``fully_shard``, so
its parameters and AdamW state are DTensors sharded on dimension 0) when the world has several
ranks, plain otherwise. ``save`` trains two steps and saves through ``RavexStorageWriter``;
``load`` builds a model from another seed, loads through ``RavexStorageReader``. Both write the
full state, as rank 0 gathers it, to ``OUT/<mode>.pt`` for the test to compare bit for bit.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ravex.integrations.dcp import RavexStorageReader, RavexStorageWriter


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    # 7 rows: at 2 ranks FSDP2 shards them 4 + 3, so chunk boundaries must divide 4
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 7))
    world = dist.get_world_size()
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def columns(fill: torch.Tensor) -> torch.Tensor:
    """A tensor sharded along dimension 1 at several ranks (stored one array per piece)."""
    world = dist.get_world_size()
    if world == 1:
        return fill
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    return distribute_tensor(fill, init_device_mesh("cpu", (world,)), [Shard(1)])


def main() -> None:
    mode, store, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "save":
        model, opt = build(0)
        gen = torch.Generator().manual_seed(1)
        for _ in range(2):
            x = torch.randn(8, 6, generator=gen)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        msd, osd = get_state_dict(model, opt)
        cols = columns(torch.arange(24, dtype=torch.float64).reshape(4, 6))
        state = {"model": msd, "optim": osd, "meta": {"epoch": 3, "tag": "dcp"}, "cols": cols}
        dcp.save(state, storage_writer=RavexStorageWriter(store))
    else:
        model, opt = build(123)
        msd, osd = get_state_dict(model, opt)
        cols = columns(torch.zeros(4, 6, dtype=torch.float64))
        state = {"model": msd, "optim": osd, "meta": {"epoch": 0, "tag": ""}, "cols": cols}
        dcp.load(state, storage_reader=RavexStorageReader(store))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    cols = state["cols"]
    cols = cols.full_tensor() if hasattr(cols, "full_tensor") else cols
    if rank == 0:
        result = {"model": full[0], "optim": full[1], "meta": state["meta"], "cols": cols}
        torch.save(result, os.path.join(out, f"{mode}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
