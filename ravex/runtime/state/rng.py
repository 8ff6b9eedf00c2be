"""The random number generators a training step draws from: captured into a checkpoint,
restored on resume, and a DataLoader's own per epoch (worker seeds, shuffle order)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ravex.saving.dtypes import as_tensor


def capture_rng() -> dict[str, Any]:
    """Every RNG stream a training step draws from. CUDA only if already initialised."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    cuda: list[torch.Tensor] = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        cuda = list(torch.cuda.get_rng_state_all())
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": keys, "pos": int(pos), "has_gauss": int(has_gauss),
                  "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def restore_rng(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss_next))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    torch.set_rng_state(as_tensor(state["torch"]).to(torch.uint8))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([as_tensor(s).to(torch.uint8) for s in state["cuda"]])


def capture_epoch_rng(loader: Any) -> dict[str, Any]:
    """The RNG a DataLoader draws from when an epoch starts (worker seed, shuffle order)."""
    out: dict[str, Any] = {"torch": torch.get_rng_state()}
    for name, gen in loader_generators(loader):
        out[name] = gen.get_state()
    return out


def restore_epoch_rng(loader: Any, state: dict[str, Any]) -> None:
    torch.set_rng_state(as_tensor(state["torch"]).to(torch.uint8))
    restore_generators(loader, state)


def capture_generators(loader: Any) -> dict[str, Any]:
    """The states of ``loader``'s own generators now: a checkpoint at the end of an epoch
    holds them, since the rerun passes that epoch by without the draws that moved them."""
    return {name: gen.get_state() for name, gen in loader_generators(loader)}


def restore_generators(loader: Any, state: dict[str, Any]) -> None:
    for name, gen in loader_generators(loader):
        if state.get(name) is not None:
            gen.set_state(as_tensor(state[name]).to(torch.uint8))


#: how deep samplers wrapped in samplers are searched for their generators
_SAMPLER_DEPTH = 4


def loader_generators(loader: Any) -> list[tuple[str, torch.Generator]]:
    """The generators ``loader`` draws its order from, by name: its own, its sampler's, and
    those of samplers wrapped in its batch sampler (Accelerate's ``BatchSamplerShard`` holds
    a ``BatchSampler`` whose ``RandomSampler`` has a generator of its own), each named by the
    attributes that reach it."""
    gens = []
    seen: set[int] = set()
    owners: list[tuple[str, Any, int]] = [("", loader, 0)]
    while owners:
        path, owner, depth = owners.pop(0)
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator) and id(gen) not in seen:
            seen.add(id(gen))
            gens.append((_generator_name(path), gen))
        if depth < _SAMPLER_DEPTH:
            for attr in ("sampler", "batch_sampler"):
                inner = getattr(owner, attr, None)
                if inner is not None and inner is not owner:
                    owners.append((f"{path}.{attr}" if path else attr, inner, depth + 1))
    return gens


def _generator_name(path: str) -> str:
    """``generator``, ``sampler_generator``, ``batch_sampler_generator`` (the batch sampler's
    sampler's, as they were always named), else the path: ``batch_sampler.batch_sampler.sampler``."""
    return {"": "generator", "sampler": "sampler_generator",
            "batch_sampler.sampler": "batch_sampler_generator"}.get(path, f"{path}.generator")
