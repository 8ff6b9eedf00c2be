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


def loader_generators(loader: Any) -> list[tuple[str, torch.Generator]]:
    gens = []
    seen: set[int] = set()
    for name, owner in (("generator", loader), ("sampler_generator", getattr(loader, "sampler", None)),
                        ("batch_sampler_generator",
                         getattr(getattr(loader, "batch_sampler", None), "sampler", None))):
        gen = getattr(owner, "generator", None) if owner is not None else None
        if isinstance(gen, torch.Generator) and id(gen) not in seen:
            seen.add(id(gen))
            gens.append((name, gen))
    return gens
