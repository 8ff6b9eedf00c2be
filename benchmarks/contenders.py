"""The checkpointers compared, each as a durable save to a fresh path and a load back.

Every save ends durable: the files it wrote are fsync'd and so is the folder
holding them, as Ravex's own writer does. The timed span of a save is the whole
call, fsync included. Loads return the state (or fill a preallocated one).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp

from ravex.format import open_store
from ravex.format.objects.dtypes import data_type

from .state import empty_like_tree, flatten
from .util import fsync_path, fsync_tree

# everything is imported above, not inside the timed calls: a first save must not pay for imports
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


@dataclass
class Contender:
    """A named save and (optionally) its matching loads."""

    name: str
    save: Callable[[str], Any]  # durable save of the run's state to a fresh path; returns details or None
    loads: dict[str, Callable[[str], Any]]  # load label -> load from that path
    peer: bool = True  # a peer library rather than Ravex


# ---- Ravex -------------------------------------------------------------------------------


def ravex_save(tree_np: Any, path: str, compression: str, chunk_bytes: int | None = None,
               threads: int | None = None, step: int = 1) -> Any:
    """A fresh store, one commit (durable when it returns), writer closed: end to end."""
    store = open_store(path, create=True)
    with store.writer(compression=compression, chunk_bytes=chunk_bytes, threads=threads) as w:
        return w.commit(step, tree_np)


def ravex_load(path: str) -> Any:
    return open_store(path).open_step("latest").read()


class RavexInto:
    """Ravex restore into caller buffers, allocated (and faulted in) once, reused per load."""

    def __init__(self) -> None:
        self.outs: dict[str, np.ndarray] | None = None

    def prepare(self, path: str) -> None:
        reader = open_store(path).open_step("latest")
        self.outs = {}
        for p, ref in reader.arrays.items():
            arr = np.empty(ref.shape, dtype=data_type(ref.data_type).numpy)
            arr.reshape(-1).view(np.uint8)[:] = 0  # fault the pages in now, not during the timed load
            self.outs[p] = arr

    def __call__(self, path: str) -> Any:
        reader = open_store(path).open_step("latest")
        if self.outs is None:
            self.prepare(path)
        assert self.outs is not None
        return reader.read_arrays(list(self.outs), outs=self.outs)


def commit_details(stats: Any) -> dict[str, Any]:
    """CommitStats as JSON: counts, bytes, and phase seconds (hash/encode/write summed over threads)."""
    return stats.to_json() | {"seconds": {k: round(v, 4) for k, v in stats.seconds.items()}}


# ---- torch.save ----------------------------------------------------------------------------


def torch_save(state: Any, path: str) -> None:
    torch.save(state, path)
    fsync_path(path)
    fsync_path(os.path.dirname(path) or ".")


def torch_load(path: str) -> Any:
    return torch.load(path, weights_only=True)


# ---- safetensors ----------------------------------------------------------------------------


def safetensors_flat(state: Any) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """safetensors holds one flat dict of tensors; the rest (param_groups...) goes to metadata."""
    tensors: dict[str, torch.Tensor] = {}
    rest: dict[str, Any] = {}
    for k, v in flatten(state).items():
        if isinstance(v, torch.Tensor):
            tensors[k] = v
        else:
            rest[k] = v
    return tensors, {"ravex_bench_values": json.dumps(rest, default=str)}


def safetensors_save(state: Any, path: str) -> None:
    tensors, meta = safetensors_flat(state)
    safetensors.torch.save_file(tensors, path, metadata=meta)
    fsync_path(path)
    fsync_path(os.path.dirname(path) or ".")


def safetensors_load(path: str) -> Any:
    return safetensors.torch.load_file(path)


# ---- torch.distributed.checkpoint -----------------------------------------------------------


def dcp_save(state: Any, path: str, thread_count: int = 1) -> None:
    """Single process, no process group (``no_dist=True``), files fsync'd (``sync_files=True``)."""
    writer = dcp.FileSystemWriter(path, sync_files=True, thread_count=thread_count)
    dcp.save(state, storage_writer=writer, no_dist=True)
    fsync_tree(path)  # the files are already synced; this adds the folder entries (cheap)


class DcpLoad:
    """DCP loads in place: into a state of the same structure, allocated once and reused."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.target: Any = None

    def prepare(self, path: str) -> None:
        self.target = empty_like_tree(self.state)  # zero-filled, so already faulted in
        self.state = None  # only its structure was needed

    def __call__(self, path: str) -> Any:
        if self.target is None:
            self.prepare(path)
        dcp.load(self.target, storage_reader=dcp.FileSystemReader(path), no_dist=True)
        return self.target


def build(state: Any, tree_np: Any, ravex_compressions: tuple[str, ...] = ("none", "zstd", "blosc"),
          dcp_threads: tuple[int, ...] = (1,)) -> list[Contender]:
    """All contenders over one state (``state`` as torch holds it, ``tree_np`` its numpy views)."""
    out: list[Contender] = [
        Contender("torch.save", lambda p: torch_save(state, p), {"torch.load": torch_load}),
        Contender("safetensors", lambda p: safetensors_save(state, p), {"safetensors.load_file": safetensors_load}),
    ]
    for n in dcp_threads:
        label = "dcp" if n == 1 else f"dcp threads={n}"
        loads: dict[str, Callable[[str], Any]] = {"dcp.load (in place)": DcpLoad(state)} if n == 1 else {}
        out.append(Contender(label, lambda p, n=n: dcp_save(state, p, n), loads))
    for c in ravex_compressions:
        loads = {f"ravex {c} read": ravex_load}
        if c == "none":
            loads["ravex none read_arrays(outs)"] = RavexInto()
        out.append(
            Contender(f"ravex {c}", lambda p, c=c: commit_details(ravex_save(tree_np, p, c)), loads, peer=False)
        )
    return out
