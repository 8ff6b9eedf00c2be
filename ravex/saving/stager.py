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

**Staging memory made ready before the first checkpoint** (:meth:`Stager.prepare`). The
first checkpoint of a process would otherwise fault in every page of its buffers while the
loop waits: 0.24 s per GiB on these VMs, in mappings of their own populated by one ``madvise``
call (:mod:`.staging.buffers`; 0.6-2.4 s per GiB where the kernel compacted memory for huge
pages), against 0.1 s for the later checkpoints' copy. The runtime hands the stager the sizes
of the state's tensors at the first training step; a background thread allocates and faults
in those buffers then, and the first stage takes them by size. Faulting pages in is CPU: on
a machine whose cores training keeps busy, a thread of normal priority doing it slows the
training loop by about what it saves the first stall. So the thread runs as ``SCHED_IDLE``
(nice 19 where that is refused): it takes only what training leaves idle. If the first
checkpoint comes before it is done, the stage stops it after the piece in hand, takes what is
ready and allocates the rest itself: the first stall is never longer than without it.

**Digests computed as the bytes are copied.** For the format backend, each large CPU tensor
is copied chunk by chunk as the writer will chunk it (``ravex.format.writing.planning.hashed_chunk_len``)
and each chunk hashed as it lands (:mod:`.copier`); :attr:`Stager.known` hands the digests to
the commit, which then does not read the staged bytes a second time to hash them. A tensor
skipped as unchanged keeps its buffer and so its digests; any other way a buffer is filled
(CUDA, the ``copy_`` fallback) or replaced drops them, so a digest never outlives its bytes.

