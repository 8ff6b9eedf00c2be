"""Staging: the copy of a checkpoint's tensors that the training loop waits for.

The training loop is blocked for exactly two things, both measured and logged:

``wait``
    the previous checkpoint still being written. One checkpoint is in flight at most,
    because the staging buffers are reused: backpressure is shown, never hidden behind an
    unbounded queue (which would also make host memory unbounded).
``stage``
    copying the state into staging buffers allocated once and reused (pinned memory for
    CUDA tensors). Fresh allocations cost page faults that dwarf the copy on these VMs
    (1.5 GB/s into fresh memory vs 6.6 GB/s into reused buffers).

Everything after that runs on the writer thread (:mod:`ravex.saving.writer_thread`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from typing import Any

import numpy as np
import torch

from ravex.format.storage.direct import ALIGN
from ravex.format.values import PLAIN_TYPES, all_plain

from .copier import Copier, byte_view
from .dtypes import numpy_view
from .logline import mib
from .plan import RowShard, SavingSettings

logger = logging.getLogger("ravex")

#: Where a tensor is in the state tree: the keys and indices leading to it.
Path = tuple[Any, ...]


def _copy_cpu(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy a CPU tensor on this thread only (``np.copyto``), whatever torch's thread count.

    ``Tensor.copy_`` splits a large copy across intra-op threads; on a busy machine the
    training loop then waits on a descheduled thread (3.7x a bare copy, vs ~1.1x
    single-threaded).
    Tensors numpy cannot view (conjugate/negative bits, dtypes without a numpy
    equivalent) fall back to ``copy_``.
    """
    if not (src.is_conj() or src.is_neg()):
        try:
            np.copyto(numpy_view(dst), numpy_view(src), casting="no")
            return
        except (TypeError, RuntimeError, ValueError):
            pass
    dst.copy_(src)


