"""A training loop in the shape of a library's (as HF Trainer runs its own), in a module of
the user's, used by loopless_trainee.py's ``framework`` shape: Ravex re-enters it like a loop
of the main script. An epoch that yields no batch is taken for empty data."""

import os

import torch


def fit(model, optimizer, loader, epochs: int, die_at: int | None = None) -> int:
    """Train; return the steps run. Stops at the first epoch without a batch; after step
    ``die_at`` flushes Ravex and ends the process at once (a kill with the checkpoints done)."""
    steps = 0
    for _epoch in range(epochs):
        batches = 0
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            steps += 1
            batches += 1
            print(f"STEP {steps}", flush=True)
            if steps == die_at:
                import ravex

                ravex.flush()
                os._exit(0)
        if batches == 0:
            print("EMPTY EPOCH: stopping", flush=True)
            break
    return steps
