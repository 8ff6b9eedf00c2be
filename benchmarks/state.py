"""Training states to checkpoint: a stack of Linear layers plus AdamW, built with torch.

Every contender in one run checkpoints the very same tensors. The weights have
taken a few optimizer steps (not a fresh init only) and the AdamW moments exist
and are non-trivial, so compression sees what a real run would give it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

LAYERS = 20
MIB = 1 << 20


@dataclass
class TrainState:
    """A model + optimizer being trained, and how to advance and snapshot it."""

    model: torch.nn.Sequential
    optimizer: torch.optim.Optimizer
    width: int
    frozen_layers: int

    def torch_state(self) -> dict[str, Any]:
        """``{"model": state_dict, "optim": state_dict}`` as torch would save it."""
        return {"model": self.model.state_dict(), "optim": self.optimizer.state_dict()}

    def train(self, steps: int, seed: int = 1) -> None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x = torch.randn(16, self.width, generator=gen)
            loss = self.model(x).square().mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # grads are not checkpoint state: free them

    @property
    def trainable_params(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]


def width_for(total_bytes: int, moments: int = 2) -> int:
    """Layer width so that LAYERS fp32 ``width x width`` weights plus ``moments`` copies
    of them (AdamW's exp_avg, exp_avg_sq) come to about ``total_bytes``."""
    per_layer = total_bytes / (LAYERS * (1 + moments) * 4)
    return max(64, int(math.sqrt(per_layer)) // 64 * 64)


def build(total_mib: float, frozen_fraction: float = 0.0, steps: int = 3, seed: int = 0) -> TrainState:
    """A model whose checkpoint (weights + AdamW moments of the trainable part) is about
    ``total_mib`` MiB when nothing is frozen. With ``frozen_fraction`` the first layers are
    frozen: they keep their weights and get no optimizer state, as in fine-tuning."""
    torch.manual_seed(seed)
    width = width_for(int(total_mib * MIB))
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        lin = torch.nn.Linear(width, width)
        torch.nn.init.normal_(lin.weight, std=1.0 / math.sqrt(width))
        layers.append(lin)
        layers.append(torch.nn.Tanh())
    model = torch.nn.Sequential(*layers)
    frozen = round(LAYERS * frozen_fraction)
    for i, module in enumerate(model[0::2]):
        if i < frozen:
            module.requires_grad_(False)
    state = TrainState(model, None, width, frozen)  # type: ignore[arg-type]
    state.optimizer = torch.optim.AdamW(state.trainable_params, lr=1e-3, weight_decay=0.01)
    state.train(steps, seed=seed + 1)
    return state


# ---- conversions -----------------------------------------------------------------------


def to_numpy_tree(tree: Any) -> Any:
    """The same tree with every tensor replaced by a zero-copy numpy view (what Ravex takes)."""
    if isinstance(tree, torch.Tensor):
        t = tree.detach()
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.contiguous().numpy()
    if isinstance(tree, dict):
        return {k: to_numpy_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [to_numpy_tree(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(to_numpy_tree(v) for v in tree)
    return tree


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.0.c": leaf}`` for every leaf of a nested dict/list tree."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix: tree}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def leaves(tree: Any, prefix: tuple = ()) -> dict[tuple, Any]:
    """``{("a", "b", 0): leaf}`` for every leaf, keys kept as they are (no joining)."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {prefix: tree}
    out: dict[tuple, Any] = {}
    for k, v in items:
        out.update(leaves(v, (*prefix, k)))
    return out


def tensor_bytes(tree: Any) -> int:
    return sum(v.nbytes for v in flatten(tree).values() if isinstance(v, (torch.Tensor, np.ndarray)))


def clone_tree(tree: Any) -> Any:
    """A deep copy with fresh tensors (a snapshot that training will not mutate)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: clone_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [clone_tree(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(clone_tree(v) for v in tree)
    return tree


def empty_like_tree(tree: Any) -> Any:
    """Same structure with zero-filled (already faulted-in) tensors: a load target."""
    if isinstance(tree, torch.Tensor):
        return torch.zeros_like(tree)
    if isinstance(tree, dict):
        return {k: empty_like_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [empty_like_tree(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(empty_like_tree(v) for v in tree)
    return tree


class SparseTable:
    """``nn.Embedding(sparse=True)`` + ``SparseAdam``; each interval updates ~1% of the rows,
    drawn without replacement with Zipf(s) weights over a fixed random order of the rows
    (hot ids are scattered over the table, as hashed ids are)."""

    def __init__(self, rows: int, dim: int, frac: float = 0.01, s: float = 1.05, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(rows, dim, sparse=True)
        self.opt = torch.optim.SparseAdam(self.emb.parameters(), lr=1e-3)
        self.rng = np.random.default_rng(seed)
        self.perm = self.rng.permutation(rows)
        self.logp = -s * np.log(np.arange(1, rows + 1, dtype=np.float64))
        self.k = max(1, int(rows * frac))
        self.interval()  # SparseAdam's moments exist from here on

    def interval(self) -> np.ndarray:
        # Gumbel top-k: k distinct rows, each drawn with probability proportional to its Zipf weight
        keys = self.logp - np.log(-np.log(self.rng.random(self.logp.size)))
        ranks = np.argpartition(keys, -self.k)[-self.k:]
        ids = torch.from_numpy(self.perm[ranks])
        loss = self.emb(ids).square().sum()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return ids.numpy()

    def torch_state(self) -> dict[str, Any]:
        return {"model": self.emb.state_dict(), "optim": self.opt.state_dict()}
