"""Stores written by the format itself, for the tool tests (no torch, fixed seeds)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ravex.format import open_store

#: Chunks of 4 KiB so that small tensors still have several chunks to share or change.
CHUNK_BYTES = 4096
#: The run id every step of these stores carries, so that what shows it (the inspector) repeats.
RUN = "0fixed0run0id"


def training_state(rng: np.random.Generator) -> dict:
    """A small model + AdamW-like optimizer + scheduler + rng + data loader state."""
    return {
        "model": {
            "embed.weight": rng.standard_normal((64, 32)).astype("float32"),
            "layers.0.attn.weight": rng.standard_normal((32, 32)).astype("float32"),
            "layers.0.attn.bias": np.zeros(32, "float32"),
            "layers.1.attn.weight": rng.standard_normal((32, 32)).astype("float32"),
            "layers.1.attn.bias": np.zeros(32, "float32"),
            "head.weight": rng.standard_normal((16, 32)).astype("float32"),
            "frozen.table": rng.standard_normal((128, 32)).astype("float32"),
        },
        "optimizer": {
            "state": {0: {"exp_avg": np.zeros((64, 32), "float32"), "step": 0}},
            "param_groups": [{"lr": 1e-3, "weight_decay": 0.01}],
        },
        "scheduler": {"last_epoch": 0, "base_lrs": [1e-3]},
        "rng": {"numpy": np.arange(32, dtype="uint8")},
        "data": {"epoch": 0, "index": 0},
    }


def write_run(path: str | os.PathLike[str], steps: tuple[int, ...] = (100, 200, 300), incomplete: int | None = None,
              seed: int = 0) -> Path:
    """A store of ``steps`` in which a few tensors train, one is frozen, and values move.

    ``incomplete``: also leave that step half-written (rank 0 of a world of 2, as after a crash).
    """
    rng = np.random.default_rng(seed)
    state = training_state(rng)
    store = open_store(path, create=True)
    with store.writer(chunk_bytes=CHUNK_BYTES, run=RUN) as w:
        for i, step in enumerate(steps):
            if i:
                m = state["model"]
                m["head.weight"] += 0.5 * rng.standard_normal(m["head.weight"].shape).astype("float32")
                m["layers.1.attn.weight"][:8] += 1e-3
                m["embed.weight"][:4] *= 1.00001
                state["optimizer"]["state"][0]["exp_avg"] += 0.1
                state["optimizer"]["state"][0]["step"] = i
                state["optimizer"]["param_groups"][0]["lr"] *= 0.5
                state["scheduler"]["last_epoch"] = i
                state["data"]["index"] = 10 * i
            w.commit(step, state)
    if incomplete is not None:
        with store.writer(rank=0, world_size=2, chunk_bytes=CHUNK_BYTES, run=RUN) as w:
            w.commit(incomplete, state)
    return Path(path)


def corrupt_object_of(path: str | os.PathLike[str], tensor: str, step: int | None = None) -> str:
    """Flip a byte of the object holding ``tensor``'s first chunk; returns the object name."""
    store = open_store(path)
    reader = store.open_step(step if step is not None else "latest")
    entry = reader.arrays[tensor]
    ref = next(r for r in entry.chunks.values() if r.object is not None)
    obj = Path(path) / "objects" / ref.object[:2] / ref.object
    data = bytearray(obj.read_bytes())
    data[(ref.offset or 0) + 1] ^= 0xFF
    obj.chmod(0o644)
    obj.write_bytes(bytes(data))
    return ref.object
