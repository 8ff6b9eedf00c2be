"""Checkpoint backends: the contract the runtime writes through, and its two implementations.

The contract is the prototype's (``ravex 0.0.2``): :meth:`CheckpointBackend.save` returns
once the state has been *copied*, not once it has been written, and reports how long
each phase of that handoff took, so the log line can say where a slow handoff went.

``zarr`` (default)
    writes through :mod:`ravex.format`: content-addressed Zarr v3 chunks, unchanged
    chunks reused, no pickle on the way back.
``torch_save``
    the prototype's fallback: one ``step_<n>.pt`` per checkpoint, ``torch.save`` on the
    background thread. Used when asked for, or when the format backend cannot start.

Both share :mod:`ravex._saver`: reused staging buffers and one write in flight.
"""

from __future__ import annotations

import glob
import inspect
import logging
import os
import re
import time
from abc import ABC, abstractmethod
from typing import Any

from ravex._saver import AsyncSaver, Job, Stager, mib, ms

logger = logging.getLogger("ravex")


class CheckpointBackend(ABC):
    """Storage interface used by the runtime.

    Call order: ``save`` any number of times (each waits for the previous write),
    ``flush`` to wait for the last, ``close`` once. ``load_step``/``load_latest`` may be
    called before any ``save``.
    """

    #: short name for status() and log lines
    name: str = "?"

    def __init__(self, as_numpy: bool, config: Any = None) -> None:
        self._stager = Stager.for_config(as_numpy, config)  # skip_unchanged, full_stage_every
        self._saver = AsyncSaver(self._write, self._done)
        self.last_error: str | None = None
        self.last_error_step: int | None = None
        self.failures = 0
        self.written = 0
        self.last_written_step: int | None = None
        self.last_line: str | None = None

    # ── saving ──────────────────────────────────────────────────────────

    def save(self, step: int, state: dict[str, Any], metadata: dict[str, Any]) -> dict[str, float]:
        """Stage ``state`` and queue its write. Returns the blocking phases in seconds.

        ``wait`` is the previous write still running (backpressure); ``stage`` is the
        copy into reused buffers. Both block the training loop; nothing else does.
        """
        wait = self._saver.wait_idle()
        started = time.perf_counter()
        staged = self._stager.stage(state)
        stage = time.perf_counter() - started
        stall = {"wait": wait, "stage": stage}
        self._saver.submit(Job(step, staged, dict(metadata), stall, self._stager.nbytes))
        return stall

    @abstractmethod
    def _write(self, job: Job) -> dict[str, Any]:
        """Write ``job`` durably (background thread). Returns figures for the log line."""

    @abstractmethod
    def _describe(self, job: Job, result: dict[str, Any]) -> str:
        """The write half of the log line."""

    def _done(self, job: Job, result: dict[str, Any] | None, error: BaseException | None) -> None:
        """Writer thread: log the outcome and report it to the runtime's storage breaker
        (``self.breaker``, set by the runtime; see :mod:`ravex._breaker`)."""
        wait, stage = job.stall["wait"], job.stall["stage"]
        # the stager's figures are this job's: the next stage waits until this returns
        stall = f"stall {ms(wait + stage)} ms (wait {ms(wait)}, stage {ms(stage)}; {self._stager.summary()})"
        breaker = getattr(self, "breaker", None)
        if error is not None:
            self.failures += 1
            self.last_error = f"step {job.step}: {type(error).__name__}: {error}"
            self.last_error_step = job.step
            logger.error(
                "ravex: checkpoint of step %d to %s FAILED, training continues and the next "
                "interval retries: %s: %s",
                job.step, self.url, type(error).__name__, error,
            )
            if breaker is not None:
                breaker.failed(job.step)
            return
        self.written += 1
        self.last_written_step = job.step
        self.last_error = None
        total = time.perf_counter() - job.submitted
        self.last_line = (
            f"ravex: checkpoint step {job.step}: {stall} | {self._describe(job, result or {})} | "
            f"in background {ms(total)} ms -> {self.url}"
        )
        logger.info("%s", self.last_line)
        if breaker is not None:
            breaker.succeeded(job.step)

    def flush(self) -> None:
        """Block until every pending checkpoint write has completed (or failed)."""
        self._saver.flush()

    def close(self) -> None:
        self._saver.close()
        self._stager.release()

    @property
    def busy(self) -> bool:
        return self._saver.busy

    # ── reading ─────────────────────────────────────────────────────────

    url: str = ""

    @abstractmethod
    def complete_steps(self) -> list[int]:
        """Steps that can be resumed from, oldest first."""

    @abstractmethod
    def load_step(self, step: int) -> dict[str, Any] | None:
        """The state tree written at ``step``; arrays or tensors at the leaves."""

    def latest_step(self) -> int | None:
        steps = self.complete_steps()
        return steps[-1] if steps else None

    def load_latest(self) -> dict[str, Any] | None:
        step = self.latest_step()
        return None if step is None else self.load_step(step)

    def has_checkpoint(self) -> bool:
        return self.latest_step() is not None

    def prepare_writes(self, resumed_from: int | None) -> None:  # noqa: B027 - optional hook
        """Called once before this process's first write; drop stale partial steps."""


