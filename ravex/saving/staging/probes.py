"""How the stager tells that a tensor is unchanged since its last copy, and when it must not trust that.

A tensor is skipped when its storage, place and ``tensor._version`` are those of its last copy
(:func:`_identity`). ``_version`` is torch's in-place counter, shared by a tensor, its views and
``detach()``.

What bumps ``_version`` (measured on the installed torch, 2.14.1; see
``tests/runtime/test_skip_unchanged.py``, which checks each row so that a torch
upgrade that changes one fails there): ``optimizer.step()`` of the for-loop and
``foreach`` implementations (params, ``exp_avg``/``exp_avg_sq``/``momentum_buffer``,
``step``), ``param.add_``/``param.copy_`` under ``no_grad``,
``module.load_state_dict``, in-place ops on normal tensors under ``inference_mode``,
and a ``torch.compile``-d ``optimizer.step()`` (inductor bumps the inputs it mutates).

What does NOT bump it, so a skip could keep stale bytes:

* **fused optimizers** (``Adam/AdamW/SGD/Adagrad(fused=True)``): their kernels write
  params and state without touching the counter (only ``step`` moves). A tree that
  holds an optimizer ``state_dict`` with a ``fused`` param group is staged in full
  every time (:func:`_has_fused_optimizer`), and the Stager says so once in the log.
  Third-party fused kernels (apex, bitsandbytes) cannot be recognised that way: the
  probe (:func:`_sample_bytes`) is what catches them.
* writes through ``.data`` (``p.data.mul_()``), through numpy views
  (``p.detach().numpy()[:] = ...``, ``torch.from_numpy`` aliases), or via
  ``set_``/``.data =`` swaps of the same storage;
* ``optimizer.load_state_dict()`` copies into its existing state tensors with the
  counter unchanged;
* inference tensors (made under ``inference_mode``) have no counter at all: they are
  always copied;
* parameters updated by hand (``p.data.add_(...)``) in a tree with models and no
  optimizer: such a tree is staged in full every time (:func:`_updated_by_hand`);
* BatchNorm's ``running_mean``/``running_var``: the batch-norm kernels update them in
  place with the counter unchanged, so every model with BatchNorm would trip the probe
  at each checkpoint. They are recognised by name (:data:`_UNCOUNTED`) and always copied
  (a few floats a channel).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from ravex.format.objects.values import all_plain

from ..dtypes import numpy_view

#: buffers that torch's kernels write without bumping ``_version``: never skipped
_UNCOUNTED = ("running_mean", "running_var")


def _identity(src: torch.Tensor) -> tuple[Any, tuple[Any, ...]] | None:
    """``src``'s storage and what must not move for the staged bytes to still be its
    bytes; None if untrackable (no counter, no storage: a wrapper subclass)."""
    if src.is_inference():  # no version counter (its detach() reads 0 whatever is written)
        return None
    try:
        return src.untyped_storage(), (src.data_ptr(), src.storage_offset(), tuple(src.shape), src.stride(),
                                       src.dtype, src.device, src._version)
    except (RuntimeError, NotImplementedError, TypeError):
        return None



@functools.lru_cache(maxsize=4096)
def _positions(n: int, k: int) -> np.ndarray:
    """``k`` flat positions out of ``n``: first, last and evenly spaced between."""
    return np.arange(k, dtype=np.int64) * (n - 1) // (k - 1)


def _sample(t: torch.Tensor, k: int) -> torch.Tensor:
    """Up to ``k`` elements of ``t`` (first, last, evenly spaced), contiguous, on its device."""
    n = t.numel()
    if n <= k:
        return t.reshape(-1).contiguous()
    flat = _positions(n, k)
    if t.is_contiguous():
        return t.view(-1)[torch.from_numpy(flat).to(t.device)]
    index = np.unravel_index(flat, tuple(t.shape))
    return t[tuple(torch.from_numpy(i).to(t.device) for i in index)]


def _sample_bytes(t: torch.Tensor, k: int) -> bytes:
    """The bytes of :func:`_sample` of a CPU tensor, taken with numpy where it can view ``t``."""
    try:
        arr = numpy_view(t)
    except (TypeError, RuntimeError, ValueError):  # conj/neg bits, dtypes numpy lacks
        return _sample(t, k).view(torch.uint8).numpy().tobytes()
    if arr.size <= k:
        return arr.tobytes()
    return arr.flat[_positions(arr.size, k)].tobytes()


def _updated_by_hand(tree: Any) -> bool:
    """Whether ``tree`` is a training tree with models and no optimizer: its parameters are
    updated by hand, typically through ``.data`` (word_language_model's SGD), which bumps no
    version counter and may change rows the probe does not sample (an embedding's)."""
    return isinstance(tree, dict) and bool(tree.get("models")) and not tree.get("optimizers")


def _has_fused_optimizer(tree: Any) -> bool:
    """Whether ``tree`` holds an optimizer ``state_dict`` with a ``fused=True`` param group."""
    stack = [tree]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            groups = value.get("param_groups")
            if isinstance(groups, list) and any(isinstance(g, dict) and g.get("fused") for g in groups):
                return True
            stack.extend(v for v in value.values() if isinstance(v, (dict, list, tuple)))
        elif isinstance(value, (list, tuple)) and not all_plain(value):
            stack.extend(v for v in value if isinstance(v, (dict, list, tuple)))
    return False
