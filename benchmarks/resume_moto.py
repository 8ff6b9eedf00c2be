"""Storage requests of a resume, counted against a moto S3 server with real torchrun processes:
``python -m benchmarks.resume_moto [--ranks 8 64] [--tree PATH] [--json PATH]``.

Issue 33 item 4; :mod:`benchmarks.resume_requests` counts the same thing in one process
(simulated ranks calling the backend as the runtime would). Here a moto server is started on
this machine (:func:`benchmarks.soak.start_moto`), and for each ``W`` a job of ``W`` processes
(``torchrun --standalone --nproc-per-node W benchmarks/resume_moto_rank.py``, gloo, CPU) trains
a tiny DDP loop with ``ravex.activate(storage="s3://.../run-W", checkpoint_every=4)``:

* run 1: ``--iters`` (12) iterations to the end: checkpoints at 4, 8, 12;
* run 2: the same script rerun with ``--iters`` + ``--more`` (16): it resumes step 12 and
  trains 4 more iterations, one more checkpoint (16). Its counts are the figures.

Every rank counts each billed ``FsspecStorage`` call (:func:`benchmarks.util.count_requests`: a
write a PUT, a read a GET, a listing a LIST, ``exists``/``size`` a HEAD, a delete a DELETE) and
writes them at three moments (``resume_moto_rank.py``): when ``activate()`` returns, when its
first ``optimizer.step()`` returns (Ravex has then chosen, agreed on, read and restored the step:
"resume"), and at exit ("whole rerun": the resume, the checkpoint of step 16 and Ravex's exit
work). moto's own access log is counted too (every HTTP request it answered during run 2), a check
on the whole rerun's job total that sees what s3fs sends besides Ravex's calls.

``--tree PATH`` imports Ravex from another checkout (``git worktree add /tmp/wt-before <commit>``)
for a "before" figure; the benchmark code stays this checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUCKET = "bench-resume"
REQUESTS = ("GET", "LIST", "HEAD")  # what a resume asks; PUT/DELETE are the run's writes
ACCESS = re.compile(r'"(GET|PUT|HEAD|POST|DELETE) (\S+) HTTP')
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # werkzeug colours the lines of answers other than 200


def _wire(log: str, start: int) -> dict[str, int]:
    """moto's access log from byte ``start``: requests as S3 bills them."""
    counts: Counter[str] = Counter()
    with open(log, "rb") as fh:
        fh.seek(start)
        text = ANSI.sub("", fh.read().decode(errors="replace"))
    for method, path in ACCESS.findall(text):
        if method == "GET" and ("list-type=" in path or "?prefix=" in path or "&prefix=" in path):
            op = "LIST"
        elif method == "POST" and path.endswith("?delete"):
            op = "DELETE"
        else:
            op = method
        counts[op] += 1
        if op == "GET":
            counts["GET manifest" if "/rank-" in path else "GET other"] += 1
    return dict(counts)


