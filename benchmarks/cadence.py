"""(k) ``checkpoint_every: auto`` against fixed cadences: failures simulated at a stated rate over
a measured checkpoint cost.

A job of ``work`` seconds of training checkpoints every ``interval`` seconds of training, each
checkpoint costing ``cost`` seconds of the loop's time (what benchmark (h) measures as lost per
checkpoint). Failures come at exponential times of mean ``mtbf`` (wall clock); each loses the
training since the last checkpoint and ``restart`` seconds to come back. Every trial runs the
job to its end; the figure is the wall time beyond the work, as a share of the work: the
checkpoints' overhead plus the work lost and the restarts. The interval ``auto`` picks
(:func:`ravex.runtime.counting.autocadence.interval`) is set against ten times shorter and ten
times longer ones, all on the same failure draws.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

from ravex.runtime.counting.autocadence import interval


def simulate(work: float, interval_s: float, cost: float, mtbf: float, restart: float,
             rng: random.Random) -> dict[str, float]:
    """One job to its end: seconds spent checkpointing, lost to failures (work and restarts)."""
    done = spent = lost = 0.0
    while done < work:
        segment = min(interval_s, work - done)
        wall = segment + (cost if done + segment < work else 0.0)
        failure = rng.expovariate(1.0 / mtbf)
        if failure >= wall:
            done += segment
            spent += wall - segment
        else:
            lost += failure + restart
    return {"checkpointing": spent, "lost": lost}


def run(cost: float, mtbf: float, restart: float, work: float, max_overhead: float = 0.02,
        trials: int = 200, seed: int = 0) -> dict[str, Any]:
    """``auto``'s interval and the two around it, each over the same ``trials`` failure draws."""
    best = interval(cost, mtbf, max_overhead)
    rows = []
    for name, every in (("auto", best), ("10x shorter", best / 10), ("10x longer", best * 10)):
        rng = random.Random(seed)
        runs = [simulate(work, every, cost, mtbf, restart, rng) for _ in range(trials)]
        ckpt = statistics.fmean(r["checkpointing"] for r in runs)
        lost = statistics.fmean(r["lost"] for r in runs)
        rows.append({"cadence": name, "interval_s": every, "checkpointing_pct": 100 * ckpt / work,
                     "lost_pct": 100 * lost / work, "waste_pct": 100 * (ckpt + lost) / work})
    return {"cost_s": cost, "mtbf_s": mtbf, "restart_s": restart, "work_s": work, "trials": trials,
            "max_overhead": max_overhead, "rows": rows}


def table(res: dict[str, Any]) -> str:
    lines = [f"cost {res['cost_s']:g} s, MTBF {res['mtbf_s'] / 3600:g} h, restart {res['restart_s']:g} s, "
             f"{res['work_s'] / 86400:g} days of training, {res['trials']} trials",
             "| cadence | interval | checkpointing | work lost + restarts | total waste |",
             "|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['cadence']} | {r['interval_s']:.0f} s | {r['checkpointing_pct']:.2f}% | "
                     f"{r['lost_pct']:.2f}% | {r['waste_pct']:.2f}% |")
    return "\n".join(lines)