**A cap on staging memory** (``staging_max_bytes``). Staging holds a second copy of the state
in host memory; a host that cannot afford it sets a cap. Tensors are given buffers in the
order of the tree until the cap is reached; the CPU tensors left over are handed to the writer
as they are, live (:attr:`Stager.live_bytes`), and the training loop waits until the writer
has read every byte of them (the backend's ``save``). The stall grows by that read and write;
the bytes written are the same, and exactness holds because nothing runs while they are read.
CUDA tensors, and tensors the writer cannot read in place (non-contiguous, conjugate), are
always staged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ravex.format.objects.hashing import KnownDigests
from ravex.format.objects.names import array_name
from ravex.format.objects.values import PLAIN_TYPES, all_plain
from ravex.format.writing.planning import DEFAULT_CHUNK_BYTES, hashed_chunk_len

from .copier import Copier, byte_view, touch
from .dtypes import numpy_view
from .logline import copied_text, fault_text
from .plan import RowShard, SavingSettings
from .staging.buffers import _aligned_block, _fits_block, _live, _staging_buffer
from .staging.probes import (
    _UNCOUNTED,
    _has_fused_optimizer,
    _identity,
    _sample,
    _sample_bytes,
    _updated_by_hand,
)

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

    Some writes do not bump the counter (fused optimizers, ``.data`` and numpy writes,
    ``optimizer.load_state_dict()``, BatchNorm's running statistics, parameters updated by
    hand): :mod:`ravex.saving.staging.probes` lists them, measured, with the rules that stage
    such trees and tensors in full. Inference tensors have no counter and are always copied.

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

    def __init__(self, as_numpy: bool, skip_unchanged: bool = True, full_stage_every: int = 10,
                 max_bytes: int | None = None) -> None:
        if isinstance(full_stage_every, bool) or not isinstance(full_stage_every, int) or full_stage_every < 1:
            raise ValueError(f"full_stage_every must be an integer >= 1, got {full_stage_every!r}")
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise ValueError(f"staging_max_bytes must be a positive integer or None, got {max_bytes!r}")
        #: the most bytes the staging buffers hold (``staging_max_bytes``); None: no cap
        self.max_bytes = max_bytes
        self._held = 0  # bytes of the buffers in ``_buffers``
        #: bytes of the last stage's tensors handed over live (over the cap), not copied
        self.live_bytes = 0
        self.as_numpy = as_numpy
        self.skip_unchanged = bool(skip_unchanged)
        self.full_stage_every = full_stage_every
        self._buffers: dict[Path, tuple[torch.Tensor, Any]] = {}
        #: path -> (weakref to the source storage, identity key incl. _version) of its last copy
        self._seen: dict[Path, tuple[Any, tuple[Any, ...]]] = {}
        #: path -> the probe's sample of its buffer (a buffer changes only when we copy into it)
        self._buffer_sample: dict[Path, bytes] = {}
        #: path -> digests of its buffer's chunks, hashed as they were copied (valid while the
        #: buffer holds those bytes: dropped whenever it is filled another way or replaced)
        self._digests: dict[Path, dict[tuple[int, int, int], str]] = {}
        #: the last stage's known digests, for ``StepWriter.commit(known=)``
        self.known: KnownDigests = {}
        self._chunk_bytes: Mapping[str, int] = {}
        self._staged_paths: list[Path] = []
        self._stages = 0
        self._copier = Copier()
        self._warned: set[str] = set()
        #: buffers made ready by :meth:`prepare`, by byte size, until the first stage takes them
        self._ready: dict[int, list[torch.Tensor]] = {}
        self._preparing: threading.Thread | None = None
        self._stop_preparing = threading.Event()
        self._ready_lock = threading.Lock()
        self._asked: list[int] = []  # every size :meth:`prepare` was asked for
        self._queue: list[int] = []  # those its thread has yet to take
        self._prepare_running = False
        #: what :meth:`prepare` did: bytes made ready, its wall and CPU seconds (its own thread)
        self.prepared: dict[str, float] | None = None
        self.nbytes = 0
        self.copied_bytes = 0
        self.skipped_bytes = 0
        self.tensors = 0
        self.copied_tensors = 0
        self.full = True
        #: the stage's new buffers whose copy is queued, as bytes by address: faulted in before the copy
        self._fresh: dict[int, np.ndarray] = {}
        #: the last stage's new staging memory (the first stage's, where prepare did not make it
        #: ready) and the seconds the loop waited for its pages
        self.fresh_bytes = 0
        self.fault_s = 0.0

    @classmethod
    def for_config(cls, as_numpy: bool, config: SavingSettings | None = None) -> Stager:
        """A Stager with ``config``'s ``skip_unchanged``/``full_stage_every`` (the defaults without one)."""
        if config is None:
            return cls(as_numpy)
        return cls(as_numpy, skip_unchanged=config.skip_unchanged, full_stage_every=config.full_stage_every,
                   max_bytes=getattr(config, "staging_max_bytes", None))

    def prepare(self, sizes: list[int]) -> None:
        """Allocate and fault in CPU staging buffers of these byte sizes on a background thread,
        for the first :meth:`stage` to take (sizes under :data:`PREPARE_MIN_BYTES` are left to
        it: malloc serves them from memory already resident). Called again before the first
        stage (the runtime calls it at activation with the model, then at the first step with
        the optimizer's state as well), it adds the sizes the earlier calls did not ask for;
        after the first stage it does nothing. At most the state's bytes, which the first stage
        would allocate."""
        if self._stages or self._buffers:
            return
        wanted = sorted((n for n in sizes if n >= PREPARE_MIN_BYTES), reverse=True)
        with self._ready_lock:
            for n in self._asked:  # a multiset difference: each earlier size once
                if n in wanted:
                    wanted.remove(n)
            if self.max_bytes is not None:  # no more than the cap lets the first stage hold
                room, fitting = self.max_bytes - sum(self._asked), []
                for n in wanted:
                    if n <= room:
                        fitting.append(n)
                        room -= n
                wanted = fitting
            if not wanted:
                return
            self._asked.extend(wanted)
            self._queue.extend(wanted)
            if self._prepare_running:  # the running thread takes them too
                return
            self._prepare_running = True
        self._preparing = threading.Thread(target=self._prepare_queued, name="ravex-prepare", daemon=True)
        self._preparing.start()

    def _prepare_queued(self) -> None:
        """The prepare thread: faults in the queued sizes, largest first, until the queue is
        empty or the first stage stops it."""
        t0, c0 = time.perf_counter(), time.thread_time()
        _lowest_priority()
        stop, done = self._stop_preparing, 0
        try:
            while not stop.is_set():
                with self._ready_lock:
                    if not self._queue:  # (under the lock: a size queued after this starts a thread)
                        self._prepare_running = False
                        break
                    n = self._queue.pop(0)
                buf = _aligned_block(n)
                for at in range(0, n, TOUCH_PIECE_BYTES):
                    if stop.is_set():  # the first stage is due: a partly touched buffer is still good
                        break
                    touch(buf[at:at + TOUCH_PIECE_BYTES].numpy())
                    done += min(TOUCH_PIECE_BYTES, n - at)
                with self._ready_lock:
                    self._ready.setdefault(n, []).append(buf)
        except MemoryError:  # the first stage allocates what is missing, as it did before
            pass
        finally:
            with self._ready_lock:
                self._prepare_running = False
                earlier = self.prepared or {"bytes": 0.0, "wall_s": 0.0, "cpu_s": 0.0}
                self.prepared = {"bytes": earlier["bytes"] + done,
                                 "wall_s": earlier["wall_s"] + time.perf_counter() - t0,
                                 "cpu_s": earlier["cpu_s"] + time.thread_time() - c0,
                                 "stopped": float(stop.is_set())}

    def stage(self, tree: Any, chunk_bytes: Mapping[str, int] | None = None) -> Any:
        """Return a private copy of ``tree``; containers rebuilt, tensors into buffers.

        ``chunk_bytes`` are the commit's own chunk sizes by array name (the writer's default
        elsewhere): the chunks hashed while copying are the chunks the writer will look up."""
        if self._preparing is not None and self._preparing.is_alive():
            self._stop_preparing.set()  # it stops after the piece in hand; the rest is allocated here
            # an idle-priority thread on a busy machine may wait long for a core, the loop
            # waiting on it: back to normal priority for its last piece (measured: first stall
            # 1.5 s against 0.4 s without prepare, before this)
            _normal_priority(self._preparing.native_id)
            self._preparing.join()
        self.nbytes = self.copied_bytes = self.skipped_bytes = self.tensors = self.copied_tensors = 0
        self.live_bytes = 0
        self.full = not self.skip_unchanged or self._stages % self.full_stage_every == 0
        if not self.full and _has_fused_optimizer(tree):
            self.full = True
            self._warn_once("fused", "ravex: a fused optimizer (fused=True) updates tensors without "
                            "bumping their version counter; every checkpoint copies every tensor")
        if not self.full and _updated_by_hand(tree):
            self.full = True  # ``p.data.add_(...)``: no counter moves, and a sample can miss rows
        self._cuda = False
        self._probes: list[tuple[Path, torch.Tensor, tuple[torch.Tensor, Any], int]] = []
        self._chunk_bytes, self._staged_paths, self.known = chunk_bytes or {}, [], {}
        try:
            out = self._walk(tree, ())
            self._check_probes()  # (reads only skipped tensors' buffers, which no copy writes)
            self._fault_in_fresh()
            self._copier.run()
            if self._cuda:
                torch.cuda.synchronize()
        except BaseException:
            self._copier.discard()
            self._seen.clear()  # buffers may be half filled: trust none of them next time
            self._digests.clear()
            raise
        finally:
            self._probes, self._fresh = [], {}
            self._ready.clear()  # prepared buffers the state had no use for are freed
        self.known = {key: value for path in self._staged_paths for key, value in self._digests.get(path, {}).items()}
        self._stages += 1
        return out

    def summary(self) -> str:
        """The last stage's copy figures, for the checkpoint log line: with new staging memory
        (the first checkpoint), what faulting it in cost the stall."""
        copied = copied_text(self.copied_tensors, self.tensors, self.copied_bytes, self.nbytes, self.full)
        if self.fresh_bytes < PREPARE_MIN_BYTES:  # (what malloc serves from resident memory costs nothing to say)
            return copied
        return f"{copied}; {fault_text(self.fresh_bytes, self.fault_s, (self.prepared or {}).get('bytes', 0.0))}"

    def _fault_in_fresh(self) -> None:
        """Fault in the stage's new buffers before the copy, timed: the pages cost the same in the
        copy, but there the checkpoint's line could not tell them from the copy itself."""
        fresh, self._fresh = list(self._fresh.values()), {}
        self.fresh_bytes, self.fault_s = sum(b.nbytes for b in fresh), 0.0
        if fresh:
            t0 = time.perf_counter()
            self._copier.fault_in(fresh)
            self.fault_s = time.perf_counter() - t0

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
            return dataclasses.replace(value, local=self._tensor(value.local, path, chunk_rows=value.chunk_rows))
        return value

    def _tensor(self, tensor: torch.Tensor, path: Path, skippable: bool = True, chunk_rows: int | None = None) -> Any:
        src = tensor.detach()
        if src.is_sparse or src.layout != torch.strided:
            raise TypeError(f"tensor at {'/'.join(map(str, path))} has layout {src.layout}; "
                            "only dense tensors can be checkpointed")
        size = src.numel() * src.element_size()
        self.nbytes += size
        self.tensors += 1
        entry = self._buffers.get(path)
        if entry is None or entry[0].shape != src.shape or entry[0].dtype != src.dtype:
            if entry is not None:
                self._held -= entry[0].numel() * entry[0].element_size()
                del self._buffers[path]
                self._digests.pop(path, None)
            if self.max_bytes is not None and self._held + size > self.max_bytes:
                live = _live(src, self.as_numpy)
                if live is not None:  # over the cap: the writer reads it in place, the loop waiting
                    self._seen.pop(path, None)
                    self.live_bytes += size
                    return live
            buf = self._new_buffer(src, size)
            entry = (buf, numpy_view(buf) if self.as_numpy else buf)
            self._buffers[path] = entry
            self._held += size
            self._seen.pop(path, None)
        self._staged_paths.append(path)
        skippable = skippable and not (bool(path) and isinstance(path[-1], str) and path[-1].endswith(_UNCOUNTED))
        ident = _identity(src) if skippable and self.skip_unchanged else None
        if ident is not None and not self.full:
            seen = self._seen.get(path)
            if seen is not None and seen[1] == ident[1] and seen[0]() is ident[0]:
                self._probes.append((path, src, entry, size))
                self.skipped_bytes += size
                return entry[1]
        self._copy(src, entry[0], size, path, chunk_rows)
        self._buffer_sample.pop(path, None)
        self._seen.pop(path, None)
        if ident is not None:
            try:
                self._seen[path] = (weakref.ref(ident[0]), ident[1])
            except TypeError:  # a storage that takes no weak reference: never skipped
                pass
        return entry[1]

    def _new_buffer(self, src: torch.Tensor, size: int) -> torch.Tensor:
        """A staging buffer for ``src``: one :meth:`prepare` made ready for its size, else a new one."""
        ready = self._ready.get(size)
        if ready and not src.is_cuda and _fits_block(src):
            return ready.pop().view(src.dtype).view(src.shape)
        buf = _staging_buffer(src)
        fresh = None if src.is_cuda else byte_view(buf)  # (a CUDA tensor's pinned buffer is resident already)
        if fresh is not None:
            self._fresh[buf.data_ptr()] = fresh
        return buf

    def _copy(self, src: torch.Tensor, buf: torch.Tensor, size: int, path: Path, chunk_rows: int | None) -> None:
        """Copy now (CUDA: queued on the stream) or queue it for the shared CPU copy, which
        hashes the chunks the writer will look up as it copies them."""
        self._digests.pop(path, None)  # the buffer's bytes change: its old digests go
        if src.is_cuda:
            self._cuda = True
            buf.copy_(src, non_blocking=True)
        else:
            src_bytes = byte_view(src) if size else None
            dst_bytes = byte_view(buf) if src_bytes is not None else None
            if src_bytes is None or dst_bytes is None:
                self._fresh.pop(buf.data_ptr(), None)  # its pages are faulted in by this copy, now
                _copy_cpu(buf, src)
            else:
                hashing = self.as_numpy and HASH_WHILE_COPYING
                chunk_len = self._hashed_chunk_len(src, path, chunk_rows) if hashing else None
                digests: dict[tuple[int, int, int], str] | None = None
                if chunk_len:
                    digests = self._digests[path] = {}
                self._copier.add(src_bytes, dst_bytes, chunk_len, digests)
        self.copied_bytes += size
        self.copied_tensors += 1

    def _hashed_chunk_len(self, src: torch.Tensor, path: Path, chunk_rows: int | None) -> int | None:
        """The chunk length the writer hashes ``src``'s array in (None: not chunk by chunk)."""
        chunk_bytes = DEFAULT_CHUNK_BYTES
        if self._chunk_bytes:
            chunk_bytes = self._chunk_bytes.get(array_name(path), chunk_bytes)
        return hashed_chunk_len(tuple(src.shape), src.element_size(), chunk_bytes, chunk_rows)

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
            self._copy(src, entry[0], size, path, None)
            self._buffer_sample.pop(path, None)
            self._seen.pop(path, None)  # its counter cannot be trusted: copied until it moves

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("%s", message)

    def release(self) -> None:
        if self._preparing is not None:
            self._stop_preparing.set()
            self._preparing.join()
        self._ready.clear()
        self._copier.close()
        self._buffers.clear()
        self._held = 0
        self._seen.clear()
        self._buffer_sample.clear()
        self._digests.clear()
        self.known = {}


#: :meth:`Stager.prepare` leaves tensors under this size to the first stage
PREPARE_MIN_BYTES = 1 << 20
#: :meth:`Stager.prepare` touches this much between looks at whether the first stage is due
TOUCH_PIECE_BYTES = 8 << 20
#: :meth:`Stager.prepare`'s thread takes only idle cores (False: normal priority, for A/Bs)
PREPARE_IDLE = True
#: the stage hashes the chunks it copies (False: the writer hashes them afterwards, for A/Bs)
HASH_WHILE_COPYING = True


def _normal_priority(tid: int | None) -> None:
    """Put thread ``tid`` back to ``SCHED_OTHER``, nice 0 (Linux: these calls take a thread id)."""
    if tid is None or not PREPARE_IDLE:
        return
    try:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, tid, 0)
    except (AttributeError, OSError):
        pass


def _lowest_priority() -> None:
    """Run the calling thread only when a core is otherwise idle: ``SCHED_IDLE`` (Linux), else
    nice 19; left as it is where neither is allowed (or :data:`PREPARE_IDLE` is off)."""
    if not PREPARE_IDLE:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
    except (AttributeError, OSError):
        pass


def _gather_on_device(src: torch.Tensor) -> bool:
    """Whether the probe gathers ``src``'s sample where it lives (batched to one transfer)."""
    return src.device.type != "cpu"
