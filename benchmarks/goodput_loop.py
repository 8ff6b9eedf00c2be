"""``python -m benchmarks goodput --modes loop``: scenario (h) as a user's training loop sees it.

The paired cycles of :mod:`benchmarks.goodput` isolate one checkpoint's cost; a user measures
something plainer: the same script run with and without checkpointing, the difference divided
by the checkpoints taken. This mode is that measurement, on the loop a user writes:

    model, optimizer = 6 x Linear(4096) + AdamW          # 1.125 GiB of state
    for i in range(WARMUP + CHECKPOINTS * EVERY):
        x = torch.randn(batch, width)                   # a fresh batch
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()                          # set_to_none, the default

Ravex takes its checkpoints itself, as under ``ravex enable``: ``ravex.activate()`` before the
model is built, ``checkpoint_every: EVERY``, ``keep_last: 2``, every other setting its default.
The other contenders checkpoint after the same optimizer steps, from the loop. Each contender
runs the whole loop in its own process, then waits until its last checkpoint is durable; a
round runs every contender once (``no checkpoint`` included, in a rotated order), and a
contender's loss per checkpoint in a round is its time less ``no checkpoint``'s in the same
round, over the checkpoints. The figures are medians over the rounds (``--reps``, default 3).

Beside it, what the user sees of each checkpoint: the iteration that took it and the one after,
against the median iteration of ``no checkpoint``; for Ravex, the stalls its own log lines
report (``ravex: checkpoint step N: stall ...``), the first apart from the later ones.
"""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

from .goodput import _KINDS, PEERS, VARIANTS, Config, _build, _rounded, apply_settings, run_child

BASELINE = "no checkpoint"
CONTENDERS = (BASELINE, "bare copy", "copy + O_DIRECT write", "ravex", "dcp.async_save", "torch.save")
_STALL = re.compile(r"ravex: checkpoint step (\d+): stall ([0-9.]+) ms")


class StallLines(logging.Handler):
    """Keeps the stall of each ``ravex: checkpoint step N`` line the runtime logs."""

    def __init__(self) -> None:
        super().__init__()
        self.stalls: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = _STALL.match(record.getMessage())
        if m:
            self.stalls.append(float(m.group(2)) / 1000)


def loop_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One contender's whole loop: per-iteration seconds, the wait for durability at the end."""
    import torch

    warnings.filterwarnings("ignore")
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    name, every = spec["contender"], spec["every"]
    is_ravex = name == "ravex" or name in VARIANTS
    lines = StallLines()
    if is_ravex:
        import ravex

        logging.getLogger("ravex").addHandler(lines)
        ravex.activate(storage=os.path.join(spec["dir"], "ravex"), checkpoint_every=every, keep_last=2,
                       resume="never", checkpoint_on_exit=False, **apply_settings(VARIANTS.get(name, {})))
    model, opt = _build({**spec, "mode": "full"})
    ck = None if name == BASELINE or is_ravex else _KINDS[name](model, opt, spec)
    device = spec.get("device", "cpu")
    cuda = device != "cpu"
    gen = torch.Generator(device=device).manual_seed(1)
    iterations = spec["warmup"] + spec["checkpoints"] * every
    seconds: list[float] = []
    t0 = time.perf_counter()
    for i in range(iterations):
        t = time.perf_counter()
        x = torch.randn(spec["batch"], spec["width"], generator=gen, device=device)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        step = i + 1
        if ck is not None and step % every == 0 and step // every <= spec["checkpoints"]:
            ck.checkpoint(step)
        if cuda:  # the iteration's kernels done, not only queued
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t)
    t1 = time.perf_counter()
    if ck is not None:
        ck.finish()
    elif is_ravex:
        import ravex

        ravex.flush()
    t2 = time.perf_counter()
    out: dict[str, Any] = {"iteration_s": seconds, "loop_s": t1 - t0, "finish_s": t2 - t1, "total_s": t2 - t0,
                           "stalls_s": lines.stalls}
    if is_ravex:
        import ravex

        st = ravex.status()
        out["checkpoints_written"], out["last_error"] = st["checkpoints_written"], st["last_error"]
        if st["last_error"] or st["checkpoints_written"] < spec["checkpoints"]:
            raise RuntimeError(f"ravex wrote {st['checkpoints_written']} checkpoints: {st['last_error']}")
        ravex.deactivate()
    return out


