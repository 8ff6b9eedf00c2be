"""nanoGPT's shape under torchrun: a module-level ``while True:`` whose counter ``iter_num``
is a global, a batch fetched ahead into ``X, Y``, gradient accumulation with DDP's
``require_backward_grad_sync`` off on all but the last micro-step, a per-rank seed offset.
No DataLoader and no ``ravex.loop``: a rerun must find the loop's position by itself.

``T_ENTRY=activate`` activates Ravex first; ``T_BLOCK_AT=<n>``: after iteration n every rank
flushes, prints ``BLOCKED <rank>`` and waits (the test SIGKILLs the job). Prints
``LOSS <rank> <iter_num> <hex>`` per iteration; rank 0 saves the final state to ``T_OUT``."""

import os

if os.environ.get("T_ENTRY") == "activate":
    import ravex

    ravex.activate()

import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(1337 + rank)
VOCAB, BLOCK, BATCH, ACCUM, MAX_ITERS = 32, 8, 4, 2, 21
data = torch.randint(0, VOCAB, (2000,), generator=torch.Generator().manual_seed(3))


def get_batch():
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
    return torch.stack([data[i:i + BLOCK] for i in ix]), torch.stack([data[i + 1:i + 1 + BLOCK] for i in ix])


def say(line):
    os.write(1, (line + "\n").encode())


model = DDP(nn.Sequential(nn.Embedding(VOCAB, 16), nn.Dropout(0.1), nn.Linear(16, VOCAB)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
block_at = int(os.environ.get("T_BLOCK_AT", "0") or 0)

iter_num = 0
X, Y = get_batch()
while True:
    for param_group in optimizer.param_groups:
        param_group["lr"] = 1e-2 * min(1.0, (iter_num + 1) / 5)
    for micro_step in range(ACCUM):
        model.require_backward_grad_sync = micro_step == ACCUM - 1
        logits = model(X)
        loss = F.cross_entropy(logits.view(-1, VOCAB), Y.view(-1)) / ACCUM
        X, Y = get_batch()
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    say(f"LOSS {rank} {iter_num} {loss.item().hex()}")
    if iter_num == block_at and block_at:
        ravex.flush()
        say(f"BLOCKED {rank}")
        threading.Event().wait()
    iter_num += 1
    if iter_num > MAX_ITERS:
        break

out = os.environ.get("T_OUT")
if out and rank == 0:
    torch.save({"model": model.module.state_dict(), "opt": optimizer.state_dict(), "iter_num": iter_num}, out)
dist.barrier()
dist.destroy_process_group()
