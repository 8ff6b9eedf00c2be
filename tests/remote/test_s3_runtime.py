"""The runtime and the tools over ``s3://``, against the moto server through the fault proxy.

A real training script (tests/runtime/trainee.py) checkpoints to ``s3://bucket/prefix``,
is SIGKILLed mid-run, is rerun unchanged, resumes and ends bitwise identical to a run
without Ravex. The first run takes its endpoint from ``ravex.yaml``; the rerun only from
the standard ``AWS_*`` variables. Then ``python -m ravex ls/diff/validate/gc --json`` and
the inspector (driven by Textual's Pilot) work on the same URL. The proxy counts what was
asked of the server: nothing is HEADed, listed or fetched per chunk.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import torch
from faultproxy import FaultProxy, Record
from rhelpers import BUCKET, KEY, SECRET, options_for

from ravex.format import open_store
from tests.runtime import harness

EVERY = 10
KILL_AT = 17  # the checkpoint of 10 is written; the rerun resumes from it


@dataclass
class Trained:
    url: str
    proxy: FaultProxy
    env: dict[str, str]  # the AWS_* variables alone reach the store
    reference: harness.Result
    reference_state: dict
    first: harness.Result
    second: harness.Result
    final_state: dict
    rerun_log: list[Record]  # the rerun's requests, in order
    rerun_checkpoints: int
    resumed_chunks: int
    resumed_objects: int  # objects (not inlined) that the resumed step's chunks live in


def _in_thread(fn, *args):
    """Run ``fn(*args)`` on a thread; ``join()`` returns its result (or raises its error)."""
    box: dict = {}

    def target() -> None:
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # handed to the joiner
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()

    def join():
        thread.join()
        if "error" in box:
            raise box["error"]
        return box["result"]

    return join


def _reference(cwd: Path) -> tuple[harness.Result, dict]:
    out = cwd / "final.pt"
    result = harness.run([harness.PYTHON, str(harness.TRAINEE)], cwd,
                         harness.child_env(T_ENTRY="none", T_OUT=str(out)))
    assert result.returncode == 0, result.explain()
    return result, torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def trained(moto_server, tmp_path_factory) -> Trained:
    """One store on S3 written by a killed run and its rerun (the reference runs alongside)."""
    proxy = FaultProxy(moto_server.port, seed=5).start()
    url = f"s3://{BUCKET}/runtime-{uuid.uuid4().hex[:12]}"
    work = tmp_path_factory.mktemp("s3-run")
    reference = _in_thread(_reference, tmp_path_factory.mktemp("s3-reference"))
    aws = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
    try:
        (work / "ravex.yaml").write_text(
            f"storage:\n  url: {url}\n  endpoint: {proxy.url}\n  region: us-east-1\n  path_style: true\n"
            f"checkpoint_every: {EVERY}\nkeep_last: null\n")
        first = harness.run([harness.PYTHON, str(harness.TRAINEE)], work,
                            harness.child_env(T_ENTRY="activate", T_BLOCK_AT=f"step:{KILL_AT}", **aws),
                            kill_on="BLOCKED")
        assert first.returncode == -signal.SIGKILL and not first.timed_out, first.explain()

        (work / "ravex.yaml").write_text(f"storage: {url}\ncheckpoint_every: {EVERY}\nkeep_last: null\n")
        env = dict(aws, AWS_ENDPOINT_URL=proxy.url, AWS_DEFAULT_REGION="us-east-1")
        out = work / "final.pt"
        proxy.reset_counts()
        second = harness.run([harness.PYTHON, str(harness.TRAINEE)], work,
                             harness.child_env(T_ENTRY="activate", T_OUT=str(out), **env))
        assert second.returncode == 0, second.explain()
        log = proxy.log
        ref, ref_state = reference()
        store = open_store(url, storage_options=options_for(moto_server.url))
        resumed = store.open_step(second.resumed_from or 0)
        chunks = [c for a in resumed.arrays.values() for c in a.chunks.values()]
        objects = {c.object for c in chunks if c.object is not None and c.inline is None}
        yield Trained(url, proxy, env, ref, ref_state, first, second, torch.load(out, weights_only=False),
                      log, second.stderr.count("ravex: checkpoint step "), len(chunks), len(objects))
    finally:
        proxy.stop()


def test_sigkill_and_rerun_over_s3_resume_bitwise(trained):
    ref, first, second = trained.reference, trained.first, trained.second
    assert first.losses == ref.losses[: len(first.losses)] and len(first.losses) == KILL_AT
    assert second.resumed_from == (KILL_AT - 1) // EVERY * EVERY, second.explain()
    assert second.losses == ref.losses[second.resumed_from:], "losses after the resume differ from the reference"
    harness.assert_same_state(trained.final_state, trained.reference_state)
    assert "FAILED" not in first.stderr + second.stderr, second.explain()


def test_no_request_per_chunk(trained):
    """The rerun: one resume, then checkpoints of 20, 30 and 36 (at exit). Nothing is listed or
    HEADed per chunk; the resume checks each object it restores from once (one HEAD each, in
    parallel: ravex.runtime.state.restore's check before reading into the live model), and the run
    record is looked for once before it is written (spec §20: once per run)."""
    log, n = trained.rerun_log, trained.rerun_checkpoints
    print(f"\nrerun over s3: {n} checkpoints; requests {dict(Counter(r.op for r in log))}; "
          f"the resumed step has {trained.resumed_chunks} chunks in {trained.resumed_objects} objects")
    assert n == 3, trained.second.explain()
    assert trained.resumed_chunks >= 3 * max(1, trained.resumed_objects)  # so that "per chunk" would show
    # the timeline's lease (spec §21): taken (LIST, GET of the killed run's, PUT, LIST and DELETE of
    # the older generations), confirmed before each manifest (LIST, GET), renewed on a timer (LIST,
    # GET, PUT), released (LIST, GET, PUT): a few requests per checkpoint, none per chunk
    leased = [r for r in log if "/leases/" in r.path or ("prefix=" in r.path and _prefix(r).startswith("leases/"))]
    renewals = sum(r.op == "PUT" for r in leased) - 2
    assert renewals >= 0 and sum(r.op == "LIST" for r in leased) <= 2 + n + renewals + 1, leased
    assert sum(r.op == "GET" for r in leased) <= 1 + n + renewals + 1, leased
    log = [r for r in log if r not in leased]
    first_put = next(i for i, r in enumerate(log) if r.op == "PUT")
    resume, writes = log[:first_put], log[first_put:]
    heads = [r.path for r in resume if r.op == "HEAD" and "/objects/" in r.path]
    assert len(heads) == len(set(heads)) <= trained.resumed_objects, heads
    others = [r.path for r in resume if r.op == "HEAD" and "/objects/" not in r.path]
    assert len(others) <= 1 and all("/runs/" in p for p in others), others  # the run record, written once
    assert [r.path for r in writes if r.op == "HEAD"] == []
    for r in log:
        if r.op == "LIST":
            prefix = _prefix(r)
            # never objects/ab/...: the folders a store has, each listed whole
            assert prefix in ("objects/", "timelines/", "tags/", "repack/") or prefix.startswith(("steps/", "runs/")), (
                r.path)
    gets = [r.path for r in writes if r.op == "GET"]
    assert all("/objects/" not in p for p in gets), gets  # a checkpoint reads no chunk back
    lists = sum(r.op == "LIST" for r in log)
    assert lists <= 8 * (n + 1) + 1, Counter(r.path for r in log if r.op == "LIST")  # +1: the run record's check


def _prefix(request: Record) -> str:
    """The store-relative prefix a LIST request asks for."""
    return parse_qs(urlsplit(request.path).query)["prefix"][0].split("/", 1)[1]


def _cli(*args: str, env: dict[str, str]) -> tuple[int, object]:
    full = harness.child_env(**env)
    full["COLUMNS"] = "200"
    proc = subprocess.run([sys.executable, "-m", "ravex", *args], env=full, capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.strip(), f"{args}: rc {proc.returncode}, stderr {proc.stderr[-2000:]}"
    return proc.returncode, json.loads(proc.stdout)


async def _settle(pilot) -> None:
    """Until no worker runs (as tests/tools/conftest.py's ``settle``)."""
    app = pilot.app
    for _ in range(20):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not any(w.is_running for w in app.workers):
            return
    raise AssertionError("workers never settled")


def test_inspector_over_s3(trained, moto_server):
    from ravex.tui.app import InspectorApp

    steps = open_store(trained.url, storage_options=options_for(moto_server.url)).complete_steps()

    async def drive() -> None:
        app = InspectorApp(trained.url, storage_options=options_for(trained.proxy.url))
        async with app.run_test(size=(120, 40)) as pilot:
            await _settle(pilot)
            assert [s.step for s in app.summaries] == steps
            assert app.step == steps[-1] == 36
            assert "step_36" in str(app.query_one("#details-body").render())
            await pilot.press("d")  # diff with the previous step
            await _settle(pilot)
            assert app.mode == "diff" and app.diff_pair == (steps[-2], 36)
            assert any(t.name.startswith("models/") for t in app.diff_rows), [t.name for t in app.diff_rows]
            await pilot.press("v")  # validate, rehashing every object over S3
            await _settle(pilot)
            assert app.validated and not [f for f in app.findings if f.severity == "error"], app.findings

    asyncio.run(drive())


def test_cli_verbs_over_s3(trained):
    env, url = trained.env, trained.url
    rc, ls = _cli("ls", "--json", url, env=env)
    steps = [row["step"] for row in ls["steps"]]
    assert rc == 0 and steps == [10, 20, 30, 36], ls  # 36: the exit checkpoint
    assert all(row["complete"] for row in ls["steps"]), ls
    rc, d = _cli("diff", "--json", f"{url}@step_20", "step_30", env=env)
    changed = [t["name"] for t in d["tensors"] if t["status"] == "changed"]
    assert rc == 0 and any(name.startswith("models/") for name in changed), d
    rc, gc = _cli("gc", "--json", "--keep-last", "1", "--grace", "0", url, env=env)
    assert rc == 0 and gc["deleted_steps"] == [10, 20, 30] and gc["deleted_objects"] > 0, gc
    rc, report = _cli("validate", "--json", "--full", url, env=env)
    assert rc == 0 and report["ok"] and report["steps_checked"] == [36], report
    assert "orphan_object" not in {f["kind"] for f in report["findings"]}, report


def test_a_url_named_to_the_cli_takes_the_endpoint_of_ravex_yaml(trained, tmp_path):
    """``ravex ls s3://...`` in a folder whose ``ravex.yaml`` gives an S3 endpoint (no
    ``AWS_ENDPOINT_URL``): the listing comes from that endpoint. Without the file the same
    command cannot reach the server: one line, a non-zero exit."""
    env = harness.child_env(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, COLUMNS="200")
    env.pop("AWS_ENDPOINT_URL", None)
    env.pop("RAVEX_STORAGE", None)
    other = f"s3://{BUCKET}/some-other-run"
    (tmp_path / "ravex.yaml").write_text(
        f"storage:\n  url: {other}\n  endpoint: {trained.proxy.url}\n  region: us-east-1\n  path_style: true\n")
    cmd = [sys.executable, "-m", "ravex", "ls", "--json", trained.url]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [row["step"] for row in json.loads(proc.stdout)["steps"]][-1] == 36
    (tmp_path / "ravex.yaml").unlink()
    bare = dict(env, AWS_MAX_ATTEMPTS="1", AWS_METADATA_SERVICE_NUM_ATTEMPTS="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=bare, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