def _run_one(cfg: Config, name: str) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="goodput-loop-", dir=cfg.scratch)
    spec = {"width": cfg.width, "layers": cfg.layers, "batch": cfg.batch, "checkpoints": cfg.checkpoints,
            "every": cfg.every, "warmup": cfg.warmup, "threads": cfg.threads, "device": cfg.device,
            "contender": name, "dir": folder}
    return run_child("benchmarks.goodput_loop", spec, f"goodput loop child {name!r}")


def _checkpoint_indices(cfg: Config, name: str) -> list[int]:
    """The iterations that take a checkpoint. Ravex's cadence takes step ``k * every``'s at the
    next forward pass, the others right after that step's ``optimizer.step()``, in its own iteration."""
    return [k * cfg.every - (name != "ravex" and name not in VARIANTS) for k in range(1, cfg.checkpoints + 1)]


def _own_plain(cfg: Config, name: str, seconds: list[float]) -> float:
    """The median of this process's own plain iterations: past the warmup, neither one that took a
    checkpoint nor the one after (for the baseline, every iteration past the warmup)."""
    taking = set() if name == BASELINE else set(_checkpoint_indices(cfg, name))
    for busy in ({j for i in taking for j in (i, i + 1)}, taking, set()):  # fewer left out where none is plain
        plain = [x for i, x in enumerate(seconds) if i >= cfg.warmup and i not in busy]
        if plain:
            return statistics.median(plain)
    return statistics.median(seconds)


def _checkpoint_iterations(cfg: Config, name: str, seconds: list[float],
                           plain: float) -> tuple[list[float], list[float]]:
    """Per checkpoint: how much longer than ``plain`` the iteration that took it ran, and the one after."""
    firsts, seconds_after = [], []
    for i in _checkpoint_indices(cfg, name):
        if i < len(seconds):
            firsts.append(seconds[i] - plain)
        if i + 1 < len(seconds):
            seconds_after.append(seconds[i + 1] - plain)
    return firsts, seconds_after


