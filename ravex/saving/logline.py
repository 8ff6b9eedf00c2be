"""The figures of the checkpoint log line: one line per checkpoint, where its time went."""

from __future__ import annotations


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def stall_text(wait: float, stage: float, staged: str) -> str:
    """What the training loop paid: the wait for the previous write and the copy."""
    return f"stall {ms(wait + stage)} ms (wait {ms(wait)}, stage {ms(stage)}; {staged})"
