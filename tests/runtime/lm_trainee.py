"""A language-model trainee of word_language_model's shape, run as a subprocess by
test_loops.py: a module-level epoch loop, ``train()`` iterating
``enumerate(range(0, n, bptt))`` over batches sliced by hand (no DataLoader), a per-epoch
evaluation, and either an optimizer or parameters updated by hand.

Environment:

``T_ENTRY``     ``activate`` (``ravex.activate()``) or ``none`` (plain torch, the reference)
``T_LOOP``      ``1``: both loops wrapped in ``ravex.loop`` (the one-line change per loop)
``T_SGD``       ``1``: hand-written SGD, no ``torch.optim`` optimizer
``T_BLOCK_AT``  ``step:<n>``: after that step flush ravex, print ``BLOCKED`` and block
                reading stdin, so that the test SIGKILLs a process known to be there
``T_OUT``       where to write the final state (torch.save of plain dicts)

Prints ``LOSS <float.hex>`` per step and ``EPOCH <e> VAL <float.hex>`` per epoch.
"""

import os
import sys

if os.environ.get("T_ENTRY") == "activate":
    import ravex

    ravex.activate()
else:
    import ravex

import torch
from torch import nn

LOOP = os.environ.get("T_LOOP") == "1"
SGD = os.environ.get("T_SGD") == "1"
BLOCK_AT = os.environ.get("T_BLOCK_AT", "")
EPOCHS, BPTT, BATCH, VOCAB, LR = 3, 5, 4, 32, 0.5

loop = ravex.loop if LOOP else (lambda iterable: iterable)


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    n = data.size(0) // bsz
    return data[: n * bsz].view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, 16)
        self.drop = nn.Dropout(0.3)
        self.decoder = nn.Linear(16, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.drop(self.encoder(x))).view(-1, VOCAB)


torch.manual_seed(0)
corpus = torch.randint(0, VOCAB, (600,), generator=torch.Generator().manual_seed(7))
train_data = batchify(corpus[:480], BATCH)  # 120 rows: 24 batches an epoch
val_data = batchify(corpus[480:], BATCH)
model = TinyLM()
criterion = nn.NLLLoss()
optimizer = None if SGD else torch.optim.AdamW(model.parameters(), lr=0.01)
step = 0


def train() -> None:
    global step
    model.train()
    for batch, i in loop(enumerate(range(0, train_data.size(0) - 1, BPTT))):  # the inner loop
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        loss = criterion(torch.log_softmax(model(data), dim=-1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        if optimizer is not None:
            optimizer.step()
        else:
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-LR)
        step += 1
        say(f"LOSS {loss.item().hex()} batch {batch}")
        if BLOCK_AT == f"step:{step}":
            rv = sys.modules.get("ravex")
            if rv is not None:
                rv.flush()
            say(f"BLOCKED {BLOCK_AT}")
            sys.stdin.read()  # the test SIGKILLs us here


def evaluate(source: torch.Tensor) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, BPTT):
            data, targets = get_batch(source, i)
            total += len(data) * criterion(torch.log_softmax(model(data), dim=-1), targets).item()
    return total / (len(source) - 1)


for epoch in loop(range(1, EPOCHS + 1)):
    train()
    say(f"EPOCH {epoch} VAL {evaluate(val_data).hex()}")

out = os.environ.get("T_OUT")
if out:
    torch.save({"model": model.state_dict(),
                "opt": optimizer.state_dict() if optimizer is not None else None}, out)
say("FINISHED")