class Stager:
    """Copies a state tree's tensors into buffers that live as long as the Stager.

    Buffers are keyed by the tensor's path in the tree; the tree's shape is stable from
    one checkpoint to the next, so after the first checkpoint nothing is allocated.
    ``as_numpy`` hands the format numpy views; the torch_save backend keeps tensors.

    **Skipping unchanged tensors** (``skip_unchanged``, on by default). A fine-tune with
    90% of its parameters frozen would otherwise copy 10x the state that changed at every
    checkpoint. A tensor is not copied again when its buffer already holds its bytes:
    same storage (held by a weak reference, so a freed storage whose address is reused
    by a new tensor never matches), same data_ptr, storage_offset, shape, stride, dtype
    and device, and same ``tensor._version`` as when it was last copied. ``_version`` is
    torch's in-place counter, shared by a tensor, its views and ``detach()`` (so the
    aliases ``state_dict()`` returns see the writes made through the parameter).

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
      every time, and the Stager says so once in the log. Third-party fused kernels
      (apex, bitsandbytes) cannot be recognised that way: see the probe below.
    * writes through ``.data`` (``p.data.mul_()``), through numpy views
      (``p.detach().numpy()[:] = ...``, ``torch.from_numpy`` aliases), or via
      ``set_``/``.data =`` swaps of the same storage;
    * ``optimizer.load_state_dict()`` copies into its existing state tensors with the
      counter unchanged;
    * inference tensors (made under ``inference_mode``) have no counter at all: they are
      always copied;
    * parameters updated by hand (``p.data.add_(...)``) in a tree with models and no
      optimizer: such a tree is staged in full every time;
    * BatchNorm's ``running_mean``/``running_var``: the batch-norm kernels update them in
      place with the counter unchanged, so every model with BatchNorm would trip the probe
      below at each checkpoint. They are recognised by name and always copied (a few
      floats a channel).

    Three guards against those: (1) before a tensor is skipped, a handful of its elements
    (first, last and evenly spaced, compared bitwise) are checked against its buffer; a
    mismatch copies it and logs a warning naming the path once. This catches any dense
    update (an optimizer step moves nearly every element) but not a write to a few
    elements. (2) Every ``full_stage_every``-th stage copies every tensor (default 10;
    1 turns skipping off), which bounds how long such a write can go unseen. (3)
    ``skip_unchanged: false`` turns it off. numpy arrays in the tree are always copied.

    Figures of the last stage: ``nbytes`` and ``tensors`` (all of them), ``copied_bytes``,
    ``copied_tensors``, ``skipped_bytes``, ``full`` (whether every tensor was copied by
    rule); :meth:`summary` puts them in the checkpoint log line.
    """

    PROBE = 8  # elements compared before a skip

    def __init__(self, as_numpy: bool, skip_unchanged: bool = True, full_stage_every: int = 10) -> None:
        if isinstance(full_stage_every, bool) or not isinstance(full_stage_every, int) or full_stage_every < 1:
            raise ValueError(f"full_stage_every must be an integer >= 1, got {full_stage_every!r}")
        self.as_numpy = as_numpy
        self.skip_unchanged = bool(skip_unchanged)
        self.full_stage_every = full_stage_every
        self._buffers: dict[Path, tuple[torch.Tensor, Any]] = {}
        #: path -> (weakref to the source storage, identity key incl. _version) of its last copy
        self._seen: dict[Path, tuple[Any, tuple[Any, ...]]] = {}
        #: path -> the probe's sample of its buffer (a buffer changes only when we copy into it)
        self._buffer_sample: dict[Path, bytes] = {}
        self._stages = 0
        self._copier = Copier()
        self._warned: set[str] = set()
        self.nbytes = 0
        self.copied_bytes = 0
        self.skipped_bytes = 0
        self.tensors = 0
        self.copied_tensors = 0
        self.full = True

    @classmethod
    def for_config(cls, as_numpy: bool, config: SavingSettings | None = None) -> Stager:
        """A Stager with ``config``'s ``skip_unchanged``/``full_stage_every`` (the defaults without one)."""
        if config is None:
            return cls(as_numpy)
        return cls(as_numpy, skip_unchanged=config.skip_unchanged, full_stage_every=config.full_stage_every)

    def stage(self, tree: Any) -> Any:
        """Return a private copy of ``tree``; containers rebuilt, tensors into buffers."""
        self.nbytes = self.copied_bytes = self.skipped_bytes = self.tensors = self.copied_tensors = 0
        self.full = not self.skip_unchanged or self._stages % self.full_stage_every == 0
        if not self.full and _has_fused_optimizer(tree):
            self.full = True
            self._warn_once("fused", "ravex: a fused optimizer (fused=True) updates tensors without "
                            "bumping their version counter; every checkpoint copies every tensor")
        if not self.full and _updated_by_hand(tree):
            self.full = True  # ``p.data.add_(...)``: no counter moves, and a sample can miss rows
        self._cuda = False
        self._probes: list[tuple[Path, torch.Tensor, tuple[torch.Tensor, Any], int]] = []
        try:
            out = self._walk(tree, ())
            self._check_probes()  # (reads only skipped tensors' buffers, which no copy writes)
            self._copier.run()
            if self._cuda:
                torch.cuda.synchronize()
        except BaseException:
            self._copier.discard()
            self._seen.clear()  # buffers may be half filled: trust none of them next time
            raise
        finally:
            self._probes = []
        self._stages += 1
        return out

    def summary(self) -> str:
        """The last stage's copy figures, for the checkpoint log line."""
        full = ", full" if self.full else ""
        return (f"copied {self.copied_tensors}/{self.tensors} tensors, "
                f"{mib(self.copied_bytes)} of {mib(self.nbytes)}{full}")

    def _walk(self, value: Any, path: Path) -> Any:
        kind = type(value)
        if kind in PLAIN_TYPES:  # immutable, nothing to copy
            return value
        if (kind is tuple or kind is list) and all_plain(value):
            return value if kind is tuple else list(value)  # e.g. Python's RNG state: 625 ints
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path)
        if isinstance(value, dict):
            return {k: self._walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, (*path, i)) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return tuple(self._walk(v, (*path, i)) for i, v in enumerate(value))
        if isinstance(value, np.ndarray):  # a fresh tensor each time, no counter: always copied
            return self._tensor(torch.from_numpy(np.ascontiguousarray(value)), path, skippable=False)
        if isinstance(value, np.generic):
            return value.item()
        if kind is RowShard:  # this rank's rows of a sharded tensor: its local tensor is staged
            return dataclasses.replace(value, local=self._tensor(value.local, path))
        return value

    def _tensor(self, tensor: torch.Tensor, path: Path, skippable: bool = True) -> Any:
        src = tensor.detach()
        if src.is_sparse or src.layout != torch.strided:
            raise TypeError(f"tensor at {'/'.join(map(str, path))} has layout {src.layout}; "
                            "only dense tensors can be checkpointed")
        size = src.numel() * src.element_size()
        self.nbytes += size
        self.tensors += 1
        entry = self._buffers.get(path)
        if entry is None or entry[0].shape != src.shape or entry[0].dtype != src.dtype:
            buf = _staging_buffer(src)
            entry = (buf, numpy_view(buf) if self.as_numpy else buf)
            self._buffers[path] = entry
            self._seen.pop(path, None)
        skippable = skippable and not (bool(path) and isinstance(path[-1], str) and path[-1].endswith(_UNCOUNTED))
        ident = _identity(src) if skippable and self.skip_unchanged else None
        if ident is not None and not self.full:
            seen = self._seen.get(path)
            if seen is not None and seen[1] == ident[1] and seen[0]() is ident[0]:
                self._probes.append((path, src, entry, size))
                self.skipped_bytes += size
                return entry[1]
        self._copy(src, entry[0], size)
        self._buffer_sample.pop(path, None)
        self._seen.pop(path, None)
        if ident is not None:
            try:
                self._seen[path] = (weakref.ref(ident[0]), ident[1])
            except TypeError:  # a storage that takes no weak reference: never skipped
                pass
        return entry[1]

    def _copy(self, src: torch.Tensor, buf: torch.Tensor, size: int) -> None:
        """Copy now (CUDA: queued on the stream) or queue it for the shared CPU copy."""
        if src.is_cuda:
            self._cuda = True
            buf.copy_(src, non_blocking=True)
        else:
            src_bytes = byte_view(src) if size else None
            dst_bytes = byte_view(buf) if src_bytes is not None else None
            if src_bytes is None or dst_bytes is None:
                _copy_cpu(buf, src)
            else:
                self._copier.add(src_bytes, dst_bytes)
        self.copied_bytes += size
        self.copied_tensors += 1

    def _check_probes(self) -> None:
        """Compare a few elements of each skipped tensor with its buffer; copy on a mismatch.

        CPU samples are taken with numpy: torch's indexing wakes its intra-op threads, which
        cost ~0.3 ms a tensor on a busy machine against ~2 us here."""
        if not self._probes:
            return
        k = self.PROBE
        on_gpu = [i for i, (_, src, _, _) in enumerate(self._probes) if _gather_on_device(src)]
        samples: list[bytes | None] = [
            None if i in on_gpu else _sample_bytes(src, k) for i, (_, src, _, _) in enumerate(self._probes)
        ]
        if on_gpu:  # one transfer, one sync for all of them
            parts = [_sample(self._probes[i][1], k).view(torch.uint8) for i in on_gpu]
            flat = torch.cat(parts).cpu().numpy()
            at = 0
            for i, part in zip(on_gpu, parts, strict=True):
                samples[i], at = flat[at:at + part.numel()].tobytes(), at + part.numel()
        for (path, src, entry, size), got in zip(self._probes, samples, strict=True):
            want = self._buffer_sample.get(path)
            if want is None:
                want = self._buffer_sample[path] = _sample_bytes(entry[0], k)
            if got == want:
                continue
            name = "/".join(map(str, path))
            self._warn_once(name, f"ravex: tensor {name!r} changed without bumping its version counter "
                            "(a fused/custom kernel, a .data or numpy write); copying it")
            self.skipped_bytes -= size
            self._copy(src, entry[0], size)
            self._buffer_sample.pop(path, None)
            self._seen.pop(path, None)  # its counter cannot be trusted: copied until it moves

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s", message)

    def release(self) -> None:
        self._copier.close()
        self._buffers.clear()
        self._seen.clear()
        self._buffer_sample.clear()


