"""The training script ``python -m benchmarks gpu`` kills and reruns: a small GPT (dropout, AdamW)
under autocast on one device, Ravex active (``ravex.activate()``, its settings from ``RAVEX_*``).

Environment:

``G_DEVICE``         ``cuda`` (the default) or ``cpu`` (the CPU rehearsal)
``G_AMP``            ``bf16``: bf16 autocast; ``fp16``: fp16 autocast and a ``GradScaler``
``G_STEPS``          optimizer steps in all
``G_KILL_AT``        SIGKILL this process right after that step (0: never)
``G_DETERMINISTIC``  ``1``: ``torch.use_deterministic_algorithms`` and cuBLAS's fixed workspace
``G_OUT``            where the final state goes (``torch.save`` of CPU tensors)

Prints ``STEP <n> <loss.hex()>`` per step.
"""

import os
import signal

if os.environ.get("G_DETERMINISTIC", "1") == "1":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
from torch import nn

import ravex

ravex.activate()

DEVICE = os.environ.get("G_DEVICE", "cuda")
AMP = os.environ.get("G_AMP", "bf16")
STEPS = int(os.environ.get("G_STEPS", "30"))
KILL_AT = int(os.environ.get("G_KILL_AT", "0"))
VOCAB, WIDTH, HEADS, CONTEXT, BATCH = 256, 128, 4, 32, 8

if os.environ.get("G_DETERMINISTIC", "1") == "1":
    torch.use_deterministic_algorithms(True)


class Block(nn.Module):
    """Causal self-attention written out (no fused attention kernel, whose backward may not be
    deterministic on a GPU) and an MLP, each with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.attn_drop = nn.Dropout(0.1)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH), nn.Dropout(0.1))
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.register_buffer("mask", torch.tril(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (y.view(b, t, HEADS, c // HEADS).transpose(1, 2) for y in self.qkv(self.ln1(x)).split(c, dim=2))
        att = ((q @ k.transpose(-2, -1)) * (c // HEADS) ** -0.5).masked_fill(~self.mask[:t, :t], float("-inf"))
        y = (self.attn_drop(att.softmax(-1)) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.blocks(self.drop(self.embed(tokens[:, :-1]))))
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))


def main() -> None:
    torch.manual_seed(0)
    model = TinyGPT().to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler(DEVICE, enabled=AMP == "fp16")
    dtype = torch.bfloat16 if AMP == "bf16" else torch.float16
    step = 0
    while step < STEPS:
        tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), device=DEVICE)
        with torch.autocast(DEVICE, dtype=dtype):
            loss = model(tokens)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        step += 1
        os.write(1, f"STEP {step} {loss.item().hex()}\n".encode())
        if step == KILL_AT:
            ravex.flush()  # the checkpoint before is durable; the kill itself is the test
            os.kill(os.getpid(), signal.SIGKILL)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "scaler": scaler.state_dict()}
    torch.save(_to_cpu(state), os.environ["G_OUT"])


def _to_cpu(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


if __name__ == "__main__":
    main()
