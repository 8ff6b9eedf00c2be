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


def extra(fill: float) -> dict[str, torch.Tensor]:
    """Tensors sharded otherwise than FSDP2 does at several ranks: along dimension 1 (stored one
    array per piece) and one row along dimension 0 (the other rank's shard is empty)."""
    cols = torch.arange(24, dtype=torch.float64).reshape(4, 6) * fill
    tiny = torch.arange(3, dtype=torch.int64).reshape(1, 3) * int(fill)
    world = dist.get_world_size()
    if world == 1:
        return {"cols": cols, "tiny": tiny}
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    return {"cols": distribute_tensor(cols, mesh, [Shard(1)]), "tiny": distribute_tensor(tiny, mesh, [Shard(0)])}


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
        state = {"model": msd, "optim": osd, "meta": {"epoch": 3, "tag": "dcp"}, "extra": extra(1.0)}
        dcp.save(state, storage_writer=RavexStorageWriter(store))
    else:
        model, opt = build(123)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "meta": {"epoch": 0, "tag": ""}, "extra": extra(0.0)}
        dcp.load(state, storage_reader=RavexStorageReader(store))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    whole = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state["extra"].items()}
    if rank == 0:
        result = {"model": full[0], "optim": full[1], "meta": state["meta"], "extra": whole}
        torch.save(result, os.path.join(out, f"{mode}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
