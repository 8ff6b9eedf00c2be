"""nanoGPT's ending, its bound from the command line: a module-level ``while True`` left by
``if iter_num > max_iters: break`` at the end of its body (and an ``eval_only`` break near its
top), ``ckpt.pt`` written inside the loop when the validation loss improves, the best loss
printed after the loop. ``T_BOUND`` is ``max_iters``; the LR schedule does not depend on it."""

import os

from probe import done_step, entry, finish, say

entry()

import math  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

VOCAB, BLOCK, BATCH = 40, 8, 4
max_iters = int(os.environ["T_BOUND"])
eval_interval, eval_iters, warmup_iters, lr_decay_iters = 4, 2, 3, 60
eval_only = False
torch.manual_seed(1337)
data = torch.randint(0, VOCAB, (3000,), generator=torch.Generator().manual_seed(3))
train_data, val_data = data[:2500], data[2500:]


def get_batch(split):
    source = train_data if split == "train" else val_data
    ix = torch.randint(len(source) - BLOCK - 1, (BATCH,))
    x = torch.stack([source[i:i + BLOCK] for i in ix])
    y = torch.stack([source[i + 1:i + 1 + BLOCK] for i in ix])
    return x, y


model = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Dropout(0.2), nn.Linear(16, VOCAB))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def get_lr(it):
    if it < warmup_iters:
        return 1e-2 * (it + 1) / (warmup_iters + 1)
    ratio = min(1.0, (it - warmup_iters) / (lr_decay_iters - warmup_iters))
    return 1e-3 + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1e-2 - 1e-3)


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(eval_iters)
    for k in range(eval_iters):
        x, y = get_batch("val")
        losses[k] = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1)).item()
    model.train()
    return losses.mean().item()


iter_num = 0
best_val_loss = 1e9
X, Y = get_batch("train")
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0:
        val = estimate_loss()
        say(f"EVAL {iter_num} {val.hex()}")
        if val < best_val_loss:
            best_val_loss = val
            torch.save({"model": model.state_dict(), "iter_num": iter_num}, "ckpt.pt")
    if iter_num == 0 and eval_only:
        break
    logits = model(X)
    loss = F.cross_entropy(logits.view(-1, VOCAB), Y.view(-1))
    X, Y = get_batch("train")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    say(f"STEP {iter_num} {loss.item().hex()}")
    done_step()
    iter_num += 1
    if iter_num > max_iters:
        break

say(f"RESULT {iter_num} {best_val_loss.hex()} {sum(p.sum().item() for p in model.parameters()).hex()}")
finish(model=model.state_dict(), optimizer=optimizer.state_dict(), iter_num=iter_num,
       best_val_loss=best_val_loss)
