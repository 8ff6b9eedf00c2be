"""A loop fed from an open file (``f.read(n)`` each step), killed after a checkpoint: Ravex cannot
hold the file's position, and the resume witness must say so. ``T_SEEK=1`` seeks to the step's
offset first, which makes the loop's data a function of its counter: the resume is then exact."""

import os
import sys

import numpy as np
import torch

import ravex

ravex.activate(storage="./ckpt", checkpoint_every=5, keep_last=3)
torch.manual_seed(0)
if not os.path.exists("data.bin"):
    np.random.default_rng(0).standard_normal(40 * 80, dtype=np.float32).tofile("data.bin")
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
kill = int(os.environ.get("T_KILL_AT", "0"))
f = open("data.bin", "rb")
for step in range(20):
    if os.environ.get("T_SEEK"):
        f.seek(step * 4 * 80)
    x = torch.from_numpy(np.frombuffer(f.read(4 * 80), dtype=np.float32).copy()).view(10, 8)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"STEP {step + 1}", flush=True)
    if step + 1 == kill:
        ravex.flush()
        print("BLOCKED", flush=True)
        sys.stdin.read()
