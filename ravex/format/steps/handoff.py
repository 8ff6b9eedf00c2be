"""One rank decides, the others are told: a step's manifests handed from rank 0 to every rank.

At a resume every rank needs the same complete step and the manifests of all its ranks (a
replicated tensor's chunks are spread over every writer's manifest, :mod:`ravex.saving.ranks`).
Read from storage by each rank, that is ``W`` GETs per rank and ``W²`` for the job, after each
rank has listed ``steps/`` and checked completeness on its own. Instead rank 0 alone lists and
reads them (it checks completeness anyway) and packs them into one payload that the runtime
broadcasts over the process group; every other rank adopts it (:func:`adopt_step`) and then
reads only chunk objects. The bytes stay the format's: this module packs the manifests as
rank 0 parsed them and parses them again on arrival, with the same checks a read from storage
gets (step, rank, one world size, one run).

Payload: ``MAGIC``, one JSON line ``{"timeline", "step", "sizes"}``, then each rank's manifest
(:meth:`~.manifest.Manifest.to_bytes`) back to back, rank 0 first.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..errors import ManifestError, StepNotFoundError
from ..history.timelines import in_span
from ..objects.names import is_decimal, manifest_ranks, no_rank_missing
from .manifest import Manifest

if TYPE_CHECKING:
    from .catalog import StoreCatalog

MAGIC = b"ravex-step-manifests/1\n"


def pack_step(catalog: StoreCatalog, step: int) -> bytes:
    """Rank 0: the manifests of complete ``step`` of ``catalog``'s timeline, as one payload
    (read from its cache when the completeness check already parsed them)."""
    info = catalog.step_info(step)
    if not info.complete:
        raise StepNotFoundError(f"step {step} of {catalog.url!r} is not complete ({info.problem})")
    world = info.world_size or 1
    return pack_manifests(catalog.timeline.name, step, [catalog.manifest(step, r) for r in range(world)])


def pack_manifests(timeline: str, step: int, manifests: list[Manifest]) -> bytes:
    """The payload of ``step``'s manifests (every rank's, rank 0 first) as a reader holds them:
    rank 0 packs what it already read, with no request."""
    parts = [m.to_bytes() for m in manifests]
    head = json.dumps({"timeline": timeline, "step": step, "sizes": [len(p) for p in parts]})
    return b"".join([MAGIC, head.encode(), b"\n", *parts])


def payload_timeline(payload: bytes) -> tuple[str, int]:
    """``(timeline, step)`` a payload is about, so a rank can open that timeline first."""
    head = _head(payload)[0]
    return str(head["timeline"]), int(head["step"])


def adopt_step(catalog: StoreCatalog, payload: bytes) -> int:
    """Every other rank: parse the payload and pin its manifests in ``catalog``, so that the
    step's completeness and every manifest of it are answered without a request
    (:meth:`StoreCatalog.pin_step`). A payload that does not hold one complete step of one run
    is a :class:`ManifestError`; the caller reads the step from storage instead. The step."""
    head, body = _head(payload)
    step, sizes = head["step"], head["sizes"]
    if type(step) is not int or not isinstance(sizes, list) or not sizes or \
            not all(type(s) is int and s >= 0 for s in sizes) or sum(sizes) != len(body):
        raise ManifestError("handed-over manifests: malformed header")
    manifests: list[Manifest] = []
    offset = 0
    for rank, size in enumerate(sizes):
        where = f"step {step} rank {rank} (handed over by rank 0)"
        m = Manifest.from_bytes(body[offset:offset + size], where)
        offset += size
        if m.step != step or m.rank != rank or m.world_size != len(sizes):
            raise ManifestError(f"{where}: manifest says step {m.step} rank {m.rank} of {m.world_size}")
        if manifests and m.run != manifests[0].run:
            raise ManifestError(f"{where}: another run than rank 0's (mixed writers)")
        manifests.append(m)
    catalog.pin_step(step, manifests)
    return step


def _head(payload: bytes) -> tuple[dict[str, Any], bytes]:
    if not payload.startswith(MAGIC):
        raise ManifestError("handed-over manifests: not a Ravex payload")
    end = payload.find(b"\n", len(MAGIC))
    try:
        head = json.loads(payload[len(MAGIC):end]) if end > 0 else None
    except ValueError:
        head = None
    if not isinstance(head, dict) or "step" not in head or "sizes" not in head or "timeline" not in head:
        raise ManifestError("handed-over manifests: malformed header")
    return head, payload[end + 1:]


def newest_own_step(catalog: StoreCatalog, rank: int, floor: int | None = None,
                    ceiling: int | None = None) -> int | None:
    """A rank other than 0, before the ranks can talk: the newest step whose folder lists every
    rank's manifest, this rank's among them, found without reading any other rank's: one
    listing of ``steps/`` (names only) and one of that step's folder (one request per 1000
    names). A guess rank 0 confirms or overrules when the ranks agree (it reads the manifests);
    it only names which step's recorded loop position this rank goes back to. A rank beyond the
    step's world size (the job now runs on more ranks) reads rank 0's manifest instead.
    ``floor``/``ceiling``: only steps ``floor < step <= ceiling`` (a timeline's share of a lineage)."""
    steps = sorted((int(n) for n in catalog.storage.list_dir(catalog.steps_prefix) if is_decimal(n)
                    and in_span(int(n), floor, ceiling)),
                   reverse=True)
    for step in steps[:4]:  # a crashed run leaves at most a partial step or two above the newest
        ranks = manifest_ranks(catalog.storage.list_dir(catalog.step_dir(step)))
        if not no_rank_missing(ranks):
            continue  # a rank's manifest is missing: never complete, no manifest read to know it
        source = 0 if ranks and rank > ranks[-1] else rank
        if source not in ranks:
            continue
        try:
            world = catalog.manifest(step, source).world_size
        except (ManifestError, StepNotFoundError, OSError):
            continue
        if ranks == list(range(world)) and (source == rank or rank >= world):
            return step
    return None
