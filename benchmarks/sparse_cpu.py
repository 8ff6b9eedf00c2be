"""(i) A sparse table's checkpoint: CPU it takes from training, chunk tables against JSON chunk maps.

A table in 2 KiB chunks has 131k chunks per 256 MiB. Written as JSON chunk entries (spec §5),
every commit spent Python per chunk (hash, look up, entry, JSON, parse, GC scan) whether the
chunk changed or not; as a chunk table (spec §5.1, format 1.2) the unchanged rows cost numpy only.

Measured through ``ravex.activate()`` (what a user runs) on the (c) workload: an
``nn.Embedding(sparse=True)`` + ``SparseAdam`` table (by default 1<<20 x 64 fp32 with two
moments, 768 MiB in 3 x 131k chunks), each interval updating ~1% of the rows (Zipf), a
checkpoint after each, ``keep_last: 3`` (retention and GC run, as for a user). Per checkpoint:
the process's CPU seconds from ``ravex.checkpoint()`` until ``ravex.flush()`` returns. The loop
waits in ``flush``, so that is the staging copy plus everything the background threads did.
Both forms (``chunk_tables: true`` and ``false``) see the same rows change, in rounds that
alternate which goes first; the figures are medians and the ratio map/table of one run.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .active import Active, free
from .state import SparseTable
from .util import remove

FORMS = {"table": True, "map": False}


@dataclass
class Config:
    rows: int = 1 << 20
    dim: int = 64
    intervals: int = 3  # checkpoints measured per round, after the first (full) one
    reps: int = 2  # rounds per form
    scratch: str = ""
    log: Callable[[str], None] = field(default=print)


def quick() -> Config:
    return Config(rows=1 << 15, dim=16, intervals=2, reps=1)


def _round(cfg: Config, form: str) -> list[dict[str, Any]]:
    store = os.path.join(cfg.scratch, f"i-{form}")
    tab = SparseTable(cfg.rows, cfg.dim)  # the same seed for both forms: the same rows change
    out = []
    try:
        with Active(store, keep_last=3, chunk_tables=FORMS[form]) as act:
            act.checkpoint()
            for _ in range(cfg.intervals):
                ids = tab.interval()
                c0 = time.process_time()
                r = act.checkpoint()
                out.append({"cpu_s": time.process_time() - c0, "durable_s": r["durable_s"],
                            "stall_s": r["stall_s"], "manifest_bytes": r["manifest_bytes"],
                            "new_bytes": r["new_bytes"], "chunks": r["chunks"], "rows_changed": int(ids.size)})
    finally:
        del tab
        free()
        remove(store)
    return out


def run(cfg: Config) -> dict[str, Any]:
    log = cfg.log
    log(f"(i) sparse table {cfg.rows} x {cfg.dim} + SparseAdam, ~1% rows per interval: background CPU per "
        f"checkpoint, chunk tables against JSON maps, {cfg.reps} rounds x {cfg.intervals} checkpoints ...")
    got: dict[str, list[dict[str, Any]]] = {form: [] for form in FORMS}
    for rep in range(cfg.reps):
        for form in (("table", "map") if rep % 2 == 0 else ("map", "table")):
            runs = _round(cfg, form)
            got[form] += runs
            cpu = ", ".join(f"{r['cpu_s']:.2f}" for r in runs)
            log(f"  round {rep + 1} {form:>5}: CPU s per checkpoint {cpu}; "
                f"manifest {runs[-1]['manifest_bytes'] / 2**20:.1f} MiB")
    forms = {}
    for form, runs in got.items():
        forms[form] = {
            "checkpoints": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in runs],
            "median_cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 4),
            "median_durable_s": round(statistics.median(r["durable_s"] for r in runs), 4),
            "median_manifest_bytes": int(statistics.median(r["manifest_bytes"] for r in runs)),
            "median_new_bytes": int(statistics.median(r["new_bytes"] for r in runs)),
        }
    t, m = forms["table"], forms["map"]
    return {
        "table": {"rows": cfg.rows, "dim": cfg.dim, "dtype": "float32", "chunk_bytes": 2048,
                  "chunks": got["table"][0]["chunks"], "rows_changed_per_interval": got["table"][0]["rows_changed"],
                  "state_bytes": 3 * cfg.rows * cfg.dim * 4},
        "forms": forms,
        "ratios": {
            "map_over_table_cpu": round(m["median_cpu_s"] / t["median_cpu_s"], 3),
            "map_over_table_manifest_bytes": round(m["median_manifest_bytes"] / t["median_manifest_bytes"], 3),
            "map_over_table_durable": round(m["median_durable_s"] / t["median_durable_s"], 3),
        },
    }
