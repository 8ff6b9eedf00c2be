"""torch.distributed.checkpoint into a Ravex store, and back at another world size.

    python examples/dcp_save_load.py ./dcp-ckpt                                  # one process
    torchrun --nproc-per-node 2 examples/dcp_save_load.py ./dcp-ckpt             # FSDP2, 2 ranks

Each run loads the newest step if there is one (whatever world size wrote it), trains a few
steps and saves the next step. Then `ravex ls ./dcp-ckpt`, `ravex show latest model/0.weight`,
`ravex diff 0 1` and `ravex inspect ./dcp-ckpt` read what DCP wrote.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ravex.format import StoreNotFoundError, open_store
from ravex.integrations.dcp import RavexStorageReader, RavexStorageWriter


def main() -> None:
    store = sys.argv[1] if len(sys.argv) > 1 else "./dcp-ckpt"
    if "RANK" in os.environ:  # under torchrun
        dist.init_process_group("gloo")
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    if world > 1:  # parameters and optimizer state become dimension-0 shards (DTensor)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "progress": {"epoch": 0}}
    try:
        latest = open_store(store).latest_step()
    except StoreNotFoundError:
        latest = None
    if latest is not None:  # resharded by DCP's planner to this run's world size
        dcp.load(state, storage_reader=RavexStorageReader(store, step=latest))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    for _ in range(5):
        loss = model(torch.randn(8, 16)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    model_sd, optim_sd = get_state_dict(model, opt)
    epoch = state["progress"]["epoch"] + 1
    dcp.save(
        {"model": model_sd, "optim": optim_sd, "progress": {"epoch": epoch}},
        storage_writer=RavexStorageWriter(store),  # the next step number; step=N to choose
    )
    if rank == 0:
        print(f"epoch {epoch} saved to {store} as step {open_store(store).latest_step()} from {world} rank(s)")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
