"""Which backend a run writes through: the configured one, or ``torch_save`` when the format
backend cannot start on local storage."""

from __future__ import annotations

import logging

from ravex.format import RavexError

from .backend import CheckpointBackend
from .plan import SavingSettings
from .torch_save import TorchSaveBackend
from .zarr import ZarrBackend

logger = logging.getLogger("ravex")


def get_backend(config: SavingSettings, rank: int = 0, world_size: int = 1) -> CheckpointBackend:
    """Build the configured backend, falling back to ``torch_save``.

    A format backend that cannot start must not stop a training run; if the storage is
    local, ``torch_save`` keeps the run protected.
    """
    if config.replicas and config.local is None:
        raise RavexError(f"replicas: {config.replicas} keeps the steps of the local tier on another machine, and "
                         f"'local:' is not set: set 'local:' (a path on each machine) or drop 'replicas:'")
    if config.local is not None:  # two tiers: one format in both, and no quiet fallback to one
        if config.backend == "torch_save":
            raise RavexError(f"local: {config.local!r} needs the default backend (the tiers are Ravex "
                             f"stores): drop 'backend: torch_save' or 'local:'")
        return ZarrBackend(config, rank, world_size)
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
