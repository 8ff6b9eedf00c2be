"""PyTorch's DDP tutorial shape: ``torch.multiprocessing.spawn`` starts the ranks (not torchrun),
each rank creates its process group with its rank, and a ``Trainer`` class of the script runs
the epochs, its counter on ``self``; gloo on the CPU, a DistributedSampler, AdamW.

``T_ENTRY=activate``: ``ravex.activate()`` on the script's first line (run again by every rank,
which imports the script as ``__mp_main__``); ``enable``: nothing here, ``ravex enable``'s hook;
``none``: plain torch. ``T_PORT``: the rendezvous port. ``T_BLOCK_AT=<n>``: after step n every
rank flushes, rank 0 prints ``BLOCKED`` once both did, and they wait to be SIGKILLed.
``T_OUT``: where rank 0 saves the final state. Prints ``LOSS <rank> <step> <hex>``.
"""

import os

if os.environ.get("T_ENTRY") == "activate":
    import ravex

    ravex.activate()

import threading

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

WORLD, EPOCHS = 2, 3


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


class Trainer:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        torch.manual_seed(0)
        self.model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(3)
        data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 4, generator=g))
        self.sampler = DistributedSampler(data, shuffle=True, seed=5)
        self.loader = DataLoader(data, batch_size=4, sampler=self.sampler)
        self.steps = 0
        self.block_at = int(os.environ.get("T_BLOCK_AT", "0"))

    def train(self) -> None:
        for epoch in range(EPOCHS):
            self.sampler.set_epoch(epoch)
            for x, y in self.loader:
                self.opt.zero_grad()
                loss = ((self.model(x) - y) ** 2).mean()
                loss.backward()
                self.opt.step()
                self.steps += 1
                say(f"LOSS {self.rank} {self.steps} {loss.item().hex()}")
                if self.steps == self.block_at:
                    import ravex

                    ravex.flush()
                    dist.barrier()
                    if self.rank == 0:
                        say("BLOCKED")
                    threading.Event().wait()


def main(rank: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['T_PORT']}",
                            rank=rank, world_size=WORLD)
    trainer = Trainer(rank)
    trainer.train()
    if rank == 0 and os.environ.get("T_OUT"):
        torch.save({"model": trainer.model.module.state_dict(), "opt": trainer.opt.state_dict()},
                   os.environ["T_OUT"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(main, nprocs=WORLD)
