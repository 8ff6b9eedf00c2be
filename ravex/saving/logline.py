"""The checkpoint log line: one line per checkpoint, where its time went, the same whichever
path wrote it (the runtime's backends, Lightning's ``RavexCheckpointIO``): :func:`checkpoint_line`.

With several ranks the job prints one line per checkpoint, not one per rank (64 ranks would
print 64 lines that differ only in their figures): rank 0, once it sees the step complete,
reads every rank's manifest header and prints :func:`job_line`. Each rank records its own
stall in its manifest's metadata (:data:`STALL_KEY`) so that rank 0 can name the slowest
without a collective on the training thread; its own per-rank line stays in
``ravex.status()["last_log_line"]`` and at log level DEBUG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ravex.format import CommitStats

#: the manifest metadata member holding the rank's stall (wait + stage) in milliseconds
STALL_KEY = "stall_ms"


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def size(nbytes: float) -> str:
    """MiB, or KiB below one MiB (a small job's figures would all read 0.0 MiB)."""
    return mib(nbytes) if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def stall_text(wait: float, stage: float, staged: str) -> str:
    """What the training loop paid: the wait for the previous write and the copy."""
    return f"stall {ms(wait + stage)} ms (wait {ms(wait)}, stage {ms(stage)}; {staged})"


def copied_text(copied: int, tensors: int, copied_bytes: float, nbytes: float, full: bool = False) -> str:
    """What the stage copied of the state: tensors and bytes (``full``: a full stage, nothing skipped)."""
    return f"copied {copied}/{tensors} tensors, {mib(copied_bytes)} of {mib(nbytes)}{', full' if full else ''}"


def fault_text(fresh_bytes: float, seconds: float, prepared_bytes: float) -> str:
    """A first checkpoint's new staging memory: what faulting its pages in added to the stall
    (later checkpoints reuse it), and what the idle prepare thread had made ready before."""
    before = f", {mib(prepared_bytes)} prepared before" if prepared_bytes else ""
    return f"{mib(fresh_bytes)} of new staging memory faulted in: {ms(seconds)} ms, once{before}"


def commit_text(stats: CommitStats, gc: float | None = None) -> str:
    """The write half of a checkpoint's line: the commit's phases (and retention's ``gc``), then
    what it stored anew and what it reused of the step before."""
    sec = dict(stats.seconds or {})
    phases = " ".join(f"{k} {ms(sec[k])}" for k in ("hash", "encode", "write", "manifest") if k in sec)
    collected = f" gc {ms(gc)}" if gc is not None else ""
    return (
        f"{phases}{collected} ms | {mib(stats.new_bytes)} new ({stats.new_chunks} chunks), "
        f"{mib(stats.reused_bytes)} reused ({stats.reused_chunks} chunks) of {mib(stats.logical_bytes)}"
    )


def checkpoint_line(step: int, stall: str, written: str, background: float, url: str) -> str:
    """One written checkpoint's line, whichever path wrote it: what the training loop paid
    (:func:`stall_text`), what the write did, and how long the handoff took to be durable."""
    return f"ravex: checkpoint step {step}: {stall} | {written} | in background {ms(background)} ms -> {url}"


def stall_ms(wait: float, stage: float) -> str:
    """The stall as :data:`STALL_KEY` records it (metadata values are strings)."""
    return f"{(wait + stage) * 1000:.1f}"


def job_line(step: int, headers: Sequence[Mapping[str, Any]], url: str) -> str:
    """Rank 0's line for a complete multi-rank step, from its ranks' manifest headers
    (:func:`ravex.format.reports.summary.read_manifest_header`): the slowest rank's stall and
    which rank, bytes new and reused summed over the ranks, and how many ranks."""

    def total(name: str) -> int:
        return sum(int((h.get("stats") or {}).get(name, 0) or 0) for h in headers)

    stalls: dict[int, float] = {}
    for h in headers:
        try:
            stalls[int(h["rank"])] = float((h.get("metadata") or {})[STALL_KEY])
        except (KeyError, TypeError, ValueError):
            pass  # a writer that did not record it
    if stalls:
        slowest = max(stalls, key=lambda r: stalls[r])
        stall = f"stall {stalls[slowest]:.1f} ms (slowest: rank {slowest})"
    else:
        stall = "stall - ms"
    return (
        f"ravex: checkpoint step {step} ({len(headers)} ranks): {stall} | "
        f"{size(total('new_bytes'))} new, {size(total('reused_bytes'))} reused of "
        f"{size(total('logical_bytes'))} -> {url}"
    )


def failed_line(step: int, world_size: int, missing: Sequence[int], url: str, why: str) -> str:
    """Rank 0's line for a multi-rank step that did not complete: which ranks' manifests are missing."""
    return (
        f"ravex: checkpoint step {step} ({world_size} ranks) FAILED on ranks {list(missing)} "
        f"({why}; their own output says why): the step is incomplete, not a resume point -> {url}"
    )


def unsettled_line(step: int, world_size: int, missing: Sequence[int], url: str, waited: float) -> str:
    """Rank 0's line at exit for a multi-rank step whose other manifests had not landed: late or
    failed, rank 0 cannot tell, and the step may still complete once it is gone."""
    return (
        f"ravex: checkpoint step {step} ({world_size} ranks) NOT COMPLETE when rank 0 exited: no manifest "
        f"from ranks {list(missing)} {waited:.0f} s after its own (late ranks complete it without rank 0, "
        f"`ravex ls` says; a failed one's output says why) -> {url}"
    )
