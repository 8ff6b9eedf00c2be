"""Two tiers over S3 (``local:`` on this machine, ``storage: s3://...`` through the fault
proxy in front of moto): a run checkpoints every 5 steps locally and copies every 2nd
checkpoint to the bucket; it is SIGKILLed, its local tier is deleted (the machine is gone), and
the rerun on a "new machine" resumes the bucket's newest step, bitwise equal to a run without
Ravex. The proxy's log shows what the copies cost the bucket: objects once each, no listing or
HEAD per chunk."""

from __future__ import annotations

import shutil
import signal
import uuid
from collections import Counter

import torch
from faultproxy import FaultProxy
from rhelpers import BUCKET, KEY, SECRET, options_for

from ravex.format import open_store
from tests.runtime import harness


def test_local_tier_lost_resumes_from_the_bucket_bitwise(moto_server, tmp_path):
    proxy = FaultProxy(moto_server.port, seed=11).start()
    url = f"s3://{BUCKET}/tiers-{uuid.uuid4().hex[:12]}"
    aws = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
    try:
        ref_out = tmp_path / "reference.pt"
        ref = harness.run([harness.PYTHON, str(harness.TRAINEE)], tmp_path,
                          harness.child_env(T_ENTRY="none", T_OUT=str(ref_out)))
        assert ref.returncode == 0, ref.explain()
        work = tmp_path / "run"
        work.mkdir()
        (work / "ravex.yaml").write_text(
            f"storage:\n  url: {url}\n  endpoint: {proxy.url}\n  region: us-east-1\n  path_style: true\n"
            f"local: ./local\ncheckpoint_every: 5\npersist_every: 2\nkeep_last: 2\npersist_keep_last: null\n")
        first = harness.run([harness.PYTHON, str(harness.TRAINEE)], work,
                            harness.child_env(T_ENTRY="activate", T_BLOCK_AT="step:27", **aws), kill_on="BLOCKED")
        assert first.returncode == -signal.SIGKILL and not first.timed_out, first.explain()
        copies = proxy.log
        bucket = open_store(url, storage_options=options_for(moto_server.url))
        assert bucket.current().complete_steps() == [10, 20], first.explain()
        assert "ravex: step 20 persisted: tiers local + storage" in first.stderr, first.explain()
        # each object the two copied steps name was PUT once, nothing per chunk was HEADed or listed
        named = set()
        for step in (10, 20):
            reader = bucket.open_step(step)
            named |= {c.object for a in reader.arrays.values() for c in a.chunks.values()
                      if c.object is not None and c.inline is None}
        puts = Counter(r.path for r in copies if r.op == "PUT" and "/objects/" in r.path)
        assert all(n == 1 for n in puts.values()), puts.most_common(3)
        assert {p.rsplit("/", 1)[1] for p in puts} >= named
        print(f"\ntwo tiers over s3, two copies: requests {dict(Counter(r.op for r in copies))}")

        shutil.rmtree(work / "local")
        out = work / "final.pt"
        second = harness.run([harness.PYTHON, str(harness.TRAINEE)], work,
                             harness.child_env(T_ENTRY="activate", T_OUT=str(out), **aws))
        assert second.returncode == 0, second.explain()
        assert "ravex: step 20 came from the durable tier" in second.stderr, second.explain()
        assert second.resumed_from == 20 and second.losses == ref.losses[20:], second.explain()
        harness.assert_same_state(torch.load(out, weights_only=False), torch.load(ref_out, weights_only=False))
        assert bucket.current().complete_steps()[-1] == 36, second.explain()  # the exit's copy
    finally:
        proxy.stop()
