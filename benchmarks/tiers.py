"""(l) Two tiers: a busy loop checkpointing to S3 alone against ``local:`` + S3 with
``persist_every`` 1 and 10, in one run (``python -m benchmarks tiers``).

A moto S3 server is started on this machine. Each contender is a process of its own that trains
``iters`` iterations of ``layers`` x ``Linear(width)`` + AdamW with Ravex's own cadence (a
checkpoint every ``every`` iterations, in the background as always), the same loop without Ravex
runs beside it; all alternate, ``reps`` times. Figures per contender (medians over the reps):

* lost per checkpoint: its training wall time less the unchecked loop's, over its checkpoints;
* the tail: what ``ravex.flush()`` waits for after the last iteration (the copy still running);
* what the bucket was asked, counted where Ravex calls storage (each ``FsspecStorage`` call as the
  object store bills it: a write a PUT, a read a GET, a listing a LIST, ``exists``/``size`` a
  HEAD) and the bytes PUT, per checkpoint and per hour of this loop's training.

moto runs on the same cores as the loop, so every byte sent to the bucket also costs the loop
CPU here; against a remote S3 that part of "S3 alone" is smaller, the requests and bytes are not.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

from .util import count_requests

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUCKET = "bench-tiers"
#: contender -> the activate() keywords beyond the storage (None: the loop without Ravex)
CONTENDERS: dict[str, dict[str, Any] | None] = {
    "no checkpoint": None,
    "S3 alone": {},
    "local + S3, persist_every 1": {"persist_every": 1},
    "local + S3, persist_every 10": {"persist_every": 10},
}
def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One contender's loop: seconds training, seconds flushing, what it asked of the bucket."""
    import torch

    counts: Counter[str] = Counter()
    count_requests(counts)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(spec["width"], spec["width"]) for _ in range(spec["layers"])])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(spec["batch"], spec["width"])
    ravex: Any = None
    if spec["settings"] is not None:
        import ravex

        storage = {"url": spec["url"], "endpoint": spec["endpoint"], "region": "us-east-1", "path_style": True,
                   "access_key": "bench", "secret_key": "bench"}
        tiers = {"local": spec["local"], "persist_keep_last": 2, **spec["settings"]} if spec["settings"] else {}
        ravex.activate(storage=storage, checkpoint_every=spec["every"], keep_last=2, resume="never",
                       checkpoint_on_exit=False, checkpoint_on_signal=[], log_level="WARNING", **tiers)

    def iteration() -> None:
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    for _ in range(spec["warmup"]):
        iteration()
    started = time.perf_counter()
    for _ in range(spec["iters"]):
        iteration()
    train = time.perf_counter() - started
    flushed = time.perf_counter()
    status: dict[str, Any] = {}
    if ravex is not None:
        ravex.flush()
        status = ravex.status()
    return {"train": train, "tail": time.perf_counter() - flushed, "requests": dict(counts),
            "checkpoints": status.get("checkpoints_written", 0),
            "persisted_step": (status.get("durable_tier") or {}).get("persisted_step")}


def _run_child(spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": REPO, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.tiers", json.dumps(spec)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"tiers child failed ({done.returncode}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run(width: int = 2048, layers: int = 4, batch: int = 256, every: int = 10, iters: int = 100,
        reps: int = 3, scratch: str | None = None, log: Any = print) -> dict[str, Any]:
    """Every contender ``reps`` times, alternating, against one moto server started here."""
    import boto3

    from .soak import start_moto

    folder = tempfile.mkdtemp(prefix="ravex-tiers-", dir=scratch)
    moto, endpoint = start_moto(folder)
    try:
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
        for rep in range(reps):
            for n, (name, settings) in enumerate(CONTENDERS.items()):
                local = os.path.join(folder, f"local-{rep}-{n}")
                spec = {"width": width, "layers": layers, "batch": batch, "every": every, "iters": iters,
                        "warmup": 2, "settings": settings, "endpoint": endpoint, "local": local,
                        "url": f"s3://{BUCKET}/rep{rep}-{n}"}
                result = _run_child(spec)
                runs[name].append(result)
                log(f"  rep {rep + 1}/{reps} {name}: train {result['train']:.2f} s, tail {result['tail']:.2f} s, "
                    f"{result['checkpoints']} checkpoints, requests {result['requests']}")
                shutil.rmtree(local, ignore_errors=True)
    finally:
        moto.terminate()
        moto.wait()
        shutil.rmtree(folder, ignore_errors=True)
    return {"config": {"width": width, "layers": layers, "batch": batch, "every": every, "iters": iters,
                       "reps": reps, "state_bytes": layers * (width * width + width) * 4 * 3},
            "runs": runs, "summary": summarize(runs)}


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Medians per contender; lost per checkpoint pairs each rep with the unchecked loop's."""
    plain = runs["no checkpoint"]
    out: dict[str, dict[str, float]] = {}
    for name, results in runs.items():
        if name == "no checkpoint":
            continue
        lost = [(r["train"] - p["train"]) / max(1, r["checkpoints"]) for r, p in zip(results, plain, strict=True)]
        per_hour = [3600.0 / r["train"] for r in results]
        out[name] = {
            "lost_per_checkpoint_s": statistics.median(lost),
            "tail_s": statistics.median(r["tail"] for r in results),
            "checkpoints": statistics.median(r["checkpoints"] for r in results),
            "puts_per_checkpoint": statistics.median(r["requests"].get("PUT", 0) / max(1, r["checkpoints"])
                                                     for r in results),
            "requests_per_checkpoint": statistics.median(
                sum(v for k, v in r["requests"].items() if k != "PUT bytes") / max(1, r["checkpoints"])
                for r in results),
            "puts_per_hour": statistics.median(r["requests"].get("PUT", 0) * h for r, h in zip(results, per_hour,
                                                                                              strict=True)),
            "gib_put_per_hour": statistics.median(r["requests"].get("PUT bytes", 0) * h / 2**30
                                                  for r, h in zip(results, per_hour, strict=True)),
        }
    return out


def table(res: dict[str, Any]) -> str:
    cfg = res["config"]
    lines = [f"(l) two tiers: {cfg['layers']} x Linear({cfg['width']}) + AdamW "
             f"({cfg['state_bytes'] / 2**20:.0f} MiB of state), a checkpoint every {cfg['every']} iterations, "
             f"{cfg['iters']} iterations, S3 = moto on this machine, medians of {cfg['reps']}",
             "| contender | lost per checkpoint | flush tail | S3 requests per checkpoint | PUTs per checkpoint "
             "| PUTs per hour | GiB PUT per hour |",
             "|---|---|---|---|---|---|---|"]
    for name, s in res["summary"].items():
        lines.append(f"| {name} | {s['lost_per_checkpoint_s']:.2f} s | {s['tail_s']:.2f} s | "
                     f"{s['requests_per_checkpoint']:.1f} | {s['puts_per_checkpoint']:.1f} | "
                     f"{s['puts_per_hour']:.0f} | {s['gib_put_per_hour']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.argv[1]))))
