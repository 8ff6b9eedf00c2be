"""Chunk size per tensor, from how the tensor is updated.

The format chunks every array along dimension 0 and reuses unchanged chunks (a delta).
Large chunks (the writer's default, 16 MiB) write fastest, and a dense update changes
every chunk anyway. A sparse embedding table is the opposite case: each step touches a
few scattered rows (Check-N-Run: ~1% per interval), so with 16 MiB chunks nearly every
chunk holds a changed row and the delta is the whole table. Small row chunks turn that
into a write of the touched rows' chunks only, plus the manifest's entry for every chunk.

Which tensors are updated sparsely is known from the live objects, not from the bytes:
the weights of an ``nn.Embedding`` / ``nn.EmbeddingBag`` built with ``sparse=True`` (their
gradient is sparse, so every optimizer step touches only the looked-up rows), and any
optimizer state of such a parameter that has its shape (SparseAdam's ``exp_avg`` and
``exp_avg_sq``; Adagrad's ``sum``). Those get :data:`SPARSE_CHUNK_BYTES`; every other
array keeps the writer's default.
"""

from __future__ import annotations

from typing import Any

import torch

from ravex.format.objects.names import array_name

from .names import renamer
from .plan import param_keys, param_names
from .registry import Registry

#: Chunk size for sparsely updated tables. benchmarks/scenarios.py (c), 1% of rows per
#: interval (Zipf), 256-byte rows, manifest counted: full/written 6.25x at 1 KiB, 7.25x at
#: 2 KiB, 5.56x at 4 KiB, 3.44x at 8 KiB, 2.07x at 16 KiB, 1.08x at 64 KiB. Each chunk costs
#: ~125 manifest bytes (and ~105 in refs.json) whether it changed or not, which is what
#: stops smaller chunks from doing better; the changed rows' chunks stop larger ones.
SPARSE_CHUNK_BYTES = 2 << 10


def _sparse_table(module: Any) -> bool:
    return isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and bool(getattr(module, "sparse", False))


def sparse_paths(registry: Registry) -> list[tuple[tuple[Any, ...], tuple[int, ...]]]:
    """Tree paths (as :func:`ravex.runtime.state.plan.collect` lays the tree out) of sparsely
    updated tensors, each with the shape it must have."""
    out: list[tuple[tuple[Any, ...], tuple[int, ...]]] = []
    if not registry.any_module(_sparse_table):  # the common case, at the cost of one isinstance a module
        return out
    params: dict[int, tuple[int, ...]] = {}
    for i, model in enumerate(registry.models()):
        rename = renamer(model)
        for prefix, module in model.named_modules():
            if not _sparse_table(module):
                continue
            for pname, p in module.named_parameters(recurse=False):
                plain = rename(f"{prefix}.{pname}" if prefix else pname)
                out.append((("models", i, "state", plain), tuple(p.shape)))
                params[id(p)] = tuple(p.shape)
    if not params:
        return out
    names = param_names(registry.models())
    for j, opt in enumerate(registry.live("optimizers")):
        flat = [p for group in opt.param_groups for p in group["params"]]
        for key, p in zip(param_keys(opt, names), flat, strict=True):  # plan.collect's keys
            shape = params.get(id(p))
            state = opt.state.get(p) if shape is not None else None
            for name, value in list((state or {}).items()):
                if isinstance(value, torch.Tensor) and tuple(value.shape) == shape:
                    out.append((("optimizers", j, "state", key, name), shape))
    return out


def chunk_bytes_for(registry: Registry, tree: Any, chunk_bytes: int = SPARSE_CHUNK_BYTES) -> dict[str, int]:
    """Per-array chunk sizes for the writer (array name -> bytes) for the collected ``tree``
    (on the training thread, so the live objects cannot change under the walk).

    Only paths that lead to a tensor of the expected shape in ``tree`` are named.
    """
    sizes: dict[str, int] = {}
    for path, shape in sparse_paths(registry):
        node = tree
        for key in path:
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and key < len(node):
                node = node[key]
            else:
                node = None
                break
        if isinstance(node, torch.Tensor) and node.dim() >= 1 and tuple(node.shape) == shape:
            sizes[array_name(path)] = chunk_bytes
    return sizes
