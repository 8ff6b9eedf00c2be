"""The async pipeline: stage (training thread) -> hash/encode/write (background thread).

The training loop is blocked for exactly two things, both measured and logged:

``wait``
    the previous checkpoint still being written. One checkpoint is in flight at most,
    because the staging buffers are reused: backpressure is shown, never hidden behind an
    unbounded queue (which would also make host memory unbounded).
``stage``
    copying the state into staging buffers allocated once and reused (pinned memory for
    CUDA tensors). Fresh allocations cost page faults that dwarf the copy on these VMs
    (DESIGN.md: 1.5 GB/s into fresh memory vs 6.6 GB/s into reused buffers).

Everything after that — hashing, encoding, writing, the manifest — happens on one
background thread, and a failure there is logged and kept for ``status()``; it never
reaches the training loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import torch

logger = logging.getLogger("ravex")

_NUMPY_VIEWS: dict[torch.dtype, tuple[torch.dtype, Any]] = {
    torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
}


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a contiguous CPU tensor (bf16/fp8 via ``ml_dtypes``)."""
    view = _NUMPY_VIEWS.get(tensor.dtype)
    if view is not None:
        return tensor.view(view[0]).numpy().view(view[1])
    return tensor.numpy()


def _copy_cpu(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy a CPU tensor on this thread only (``np.copyto``), whatever torch's thread count.

    ``Tensor.copy_`` splits a large copy across intra-op threads; on a busy machine the
    training loop then waits on a descheduled thread (benchmarks/proto_stage.py: 3.7x a
    bare copy, vs ~1.1x single-threaded). Tensors numpy cannot view (conjugate/negative
    bits, dtypes without a numpy equivalent) fall back to ``copy_``.
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
    """

    def __init__(self, as_numpy: bool) -> None:
        self.as_numpy = as_numpy
        self._buffers: dict[tuple, tuple[torch.Tensor, Any]] = {}
        self.nbytes = 0

    def stage(self, tree: Any) -> Any:
        """Return a private copy of ``tree``; containers rebuilt, tensors into buffers."""
        self.nbytes = 0
        self._cuda = False
        out = self._walk(tree, ())
        if self._cuda:
            torch.cuda.synchronize()
        return out

    def _walk(self, value: Any, path: tuple) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path)
        if isinstance(value, dict):
            return {k: self._walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, (*path, i)) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return tuple(self._walk(v, (*path, i)) for i, v in enumerate(value))
        if isinstance(value, np.ndarray):
            return self._tensor(torch.from_numpy(np.ascontiguousarray(value)), path)
        if isinstance(value, np.generic):
            return value.item()
        return value

    def _tensor(self, tensor: torch.Tensor, path: tuple) -> Any:
        src = tensor.detach()
        if src.is_sparse or src.layout != torch.strided:
            raise TypeError(f"tensor at {'/'.join(map(str, path))} has layout {src.layout}; "
                            "only dense tensors can be checkpointed")
        entry = self._buffers.get(path)
        if entry is None or entry[0].shape != src.shape or entry[0].dtype != src.dtype:
            pin = src.is_cuda and torch.cuda.is_available()
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=pin)
            entry = (buf, numpy_view(buf) if self.as_numpy else buf)
            self._buffers[path] = entry
        if src.is_cuda:
            self._cuda = True
            entry[0].copy_(src, non_blocking=True)
        else:
            _copy_cpu(entry[0], src)
        self.nbytes += src.numel() * src.element_size()
        return entry[1]

    def release(self) -> None:
        self._buffers.clear()


@dataclass
class Job:
    """One checkpoint on its way to storage."""

    step: int
    tree: Any
    metadata: dict[str, Any]
    stall: dict[str, float]  # wait, stage: what the training loop paid
    nbytes: int
    submitted: float = field(default_factory=time.perf_counter)


class AsyncSaver:
    """One background thread, one job in flight; failures are kept, never raised.

    ``write(job)`` runs on the thread and returns a dict of results (timings, bytes)
    for ``on_done(job, result, error)``, which the backend uses for its log line.
    """

    def __init__(
        self,
        write: Callable[[Job], dict[str, Any]],
        on_done: Callable[[Job, dict[str, Any] | None, BaseException | None], None],
        name: str = "ravex-writer",
    ) -> None:
        self._write = write
        self._on_done = on_done
        self._cv = threading.Condition()
        self._job: Job | None = None
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wait_idle(self) -> float:
        """Block until nothing is in flight; return how long that took (backpressure)."""
        started = time.perf_counter()
        with self._cv:
            while self._busy:
                self._cv.wait()
        return time.perf_counter() - started

    def submit(self, job: Job) -> None:
        """Hand ``job`` to the thread. The caller has waited for idle (buffers are shared)."""
        with self._cv:
            if self._closed:
                raise RuntimeError("saver is closed")
            while self._busy:
                self._cv.wait()
            self._job = job
            self._busy = True
            self._cv.notify_all()

    def flush(self) -> None:
        self.wait_idle()

    def close(self) -> None:
        with self._cv:
            while self._busy:
                self._cv.wait()
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)

    @property
    def busy(self) -> bool:
        return self._busy

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                if self._job is None:
                    return
                job = self._job
            result: dict[str, Any] | None = None
            error: BaseException | None = None
            try:
                result = self._write(job)
            except BaseException as exc:  # a storage error must never reach training
                error = exc
            try:
                self._on_done(job, result, error)
            except Exception:  # pragma: no cover - logging must not kill the thread
                logger.exception("ravex: checkpoint completion handler failed")
            with self._cv:
                self._job = None
                self._busy = False
                self._cv.notify_all()


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"
