"""``python -m benchmarks``: run a suite, print its table, write its JSON.

    python -m benchmarks format                 # full run: ~1 GiB state, 3 repetitions
    python -m benchmarks format --quick         # smoke test: tiny state, well under a minute
    python -m benchmarks report out.json --markdown   # re-print a saved run
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


def _format(args: argparse.Namespace) -> int:
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
        return 2
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
        res: dict[str, Any] = {
            "suite": "format",
            "command": "python -m benchmarks " + " ".join(args.argv),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "git": git_rev(REPO),
            "machine": machine_notes(args.dir),
            "quick": bool(args.quick),
        }
        res.update(format_bench.run(cfg))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = args.out or os.path.join(HERE, "out", "format-quick.json" if args.quick else "format.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    report.show(res, plain=args.plain)
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


def _report(args: argparse.Namespace) -> int:
    with open(args.json) as f:
        res = json.load(f)
    if args.markdown:
        print(report.render_markdown(report.tables(res)))
    else:
        report.show(res, plain=args.plain)
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
    r = sub.add_parser("report", help="print the tables of a saved JSON run")
    r.add_argument("json")
    r.add_argument("--markdown", action="store_true")
    r.add_argument("--plain", action="store_true")
    r.set_defaults(func=_report)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