def _staging_buffer(src: torch.Tensor) -> torch.Tensor:
    """A CPU buffer for ``src``'s bytes: pinned for a CUDA tensor, else numpy's memory.

    numpy asks the kernel for huge pages on large allocations (``madvise``, which is what
    these machines' transparent huge pages wait for) and torch does not: copies into such
    a buffer took 12.1 ms against 13.2 ms for 200 MiB (fewer TLB misses), and the writer
    reads them back faster too. It starts on a page (:data:`ALIGN`), so that a local store
    writes its chunks straight from it to the disk (``ravex.format.storage.direct``).
    """
    if src.is_cuda and torch.cuda.is_available():
        return torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=True)
    nbytes = src.numel() * src.element_size()
    if nbytes == 0 or src.dtype.is_complex or src.dtype == torch.bool:
        return torch.empty(src.shape, dtype=src.dtype, device="cpu")
    block = np.empty(nbytes + ALIGN, dtype=np.uint8)
    skip = -block.ctypes.data % ALIGN  # page-aligned: the writer can hand it to the disk as it is
    flat = torch.from_numpy(block[skip:skip + nbytes])
    return flat.view(src.dtype).view(src.shape)


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


def _gather_on_device(src: torch.Tensor) -> bool:
    """Whether the probe gathers ``src``'s sample where it lives (batched to one transfer)."""
    return src.device.type != "cpu"


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
