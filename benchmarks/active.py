"""The runtime as a user turns it on, for the scenarios that time it: :class:`Active`."""

from __future__ import annotations

import gc
import time
from typing import Any


def free() -> None:
    """Collect cyclic garbage between scenarios: an earlier scenario's objects must not be
    scanned by ``activate()`` as live ones, nor be freed inside a timing."""
    gc.collect()


class Active:
    """``ravex.activate()`` on the objects alive now, checkpointing only when asked.

    The commit's figures (CommitStats) are taken from the background writer's result, by
    wrapping the saver's write callable on this instance (Ravex itself is not changed)."""

    def __init__(self, store: str, collect: bool = True, registered: tuple[tuple[str, Any], ...] | None = None,
                 **overrides: Any) -> None:
        """``registered``: instead of ``activate()``'s scan of the heap for objects built before
        it, start the runtime as ``ravex enable``'s hook does at ``import torch`` (nothing to
        scan) and register these ``(kind, object)`` pairs as the patched constructors would
        have while they were built."""
        self.store = store
        self.collect = collect
        self.registered = registered
        self.overrides = {
            "storage": store, "checkpoint_every": 10**9, "keep_last": None, "resume": "never",
            "checkpoint_on_exit": False, "checkpoint_on_signal": [], "log_level": "WARNING", **overrides,
        }
        self.results: list[dict[str, Any]] = []

    def __enter__(self) -> Active:
        import ravex

        if self.collect:
            free()  # cyclic garbage of earlier scenarios must not be scanned as live objects
        if self.registered is None:
            self.rt = ravex.activate(**self.overrides)
        else:
            from ravex.runtime.config import RavexConfig
            from ravex.runtime.starting import lifecycle

            self.rt = lifecycle.start(RavexConfig.load(self.overrides), scan_existing=False)
            for kind, obj in self.registered:
                self.rt.registry.add(kind, obj)
        saver = self.rt.backend._saver
        inner = saver._write

        def write(job: Any) -> dict[str, Any]:
            result = inner(job)
            self.results.append(result)
            return result

        saver._write = write
        return self

    def __exit__(self, *exc: object) -> None:
        import ravex

        ravex.deactivate()
        self.registered = None  # this object may outlive the run: it must not keep a model alive

    def checkpoint(self) -> dict[str, Any]:
        """``ravex.checkpoint()`` then ``ravex.flush()``: what the loop paid and what it took to durable."""
        import ravex

        n = len(self.results)
        t0 = time.perf_counter()
        ok = ravex.checkpoint()
        call = time.perf_counter() - t0
        stall = dict(self.rt.last_stall or {})
        ravex.flush()
        durable = time.perf_counter() - t0
        st = ravex.status()
        if not ok or len(self.results) != n + 1 or st.get("last_error"):
            raise RuntimeError(f"ravex checkpoint failed: {st.get('last_error')}")
        stats = self.results[-1]["stats"]
        return {
            "call_s": call, "wait_s": stall.get("wait", 0.0), "stage_s": stall.get("stage", 0.0),
            "stall_s": stall.get("wait", 0.0) + stall.get("stage", 0.0), "durable_s": durable,
            "background_s": durable - call, "new_bytes": stats.new_bytes, "reused_bytes": stats.reused_bytes,
            "logical_bytes": stats.logical_bytes, "manifest_bytes": stats.manifest_bytes,
            "inline_bytes": stats.inline_bytes, "new_chunks": stats.new_chunks, "chunks": stats.chunks,
            "seconds": {k: round(v, 4) for k, v in stats.seconds.items()},
        }
