"""Shared builders for the openness tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ravex.format import ArrayShard, open_store
from ravex.format.objects.dtypes import BY_NAME

#: Lines that make a child process unable to import Ravex or torch (prepend to its code).
BLOCK_RAVEX_TORCH = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("ravex", "torch"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, _Block())
"""

#: Extension data types, and the integer type of their bits.
RAW_BITS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


@dataclass(frozen=True)
class Zoo:
    root: Path
    step: int
    arrays: dict[str, np.ndarray]  # array path -> what was written
    tree: Any  # rank 0's tree as written (numpy leaves)


def make(dtype: np.dtype, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == np.bool_:
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    return np.frombuffer(rng.bytes(n * dtype.itemsize), dtype=dtype).reshape(shape).copy()


def bits(a: np.ndarray) -> np.ndarray:
    """An array as raw unsigned integers, for bit-exact comparison (NaNs included)."""
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a.view(np.uint8)


def same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype.itemsize == b.dtype.itemsize and np.array_equal(bits(a), bits(b))


def write_zoo(root: Path, compression: str) -> Zoo:
    """Step 7 over two ranks: every data type as a multi-chunk 2-d array with a padded edge
    chunk, a 0-d array and an empty one; one float32 array sharded over the ranks; one
    chunk big enough for an object of its own; plain values."""
    arrays: dict[str, np.ndarray] = {}
    tensors: dict[str, Any] = {}
    for i, (name, dt) in enumerate(sorted(BY_NAME.items())):
        np_dt = dt.numpy.newbyteorder("=")
        group = {"multi": make(np_dt, (53, 37), i), "scalar": make(np_dt, (), 100 + i), "empty": make(np_dt, (0, 3), 0)}
        tensors[name] = group
        for k, v in group.items():
            arrays[f"tensors/{name}/{k}"] = v
    whole = make(np.dtype(np.float32), (2, 70_000), 999)  # a row per chunk, 273 KiB: whole objects
    sharded = make(np.dtype(np.float32), (40, 5), 998)
    arrays["big/whole"] = whole
    arrays["big/sharded"] = sharded
    store = open_store(root, create=True)
    tree0 = None
    for rank in (0, 1):
        tree = {
            "tensors": tensors,
            "big": {"whole": whole, "sharded": ArrayShard(sharded[rank * 20 : rank * 20 + 20], (40, 5), rank * 20, 20)},
            "epoch": 3,
            "lr": 0.5,
            "name": "zoo",
            "pair": (1, None),
            "blob": b"\x00\xff",
            "ids": {1: "one"},
        }
        with store.writer(rank, 2, compression, chunk_bytes=1024, run="zoo") as w:
            w.commit(7, tree)
        if rank == 0:
            tree0 = {**tree, "big": {"whole": whole, "sharded": sharded}}
    return Zoo(Path(root), 7, arrays, tree0)


def torch_numpy(t: Any) -> np.ndarray:
    """A torch tensor as numpy, through its bits where numpy has no such type (bfloat16, float8)."""
    import torch

    if t.is_complex() or not t.dtype.is_floating_point:
        return t.numpy()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(width[t.element_size()]).numpy()
