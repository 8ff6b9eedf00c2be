"""What ``copy_step`` costs in requests to an S3 destination (moto through the counting proxy):
one PUT per object the destination lacks, per manifest and for ``refs.json``; ``objects/``
listed once, no HEAD per object; a step the destination holds costs no PUT and no listing of
``objects/``."""

from __future__ import annotations

import uuid

from rhelpers import BUCKET, FAST_RETRY, assert_same, listed_folders, options_for, state

from ravex.format import copy_step, open_store
from ravex.format.reports.validate import validate


def test_copy_to_s3_puts_only_what_is_missing(proxy, tmp_path):
    src = open_store(tmp_path / "src", create=True)
    with src.writer() as w:
        for step in (1, 2):
            w.commit(step, state(step, small=8, big_rows=64))
    url = f"s3://{BUCKET}/copy-{uuid.uuid4().hex[:12]}"
    dst = open_store(url, create=True, storage_options=options_for(proxy.url), retry=FAST_RETRY)
    copy_step(src, dst, 1)

    proxy.reset_counts()
    report = copy_step(src, dst, 2)
    ops = proxy.ops
    assert report.objects_copied > 0 and report.objects_present > 0, report
    assert ops["PUT"] == report.objects_copied + 2, ops  # the objects, the manifest, refs.json
    assert ops["HEAD"] == 0 and listed_folders(proxy)["objects"] == 1, (ops, listed_folders(proxy))

    proxy.reset_counts()
    again = copy_step(src, dst, 2)
    assert again.objects_copied == 0 and again.manifests_copied == 0
    assert proxy.ops["PUT"] == 0 and "objects" not in listed_folders(proxy), (proxy.ops, listed_folders(proxy))

    fresh = open_store(url, storage_options=options_for(proxy.url), retry=FAST_RETRY)
    assert_same(fresh.read(2), src.read(2))
    assert validate(fresh).ok
