"""``python -m benchmarks``: run a suite, print its table, write its JSON (and a PNG plot).

    python -m benchmarks all                    # format + runtime + scenarios, budget table, plot
    python -m benchmarks all --quick            # smoke test of everything: tiny states, < 2 minutes
    python -m benchmarks runtime                # (a) stall, (e) load/resume, (f) patch overhead
    python -m benchmarks scenarios              # (b) frozen, (c) sparse, (d) ten checkpoints, (g) bf16, (i) sparse CPU
    python -m benchmarks format                 # full run: ~1 GiB state, 3 repetitions
    python -m benchmarks format --quick         # smoke test: tiny state, well under a minute
    python -m benchmarks goodput                # (h) training time lost per checkpoint, busy loop
    python -m benchmarks cadence --cost 0.8     # (k) checkpoint_every: auto against fixed cadences, simulated
    python -m benchmarks stage                  # (m) the stall's copy alone and hashing as it copies
    python -m benchmarks tiers                  # (l) S3 alone against local: + S3, busy loop, moto server
    python -m benchmarks report out.json --markdown   # re-print a saved run (--plot PNG: redraw)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from . import report
from .util import git_rev, machine_notes

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
QUICK_MIB = 24



def _header(suite: str, args: argparse.Namespace) -> dict[str, Any]:
    """What every result file starts with: the suite, the command that made it, when, the
    commit and the machine."""
    return {
        "suite": suite,
        "command": "python -m benchmarks " + " ".join(args.argv),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": git_rev(REPO),
        "machine": machine_notes(args.dir),
        "quick": bool(args.quick),
    }

def _format(args: argparse.Namespace) -> int:
    res = _format_results(args)
    if res is None:
        return 2
    out = args.out or os.path.join(HERE, "out", "format-quick.json" if args.quick else "format.json")
    _write_json(res, out)
    report.show(res, plain=args.plain)
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


def _write_json(res: dict[str, Any], out: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=2)


def _format_results(args: argparse.Namespace) -> dict[str, Any] | None:
    from . import format_bench

    if args.quick:
        size = args.size_mib or QUICK_MIB
        reps = args.reps or 2
        sweep_mib = min(size, 12)
        chunks, threads, compressed = (1, 4), (2, 4), ()
    else:
        size = args.size_mib or 1024
        reps = args.reps or 3
        sweep_mib = args.sweep_mib or min(size, 256)
        chunks, threads, compressed = (1, 4, 16), (2, 4, 8), ("zstd", "blosc")
    os.makedirs(args.dir, exist_ok=True)
    free = shutil.disk_usage(args.dir).free
    need = size * (1 << 20) * 9  # one kept output per contender, plus the one being written
    if free < need:
        print(f"not enough space in {args.dir}: {free >> 20} MiB free, ~{need >> 20} MiB needed", file=sys.stderr)
        return None
    scratch = tempfile.mkdtemp(prefix="ravex-bench-", dir=args.dir)
    log = (lambda *a: None) if args.silent else (lambda *a: print(*a, file=sys.stderr, flush=True))
    cfg = format_bench.Config(
        size_mib=size, reps=reps, scratch=scratch, sweep_mib=sweep_mib, sweep_chunks_mib=chunks,
        sweep_threads=threads, sweep_compressed=compressed,
        cold=not (args.warm_only or args.quick),  # CI: never drop a shared machine's page cache
        settle=not args.quick,
        sections=tuple(args.only.split(",")) if args.only else format_bench.Config.sections, log=log,
    )
    try:
        res: dict[str, Any] = _header("format", args)
        res.update(format_bench.run(cfg))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return res


def _scenario_config(args: argparse.Namespace, sections: tuple[str, ...], scratch: str, log: Any) -> Any:
    from . import scenarios as SC

    if args.quick:  # every scenario tiny: checks that it runs, nothing else
        cfg = SC.Config(size_mib=16, frozen_mib=16, bf16_mib=8, sparse_rows=1 << 14, sparse_dim=16,
                        sparse_sweep_rows=1 << 12, sparse_sweep_chunks=(1 << 20, 16 << 10), intervals=3, reps=2,
                        a_reps=2, a_pairs=2, e_reps=2, overhead_pairs=2, overhead_steps=20, settle=False)
    else:
        cfg = SC.Config()
        if args.size_mib:
            cfg.size_mib = args.size_mib
            cfg.frozen_mib = cfg.bf16_mib = args.size_mib / 2
    if args.reps:
        cfg.reps = args.reps
    cfg.scratch, cfg.sections, cfg.log = scratch, sections, log
    return cfg


def _scenarios(args: argparse.Namespace) -> int:
    from . import budget
    from . import scenarios as SC

    sections = {"runtime": SC.RUNTIME, "scenarios": SC.SCENARIOS, "all": SC.RUNTIME + SC.SCENARIOS}[args.suite]
    if args.only:
        sections = tuple(args.only.split(","))
    log = (lambda *a: None) if args.silent else (lambda *a: print(*a, file=sys.stderr, flush=True))
    res: dict[str, Any] = _header(args.suite, args)
    t0 = time.perf_counter()
    if args.suite == "all" and not args.only:
        fargs = argparse.Namespace(**vars(args))
        fargs.warm_only = True
        fargs.sweep_mib = None
        fargs.only = "limits,write,read" if not args.quick else None
        if not args.quick:
            fargs.size_mib = args.size_mib or 512  # the 1 GiB format figures are the format suite's own run
        log("== format suite ==")
        fres = _format_results(fargs)
        if fres is None:
            return 2
        res["format"] = fres
    os.makedirs(args.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="ravex-scen-", dir=args.dir)
    try:
        log("== scenarios ==")
        res.update(SC.run(_scenario_config(args, sections, scratch, log)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    res["budget"] = budget.budget(res)
    res["total_wall_s"] = round(time.perf_counter() - t0, 1)
    res["loadavg_end"] = list(os.getloadavg())
    base = f"{args.suite}{'-quick' if args.quick else ''}"
    out = args.out or os.path.join(HERE, "out", base + ".json")
    _write_json(res, out)
    plot = args.plot or os.path.join(os.path.dirname(os.path.abspath(out)), base + ".png")
    budget.plot(res, plot)
    show(res, plain=args.plain)
    print(f"\nJSON: {out}\nplot: {plot}", file=sys.stderr)
    return 0


def show(res: dict[str, Any], plain: bool = False, markdown: bool = False) -> None:
    """Every table of a run: the budget and the scenarios', then the format suite's (alone or inside ``all``)."""
    from . import budget

    tabs = budget.tables(res) + report.tables(res.get("format", res))
    if markdown:
        print(report.render_markdown(tabs))
    else:
        report.show_tables(tabs, plain=plain)


def _goodput_config(args: argparse.Namespace, scratch: str, log: Any) -> Any:
    from . import goodput

    cfg = goodput.quick() if args.quick else goodput.Config()
    for opt in ("reps", "width", "batch", "checkpoints", "threads"):
        if getattr(args, opt, None):
            setattr(cfg, opt, getattr(args, opt))
    if getattr(args, "modes", None):
        cfg.modes = tuple(args.modes.split(","))
    if args.contenders:
        cfg.contenders = tuple(n.strip() for n in args.contenders.split(","))
    if args.ab:
        names = list(goodput.VARIANTS) if args.ab == "all" else [
            "ravex, " + n.strip() for n in args.ab.split(",")]
        unknown = [n for n in names + list(cfg.contenders) if n not in goodput.VARIANTS
                   and n not in goodput.CONTENDERS]
        if unknown:
            raise SystemExit(f"goodput: unknown contender or variant {unknown}; contenders: "
                             f"{', '.join(goodput.CONTENDERS)}; variants (--ab): "
                             f"{', '.join(v[len('ravex, '):] for v in goodput.VARIANTS)} or all")
        cfg.variants = tuple(names)
    cfg.scratch, cfg.log = scratch, log
    return cfg


def _goodput(args: argparse.Namespace) -> int:
    from . import budget, goodput

    log = (lambda *a: None) if args.silent else (lambda *a: print(*a, file=sys.stderr, flush=True))
    res: dict[str, Any] = _header("goodput", args)
    os.makedirs(args.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="ravex-goodput-", dir=args.dir)
    try:
        cfg = _goodput_config(args, scratch, log)
        res["h_goodput"] = goodput.run(cfg)
        if goodput.LOOP in cfg.modes:
            from . import goodput_loop

            res["h_goodput"]["modes"][goodput.LOOP] = goodput_loop.run_loop(cfg)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    res["budget"] = budget.budget(res)
    out = args.out or os.path.join(HERE, "out", f"goodput{'-quick' if args.quick else ''}.json")
    _write_json(res, out)
    show(res, plain=args.plain)
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


def _cadence(args: argparse.Namespace) -> int:
    from . import cadence

    res: dict[str, Any] = _header("cadence", args)
    runs = [cadence.run(args.cost, hours * 3600, args.restart, args.days * 86400, trials=args.trials)
            for hours in args.mtbf_hours]
    res["runs"] = runs
    out = args.out or os.path.join(HERE, "out", "cadence.json")
    _write_json(res, out)
    print("\n\n".join(cadence.table(r) for r in runs))
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


def _stage(args: argparse.Namespace) -> int:
    from . import stage

    res: dict[str, Any] = _header("stage", args)
    res["run"] = stage.run(24 if args.quick else args.mib, 1 if args.quick else args.reps)
    out = args.out or os.path.join(HERE, "out", "stage-quick.json" if args.quick else "stage.json")
    _write_json(res, out)
    print(stage.table(res["run"]))
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


def _tiers(args: argparse.Namespace) -> int:
    from . import tiers

    res: dict[str, Any] = _header("tiers", args)
    sizes = dict(width=256, layers=2, batch=16, every=4, iters=12, reps=1) if args.quick else {}
    for key in ("width", "layers", "batch", "every", "iters", "reps"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    res.update(tiers.run(scratch=args.dir, log=lambda line: print(line, file=sys.stderr), **sizes))
    out = args.out or os.path.join(HERE, "out", "tiers-quick.json" if args.quick else "tiers.json")
    _write_json(res, out)
    print(tiers.table(res))
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


def _gpu(args: argparse.Namespace) -> int:
    from . import gpu

    res: dict[str, Any] = _header("gpu", args)
    res.update(gpu.run(args.device, args.quick, args.parts.split(","), log=lambda line: print(line, file=sys.stderr)))
    out = args.out or os.path.join(HERE, "out", "gpu-quick.json" if args.quick else "gpu.json")
    _write_json(res, out)
    print(gpu.table(res))
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace) -> int:
    with open(args.json) as f:
        res = json.load(f)
    show(res, plain=args.plain, markdown=args.markdown)
    if args.plot:
        from . import budget

        budget.plot(res, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="suite", required=True)
    f = sub.add_parser("format", help="the format against torch.save, safetensors and DCP")
    f.add_argument("--quick", action="store_true",
                   help=f"smoke test: {QUICK_MIB} MiB state, 2 reps, warm loads only, short sweep (under a minute)")
    f.add_argument("--size-mib", type=float, help="checkpoint size (weights + AdamW moments); default 1024")
    f.add_argument("--reps", type=int, help="repetitions per figure (median); default 3")
    f.add_argument("--sweep-mib", type=float, help="state size for the chunk x threads sweep; default 256")
    f.add_argument("--dir", default=tempfile.gettempdir(), help="scratch folder on the disk under test")
    f.add_argument("--out", help="JSON path; default benchmarks/out/format[-quick].json")
    f.add_argument("--only", help="comma list of sections: limits,write,read,delta,sweep")
    f.add_argument("--warm-only", action="store_true", help="do not drop the page cache before loads")
    f.add_argument("--plain", action="store_true", help="plain-text table even on a terminal")
    f.add_argument("--silent", action="store_true", help="no progress lines on stderr")
    f.set_defaults(func=_format)
    for name, what in (("all", "format suite + every scenario, budget table and plot"),
                       ("runtime", "(a) stall, (e) load/resume, (f) patch overhead, through ravex.activate()"),
                       ("scenarios", "(b) frozen, (c) sparse embedding, (d) ten checkpoints, (g) bf16, "
                                     "(i) sparse table CPU")):
        a = sub.add_parser(name, help=what)
        a.add_argument("--quick", action="store_true", help="smoke test: every scenario tiny (under 2 minutes)")
        a.add_argument("--size-mib", type=float, help="(a)/(e) dense state size; (b)/(d)/(g) get half; default 1024")
        a.add_argument("--reps", type=int, help="repetitions per figure (median); default 3")
        a.add_argument("--dir", default=tempfile.gettempdir(), help="scratch folder on the disk under test")
        a.add_argument("--out", help=f"JSON path; default benchmarks/out/{name}[-quick].json")
        a.add_argument("--plot", help="PNG path; default next to the JSON")
        a.add_argument("--only", help="comma list of scenarios: a_stall,e_load,f_patch_overhead,b_frozen,"
                                      "c_sparse,d_ten_checkpoints,g_bf16,i_sparse_cpu (skips the format suite)")
        a.add_argument("--plain", action="store_true", help="plain-text table even on a terminal")
        a.add_argument("--silent", action="store_true", help="no progress lines on stderr")
        a.set_defaults(func=_scenarios)
    g = sub.add_parser("goodput", help="(h) training time lost per checkpoint while the loop keeps the cores busy")
    g.add_argument("--quick", action="store_true", help="smoke test: tiny model, 6 iterations (seconds)")
    g.add_argument("--reps", type=int, help="runs of every contender (median); default 1")
    g.add_argument("--width", type=int, help="Linear layers' width; default 4096 (1.125 GiB of state)")
    g.add_argument("--batch", type=int, help="rows per iteration; default 16")
    g.add_argument("--modes", help="comma list: full,frozen,loop (default full,frozen; loop: the user's "
                                   "loop with Ravex's own cadence, whole runs against an unchecked one)")
    g.add_argument("--checkpoints", type=int, help="checkpoint/quiet cycle pairs per process; default 6")
    g.add_argument("--threads", type=int, help="torch threads in the loop (default: every core; 1 here leaves a "
                   "core idle, as a GPU-bound loop does)")
    g.add_argument("--contenders", help="comma list (default: bare copy,ravex,dcp.async_save,torch.save)")
    g.add_argument("--ab", help="also Ravex variants, comma list (page cache,1 writer thread,2 writer threads,"
                                "4 writer threads,8 writer threads,64 MiB chunks,1 sync thread,witness off,"
                                "prepare at normal priority,"
                                "no prepare,hash after copying,staging cap 256 MiB) or all")
    g.add_argument("--dir", default=tempfile.gettempdir(), help="scratch folder on the disk under test")
    g.add_argument("--out", help="JSON path; default benchmarks/out/goodput[-quick].json")
    g.add_argument("--plain", action="store_true", help="plain-text table even on a terminal")
    g.add_argument("--silent", action="store_true", help="no progress lines on stderr")
    g.set_defaults(func=_goodput)
    k = sub.add_parser("cadence", help="(k) checkpoint_every: auto against 10x shorter and longer fixed "
                                       "intervals, failures simulated over a measured cost")
    k.add_argument("--cost", type=float, required=True,
                   help="seconds a checkpoint takes from the loop (benchmark (h): lost per checkpoint)")
    k.add_argument("--mtbf-hours", type=float, nargs="+", default=[6.0, 1.0], help="default 6 1")
    k.add_argument("--restart", type=float, default=60.0, help="seconds to come back after a failure; default 60")
    k.add_argument("--days", type=float, default=7.0, help="training to finish; default 7 days")
    k.add_argument("--trials", type=int, default=200, help="jobs simulated per cadence; default 200")
    k.add_argument("--out", help="JSON path; default benchmarks/out/cadence.json")
    k.set_defaults(func=_cadence, dir=tempfile.gettempdir(), quick=False)
    m = sub.add_parser("stage", help="(m) the stall's copy alone against hashing each chunk as it lands")
    m.add_argument("--quick", action="store_true", help="smoke test: 24 MiB, one rep")
    m.add_argument("--mib", type=int, default=1152, help="bytes staged, MiB; default 1152 (benchmark (h)'s state)")
    m.add_argument("--reps", type=int, default=9, help="runs of each variant (median); default 9")
    m.add_argument("--out", help="JSON path; default benchmarks/out/stage[-quick].json")
    m.set_defaults(func=_stage, dir=tempfile.gettempdir())
    t = sub.add_parser("tiers", help="(l) S3 alone against local: + S3 (persist_every 1 and 10), a busy loop, "
                                     "against a moto server started here")
    t.add_argument("--quick", action="store_true", help="smoke test: a tiny model, one rep (seconds)")
    for key, default in (("width", 2048), ("layers", 4), ("batch", 256), ("every", 10), ("iters", 100), ("reps", 3)):
        t.add_argument(f"--{key}", type=int, help=f"default {default}")
    t.add_argument("--dir", default=tempfile.gettempdir(),
                   help="scratch folder (the local tiers) on the disk under test")
    t.add_argument("--out", help="JSON path; default benchmarks/out/tiers[-quick].json")
    t.set_defaults(func=_tiers)
    u = sub.add_parser("gpu", help="issue 34 on one device: exact resume (bf16, fp16 + GradScaler), the witness "
                       "without determinism, goodput against DCP, the stall against a pinned device-to-host "
                       "copy, restore against torch.load")
    u.add_argument("--device", default="cuda", help="cuda (default) or cpu (a rehearsal)")
    u.add_argument("--quick", action="store_true", help="tiny sizes (seconds)")
    u.add_argument("--parts", default="resume,goodput,stall", help="comma list: resume,goodput,stall")
    u.add_argument("--out", help="JSON path; default benchmarks/out/gpu[-quick].json")
    u.set_defaults(func=_gpu, dir=tempfile.gettempdir())
    r = sub.add_parser("report", help="print the tables of a saved JSON run")
    r.add_argument("json")
    r.add_argument("--markdown", action="store_true")
    r.add_argument("--plain", action="store_true")
    r.add_argument("--plot", help="also draw the budget plot of a runtime/scenarios/all run to this PNG")
    r.set_defaults(func=_report)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
