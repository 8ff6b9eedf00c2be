"""What the runtime hands the saving pipeline: one typed plan per checkpoint.

The runtime decides everything that needs the live objects (which tensors, this rank's part
of the layout, each array's chunk size) on the training thread and puts it here; the
pipeline below (stage, write, the steps after a commit) reads the plan and never reaches
back into the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ravex.format.history.runs import RunRecord
    from ravex.format.objects.hashing import KnownDigests


@dataclass(frozen=True)
class RowShard:
    """This rank's rows ``[offset, offset + len(local))`` of a tensor sharded on dimension 0
    (a ``Shard(0)`` DTensor): the local tensor is staged, the global array is written."""

    local: Any
    shape: tuple[int, ...]
    offset: int
    chunk_rows: int


@dataclass(frozen=True)
class RankLayout:
    """The tree is one rank's of several (or holds shards): which rank, of how many.

    Replicated arrays are then split between the ranks so that each chunk is written by
    exactly one of them (:func:`ravex.saving.ranks.place`)."""

    rank: int
    world_size: int


@dataclass(frozen=True)
class SavePlan:
    """One checkpoint: the state tree (tensors live, not copied) and how to write it."""

    step: int
    tree: dict[str, Any]
    metadata: dict[str, Any]
    #: None: the tree as one process writes it, every array whole
    layout: RankLayout | None = None
    #: array name -> chunk size in bytes, for the arrays that do not take the writer's default
    chunk_bytes: Mapping[str, int] = field(default_factory=dict)
    #: rank 0 of a run: what the run was, for a backend that records runs (its ``run`` is
    #: filled there, with the id the manifests carry) to write once, before its first manifest
    run_record: RunRecord | None = None
    #: digests of the staged tree's chunks, hashed as they were copied (the stager's ``known``)
    known_digests: KnownDigests = field(default_factory=dict)


class StorageSettings(Protocol):
    """Where checkpoints go (the runtime's ``StorageConfig``)."""

    url: str

    @property
    def local_path(self) -> str | None: ...

    def storage_options(self) -> dict[str, Any] | None: ...


class SavingSettings(Protocol):
    """The settings the pipeline reads (the runtime's ``RavexConfig`` has them all)."""

    @property
    def storage(self) -> StorageSettings: ...

    backend: str
    compression: str
    delta: bool
    chunk_tables: bool
    keep_last: int | None
    keep_every: int | None
    local: str | None
    persist_every: int
    persist_keep_last: int | None
    replicas: int
    skip_unchanged: bool
    full_stage_every: int
    staging_max_bytes: int | None


class Outcomes(Protocol):
    """Who hears how each checkpoint's write ended (the runtime's storage breaker)."""

    def failed(self, step: int | None = None) -> None: ...

    def succeeded(self, step: int | None = None) -> None: ...
