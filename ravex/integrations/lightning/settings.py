"""What ``ravex.yaml`` asks of a zero-code Lightning run: read by the take-over (:mod:`.zerocode`),
which decides where the run begins, and by the cadence (:mod:`.loop`), which saves and prunes.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ZeroCode:
    """What ``ravex.yaml`` asks of a Lightning run that names no Ravex in its code."""

    url: str  #: the store (``storage``), which the runtime's own steps may share: their metadata tells them apart
    pointers: str  #: a local folder for the pointer files Lightning loads from
    every: int | None  #: ``checkpoint_every``: a checkpoint each time the global step is a multiple
    keep_last: int | None  #: the newest steps this run's saves keep (older ones lose their manifest)
    resume: str | int = "auto"  #: ``auto`` (the newest step the plugin wrote), ``never``, or a step
    on_exit: bool = True  #: ``checkpoint_on_exit``: one more at the end of ``fit``
    compression: str = "none"
    storage_options: dict[str, Any] | None = None
    #: the store beside ``url`` that earlier versions of Ravex wrote these steps to: ``resume: auto``
    #: resumes its newest Lightning step when ``url`` holds none (this run's saves go to ``url``)
    former: str | None = None