def run_loop(cfg: Config) -> dict[str, Any]:
    """Every contender of :data:`CONTENDERS` (those ``cfg.contenders`` names, and always the
    baseline) in ``cfg.reps`` rounds; the loss per checkpoint of each against the baseline."""
    names = [BASELINE, *(n for n in CONTENDERS if n != BASELINE and n in cfg.contenders), *cfg.variants]
    cfg.log(f"goodput loop: {3 * cfg.layers * (cfg.width * cfg.width + cfg.width) * 4 / (1 << 30):.3f} GiB state, "
            f"a checkpoint every {cfg.every} steps, {cfg.checkpoints} checkpoints, {cfg.reps} round(s) ...")
    rounds: list[dict[str, dict[str, Any]]] = []
    for rep in range(cfg.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        got = {name: _run_one(cfg, name) for name in order}
        base = got[BASELINE]
        plain = statistics.median(base["iteration_s"])
        for name, r in got.items():
            r["lost_per_checkpoint_s"] = (r["total_s"] - base["total_s"]) / cfg.checkpoints
            # the same inside the one process: its whole time past the warmup (Ravex's stalls at the
            # loop's head fall between the timed iterations) over as many of its own plain
            # iterations (a process that runs 5% faster throughout is not a checkpointer's gain)
            own = _own_plain(cfg, name, r["iteration_s"])
            past = r["total_s"] - sum(r["iteration_s"][:cfg.warmup])
            r["in_process_lost_per_checkpoint_s"] = (
                past - own * (len(r["iteration_s"]) - cfg.warmup)) / cfg.checkpoints
            r["first_iteration_over_s"], r["next_iteration_over_s"] = _checkpoint_iterations(
                cfg, name, r["iteration_s"], own)
            if name != BASELINE:
                cfg.log(f"  round {rep + 1}/{cfg.reps} {name:<34} lost {r['lost_per_checkpoint_s']:6.3f} s/ckpt "
                        f"(in the process {r['in_process_lost_per_checkpoint_s']:.3f}); "
                        f"whole loop {r['total_s']:.2f} s against {base['total_s']:.2f}; checkpoint iteration "
                        f"+{statistics.median(r['first_iteration_over_s']):.3f} s, next "
                        f"+{statistics.median(r['next_iteration_over_s']):.3f} s (iteration {plain:.3f} s"
                        + (f"; stalls {' '.join(f'{s:.3f}' for s in r['stalls_s'])}" if r["stalls_s"] else "")
                        + f"; load {os.getloadavg()[0]:.1f})")
        rounds.append(got)
    lost = {n: round(statistics.median(r[n]["lost_per_checkpoint_s"] for r in rounds), 4) for n in names[1:]}
    per_round = {n: [round(r[n]["lost_per_checkpoint_s"], 4) for r in rounds] for n in names[1:]}
    inside = {n: [round(r[n]["in_process_lost_per_checkpoint_s"], 4) for r in rounds] for n in names[1:]}
    entry: dict[str, Any] = {
        "lost_per_checkpoint_s": lost, "lost_per_round_s": per_round,
        "in_process_lost_per_checkpoint_s": {n: round(statistics.median(v), 4) for n, v in inside.items()},
        "in_process_lost_per_round_s": inside,
        "iteration_s": round(statistics.median(statistics.median(r[BASELINE]["iteration_s"]) for r in rounds), 4),
        "checkpoint_iteration_over_s": {n: round(statistics.median(x for r in rounds for x in
                                                                   r[n]["first_iteration_over_s"]), 4)
                                        for n in names[1:]},
        "next_iteration_over_s": {n: round(statistics.median(x for r in rounds for x in r[n]["next_iteration_over_s"]),
                                           4) for n in names[1:]},
        "runs": [{n: {k: _rounded(v) for k, v in r.items()} for n, r in got.items()} for got in rounds],
    }
    if "ravex" in lost:
        stalls = [r["ravex"]["stalls_s"] for r in rounds]
        entry["ravex_first_stall_s"] = round(statistics.median(s[0] for s in stalls if s), 4)
        entry["ravex_later_stall_s"] = round(statistics.median(x for s in stalls for x in s[1:]), 4)
        entry["ratios"] = {f"ravex_over_{key}": round(lost["ravex"] / lost[peer], 3) if lost[peer] > 0 else None
                           for peer, key in PEERS if peer in lost}
        # each round's own ratio: the goal holds in every quiet run, not only in the median
        entry["ratios_per_round"] = {
            f"ravex_over_{key}": [round(a / b, 3) if b > 0 else None for a, b in zip(per_round["ravex"],
                                                                                       per_round[peer], strict=True)]
            for peer, key in PEERS if peer in per_round}
        mid = entry["in_process_lost_per_checkpoint_s"]
        entry["ratios"].update({f"in_process_ravex_over_{key}": round(mid["ravex"] / mid[peer], 3)
                                if mid[peer] > 0 else None for peer, key in PEERS if peer in mid})
        for v in cfg.variants:
            entry["ratios"][f"{v}_over_ravex"] = round(lost[v] / lost["ravex"], 3) if lost["ravex"] > 0 else None
    return entry


if __name__ == "__main__":
    spec_json, out_path = sys.argv[1], sys.argv[2]
    result = loop_child(json.loads(spec_json))
    with open(out_path, "w") as fh:
        json.dump(result, fh)
