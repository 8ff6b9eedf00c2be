"""The ``torch_save`` backend: one ``step_<n>.pt`` per checkpoint, ``torch.save`` on the
writer thread, loaded back with ``weights_only=True``."""

from __future__ import annotations

import glob
import logging
import os
import pickle
import re
import time
import zipfile
from typing import Any, ClassVar

import numpy as np
import torch

from ravex.errors import CorruptObjectError
from ravex.format.storage import atomic_file

from .backend import CheckpointBackend
from .logline import mib, ms
from .plan import SavingSettings
from .writer_thread import Job

logger = logging.getLogger("ravex")

_STEP_FILE = re.compile(r"step_(\d+)\.pt$")


class TorchSaveBackend(CheckpointBackend):
    """Fallback backend: one ``.pt`` file per checkpoint, written atomically."""

    name: ClassVar[str] = "torch_save"

    def __init__(self, config: SavingSettings, rank: int = 0, world_size: int = 1) -> None:
        path = config.storage.local_path
        if path is None:
            raise ValueError(f"backend torch_save writes local files only, not {config.storage.url!r}")
        self.directory = path if rank == 0 else os.path.join(path, f"rank_{rank}")
        self.keep_last = config.keep_last
        os.makedirs(self.directory, exist_ok=True)
        super().__init__(self.directory, as_numpy=False, config=config)

    def _path(self, step: int) -> str:
        return os.path.join(self.directory, f"step_{step:012d}.pt")

    def _write(self, job: Job) -> dict[str, Any]:
        path = self._path(job.step)
        started = time.perf_counter()
        with atomic_file(path) as fh:  # never a half file under the real name
            torch.save({**job.plan.tree, "_ravex_metadata": job.plan.metadata}, fh)
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