# ─── format (zarr) ──────────────────────────────────────────────────


class ZarrBackend(CheckpointBackend):
    """Default backend, on :mod:`ravex.format`."""

    name = "zarr"

    def __init__(self, config: Any, rank: int = 0, world_size: int = 1) -> None:
        from ravex.format import open_store

        self.store = open_store(
            config.storage.url, create=True, storage_options=config.storage.storage_options()
        )
        self.url = self.store.url
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self._writer: Any = None
        self.run_id: str | None = None  # several ranks: agreed by ravex._distributed
        self.writes_agreed = False
        self._refs_pending: list[int] = []
        super().__init__(as_numpy=True, config=config)

    def _make_writer(self) -> Any:
        kwargs: dict[str, Any] = {
            "rank": self.rank, "world_size": self.world_size,
            "compression": self.config.compression,
        }
        if self.run_id is not None:
            kwargs["run"] = self.run_id
        params = inspect.signature(self.store.writer).parameters
        if "delta" in params:
            kwargs["delta"] = self.config.delta
        elif not self.config.delta:
            logger.warning("ravex: this format version has no `delta` switch; writing deltas anyway")
        return self.store.writer(**kwargs)

    def _write(self, job: Job) -> dict[str, Any]:
        if self._writer is None:
            self._writer = self._make_writer()
        tree = job.tree
        if isinstance(tree, dict) and "distributed" in tree:
            from ravex import _distributed

            tree = _distributed.plan_write(tree, self.rank, self.world_size)
        from ravex import _chunking  # small chunks for sparsely updated tables

        self._chunk_bytes = _chunking.writer_chunk_bytes(tree, getattr(self, "_chunk_bytes", None))
        extra = {"chunk_bytes": self._chunk_bytes} if self._chunk_bytes else {}
        try:
            stats = self._writer.commit(job.step, tree, metadata=job.metadata, **extra)
        except BaseException:
            self._drop_writer()  # next interval starts from a fresh writer
            raise
        result: dict[str, Any] = {"stats": stats}
        if self.world_size > 1 and self.rank == 0:
            self._write_refs(job.step)
        if (self.config.keep_last or self.config.keep_every) and self.rank == 0:  # one GC per store
            started = time.perf_counter()
            try:
                self.store.gc(keep_last=self.config.keep_last, keep_every=self.config.keep_every)
            except Exception as exc:  # retention failing is not a failed checkpoint
                logger.warning("ravex: retention (gc) failed after step %d: %s", job.step, exc)
            result["gc"] = time.perf_counter() - started
        return result

    def _drop_writer(self) -> None:
        writer, self._writer = self._writer, None
        close = getattr(writer, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                pass

    def _describe(self, job: Job, result: dict[str, Any]) -> str:
        s = result["stats"]
        sec = dict(getattr(s, "seconds", {}) or {})
        phases = " ".join(f"{k} {ms(sec[k])}" for k in ("hash", "encode", "write", "manifest") if k in sec)
        gc = f" gc {ms(result['gc'])}" if "gc" in result else ""
        return (
            f"{phases}{gc} ms | {mib(s.new_bytes)} new ({s.new_chunks} chunks), "
            f"{mib(s.reused_bytes)} reused ({s.reused_chunks} chunks) of {mib(s.logical_bytes)}"
        )

    def complete_steps(self) -> list[int]:
        return sorted(self.store.complete_steps())

    def _write_refs(self, step: int) -> None:
        """Rank 0 writes ``refs.json`` of the multi-rank steps it has seen complete (a step
        completes when its slowest rank commits: a pending one is retried next time)."""
        from ravex.format.refs import refs_worth_writing, write_refs

        self._refs_pending = [*self._refs_pending[-7:], step]
        for pending in list(self._refs_pending):
            try:
                if self.store.step_info(pending).complete:
                    if refs_worth_writing(self.store, pending):
                        write_refs(self.store, pending)
                    self._refs_pending.remove(pending)
            except Exception as exc:  # the step is readable without it
                logger.warning("ravex: refs.json of step %d not written: %s", pending, exc)
                self._refs_pending.remove(pending)

    def load_step(self, step: int, lazy: bool = False) -> dict[str, Any] | None:
        """The step's tree; with ``lazy`` (one rank) its tensors are left as ``ArrayRef``
        leaves, for the runtime to read straight into the live tensors (``_state.restore``)."""
        if self.world_size == 1 and self.store.step_info(step).world_size == 1:
            reader = self.store.open_step(step)
            tree = reader.tree(0)
            if "distributed" not in tree:
                return tree if lazy else reader.read(rank=0)
        from ravex import _distributed

        return _distributed.load_tree(self.store, step, self.rank, self.world_size)

    def prepare_writes(self, resumed_from: int | None) -> None:
        # docstring inherited
        if self.world_size > 1:  # rank 0 drops partial steps before any rank writes
            from ravex import _distributed

            _distributed.start_writes(self, self.rank, self.world_size)
            return
        latest = self.latest_step()
        floor = max(s for s in (resumed_from, latest, -1) if s is not None)
        self.store.discard_incomplete_above(floor)

    def close(self) -> None:
        super().close()
        self._drop_writer()


# ─── torch.save fallback ────────────────────────────────────────────

_STEP_FILE = re.compile(r"step_(\d+)\.pt$")


class TorchSaveBackend(CheckpointBackend):
    """Fallback backend: one ``.pt`` file per checkpoint, written atomically."""

    name = "torch_save"

    def __init__(self, config: Any, rank: int = 0, world_size: int = 1) -> None:
        path = config.storage.local_path
        if path is None:
            raise ValueError(f"backend torch_save writes local files only, not {config.storage.url!r}")
        self.directory = path if rank == 0 else os.path.join(path, f"rank_{rank}")
        self.url = self.directory
        self.keep_last = config.keep_last
        os.makedirs(self.directory, exist_ok=True)
        super().__init__(as_numpy=False, config=config)

    def _path(self, step: int) -> str:
        return os.path.join(self.directory, f"step_{step:012d}.pt")

    def _write(self, job: Job) -> dict[str, Any]:
        import torch

        path = self._path(job.step)
        temporary = path + ".tmp"
        started = time.perf_counter()
        try:
            with open(temporary, "wb") as fh:
                torch.save({**job.tree, "_ravex_metadata": job.metadata}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temporary, path)  # atomic: never leave a half file under the real name
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        written = time.perf_counter() - started
        self._prune()
        return {"write": written, "bytes": os.path.getsize(path)}

    def _describe(self, job: Job, result: dict[str, Any]) -> str:
        return f"write {ms(result['write'])} ms | {mib(result['bytes'])} new, 0.0 MiB reused"

    def _prune(self) -> None:
        if not self.keep_last:
            return
        files = self._files()
        for stale in files[: max(0, len(files) - self.keep_last)]:
            try:
                os.remove(stale)
            except OSError as exc:  # pragma: no cover - defensive
                logger.warning("ravex: could not delete old checkpoint %s: %s", stale, exc)

    def _files(self) -> list[str]:
        files = glob.glob(os.path.join(self.directory, "step_*.pt"))
        return sorted(files, key=lambda f: int(_STEP_FILE.search(f).group(1)))  # type: ignore[union-attr]

    def complete_steps(self) -> list[int]:
        return [int(_STEP_FILE.search(f).group(1)) for f in self._files()]  # type: ignore[union-attr]

    def load_step(self, step: int) -> dict[str, Any] | None:
        """Unpickle ``step_<n>.pt`` with ``weights_only=True``: only tensors, containers and plain
        values are built, so a file whose pickle names any other callable (a ``__reduce__`` that
        runs ``os.system``) is refused before any of it runs. What Ravex writes needs nothing
        more; numpy arrays, scalars and dtypes (data, not code) are also allowed for this load
        only, in case a custom optimizer or scheduler keeps one in its ``state_dict``."""
        import pickle
        import zipfile

        import numpy as np
        import torch

        from ravex.errors import CorruptObjectError

        path = self._path(step)
        if not os.path.exists(path):
            return None
        multiarray = (np._core if hasattr(np, "_core") else np.core).multiarray
        numpy_data = [np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar]
        numpy_data += [type(np.dtype(t)) for t in "?bhilqBHILQefdgFDG"]
        try:
            with torch.serialization.safe_globals(numpy_data):
                state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if "global" in ln.lower()]
            if not lines:  # not a refused callable: garbage where a pickle should be
                raise CorruptObjectError(f"{path}: step {step} is truncated or corrupt (UnpicklingError: "
                                         f"{' '.join(str(exc).split())[:200]})") from None
            why = lines[0][:300]
            raise CorruptObjectError(
                f"{path}: refused to load step {step}: its pickle names code that torch.load(weights_only=True) "
                f"does not run ({why}); Ravex never writes that, so the file was not written by Ravex or was "
                "tampered with. Move it away to resume from an earlier step"
            ) from None
        except (EOFError, RuntimeError, ValueError, zipfile.BadZipFile) as exc:
            raise CorruptObjectError(f"{path}: step {step} is truncated or corrupt ({type(exc).__name__}: "
                                     f"{' '.join(str(exc).split())[:200]})") from None
        if not isinstance(state, dict):
            raise CorruptObjectError(f"{path}: step {step} holds a {type(state).__name__}, not a Ravex state tree")
        state.pop("_ravex_metadata", None)
        return state


# ─── selection ──────────────────────────────────────────────────────


def get_backend(config: Any, rank: int = 0, world_size: int = 1) -> CheckpointBackend:
    """Build the configured backend, falling back to ``torch_save``.

    A format backend that cannot start must not stop a training run; if the storage is
    local, the prototype's ``torch_save`` keeps the run protected.
    """
    if config.backend == "torch_save":
        return TorchSaveBackend(config, rank, world_size)
    try:
        return ZarrBackend(config, rank, world_size)
    except Exception as exc:
        if config.storage.local_path is None:
            raise
        logger.warning(
            "ravex: format backend unavailable (%s: %s); falling back to torch_save in %s",
            type(exc).__name__, exc, config.storage.local_path,
        )
        return TorchSaveBackend(config, rank, world_size)