def _torchrun(world: int, iters: int, url: str, endpoint: str, out: str, tree: str, timeout: float) -> float:
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "BENCH_RAVEX_TREE": tree, "BENCH_OUT": out, "BENCH_ITERS": str(iters),
           "BENCH_URL": url, "BENCH_ENDPOINT": endpoint, "BENCH_EVERY": "4", "PYTHONPATH": tree,
           "OMP_NUM_THREADS": "1", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    for key in [k for k in env if k.startswith("RAVEX_")]:
        del env[key]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           os.path.join(HERE, "resume_moto_rank.py")]
    t0 = time.perf_counter()
    with open(os.path.join(out, "torchrun.log"), "wb") as log:
        done = subprocess.run(cmd, env=env, cwd=out, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        with open(os.path.join(out, "torchrun.log"), errors="replace") as fh:
            raise RuntimeError(f"torchrun W={world} failed ({done.returncode}): {fh.read()[-3000:]}")
    return time.perf_counter() - t0


def _ranks(out: str, world: int, tree: str) -> list[dict[str, Any]]:
    docs = []
    for rank in range(world):
        with open(os.path.join(out, f"rank-{rank}.json")) as fh:
            doc = json.load(fh)
        where = os.path.realpath(doc["ravex"])
        if not where.startswith(os.path.realpath(tree) + os.sep):
            raise RuntimeError(f"rank {rank} imported ravex from {where}, not from {tree}")
        docs.append(doc)
    return docs


def _summary(docs: list[dict[str, Any]], mark: str) -> dict[str, Any]:
    """Rank 0's counts, the mean of the other ranks', the job's total, at one moment."""
    rows = [d["marks"][mark] for d in docs]
    kinds = sorted({k for row in rows for k in row if k != "PUT bytes"})
    zero = {k: rows[0].get(k, 0) for k in kinds if rows[0].get(k, 0)}
    others = rows[1:]
    other = {k: round(statistics.mean(r.get(k, 0) for r in others), 2) for k in kinds} if others else {}
    other = {k: v for k, v in other.items() if v}
    total = {k: sum(r.get(k, 0) for r in rows) for k in kinds}
    total = {k: v for k, v in total.items() if v}
    reads = lambda row: sum(v for k, v in row.items() if k in REQUESTS)  # noqa: E731
    every = lambda row: sum(v for k, v in row.items() if " " not in k)  # noqa: E731
    return {"rank0": zero, "other_rank": other, "total": total,
            "rank0_requests": reads(zero), "other_rank_requests": reads(other), "total_requests": reads(total),
            "rank0_all": every(zero), "other_rank_all": every(other), "total_all": every(total),
            "other_rank_max": max((reads(r) for r in others), default=0)}


def measure(world: int, endpoint: str, log: str, scratch: str, tree: str, iters: int, more: int,
            timeout: float, say: Any = print) -> dict[str, Any]:
    url = f"s3://{BUCKET}/run-{world}-{os.path.basename(scratch)}"
    first = os.path.join(scratch, f"W{world}-run1")
    second = os.path.join(scratch, f"W{world}-run2")
    t1 = _torchrun(world, iters, url, endpoint, first, tree, timeout)
    say(f"W={world}: run 1 ({iters} iterations) {t1:.0f} s")
    start = os.path.getsize(log)
    t2 = _torchrun(world, iters + more, url, endpoint, second, tree, timeout)
    time.sleep(0.5)  # moto's last access lines
    wire = _wire(log, start)
    docs = _ranks(second, world, tree)
    firsts = sorted({d["marks"].get("first_step_iter") for d in docs}, key=str)
    say(f"W={world}: run 2 ({iters + more} iterations) {t2:.0f} s, first iteration {firsts}")
    if firsts != [iters]:
        raise RuntimeError(f"W={world}: run 2 did not resume at iteration {iters}: first iterations {firsts}")
    return {"ranks": world, "ravex": os.path.dirname(os.path.realpath(docs[0]["ravex"])),
            "run1_seconds": round(t1, 1), "run2_seconds": round(t2, 1),
            "activate": _summary(docs, "activate"), "resume": _summary(docs, "first_step"),
            "rerun": _summary(docs, "exit"), "wire_rerun": wire}


def table(results: list[dict[str, Any]]) -> str:
    """The markdown tables of RESULTS.md: requests are GET + LIST + HEAD (PUT, DELETE apart)."""
    lines = ["Resume (to the end of the first `optimizer.step()` of the rerun):", "",
             "| ravex | W | rank 0 | other rank (mean) | job | job less chunk-object GETs | "
             "other rank: GET manifest / GET object / LIST |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        res, o = r["resume"], r["resume"]["other_rank"]
        lines.append(
            f"| {r.get('label', '')} | {r['ranks']} | {res['rank0_requests']:,} | {res['other_rank_requests']:,.1f} | "
            f"{res['total_requests']:,} | {res['total_requests'] - res['total'].get('GET objects', 0):,} | "
            f"{o.get('GET manifest', 0):,.1f} / {o.get('GET objects', 0):,.1f} / {o.get('LIST', 0):,.1f} |")
    lines += ["", "Whole rerun (resume, 4 iterations, the checkpoint of step 16, exit):", "",
              "| ravex | W | rank 0 | other rank (mean) | job | job PUT / DELETE | other rank: GET manifest | "
              "counted, all requests | moto's access log |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        rer = r["rerun"]
        wire = sum(v for k, v in r["wire_rerun"].items() if " " not in k)
        lines.append(
            f"| {r.get('label', '')} | {r['ranks']} | {rer['rank0_requests']:,} | {rer['other_rank_requests']:,.1f} | "
            f"{rer['total_requests']:,} | {rer['total'].get('PUT', 0):,} / {rer['total'].get('DELETE', 0):,} | "
            f"{rer['other_rank'].get('GET manifest', 0):,.1f} | {rer['total_all']:,} | {wire:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    import boto3

    from .soak import start_moto

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--iters", type=int, default=12, help="run 1's iterations (a checkpoint every 4)")
    ap.add_argument("--more", type=int, default=4, help="run 2 trains this many more")
    ap.add_argument("--tree", default=REPO, help="the checkout Ravex is imported from (default: this one)")
    ap.add_argument("--label", default=None, help="names the tree in the table (default: its git commit)")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per torchrun")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the logs (kept anyway when a run fails)")
    ap.add_argument("--tables", nargs="+", metavar="JSON", help="only print the tables of these --json files")
    args = ap.parse_args(argv)
    if args.tables:
        results = []
        for path in args.tables:
            with open(path) as fh:
                results += json.load(fh)["results"]
        print(table(sorted(results, key=lambda r: r["ranks"])))
        return results
    tree = os.path.realpath(args.tree)
    label = args.label or subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True,
                                         text=True).stdout.strip()
    scratch = tempfile.mkdtemp(prefix="ravex-resume-moto-")
    moto, endpoint = start_moto(scratch)
    log = os.path.join(scratch, "moto_server.log")
    results = []
    kept = True
    try:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        for world in args.ranks:
            result = measure(world, endpoint, log, scratch, tree, args.iters, args.more, args.timeout)
            result["label"] = label
            results.append(result)
            print(json.dumps(result), flush=True)
        kept = args.keep
    finally:
        moto.terminate()
        moto.wait()
        if kept:
            print(f"logs, rank counts and moto's log kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(table(results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "resume_moto", "iters": args.iters, "more": args.more, "results": results},
                      fh, indent=2)
            fh.write("\n")
    return results


if __name__ == "__main__":
    main()
