"""Ravex stores over s3:// against a real moto server, with and without injected faults."""

from __future__ import annotations

import socket
import time
from collections import Counter

import numpy as np
import pytest
from rhelpers import FAST_RETRY, assert_same, objects_all_whole, options_for, state

from ravex.format import open_store
from ravex.format.errors import RavexError, StorageError, StoreNotFoundError
from ravex.format.reports.diff import diff
from ravex.format.reports.validate import validate
from ravex.format.storage import FsspecStorage, RetryPolicy


def _store(url, endpoint, create=True, retry=FAST_RETRY, **opts):
    return open_store(url, create=create, storage_options=options_for(endpoint, **opts), retry=retry)


# ---- round trips ---------------------------------------------------------------------------


def test_write_read_validate_diff_gc_roundtrip(moto_server, s3_url):
    store = _store(s3_url, moto_server.url)
    assert isinstance(store.storage, FsspecStorage)
    with store.writer() as w:
        for step in (1, 2, 3):
            w.commit(step, state(step))
    assert store.complete_steps() == [1, 2, 3]

    again = _store(s3_url, moto_server.url, create=False)  # a fresh process would do this
    for step in (1, 2, 3):
        assert_same(again.read(step), state(step))
    report = validate(again, full=True)
    assert report.ok, report.to_json()
    assert report.objects_checked > 0

    d = diff(again.open_step(1), again.open_step(2))
    changed = {t.name for t in d.changed()}
    assert "model/big" in changed and "model/frozen" not in changed
    assert {v.name for v in d.values if v.status == "changed"} >= {"step", "lr", "note"}

    report = again.gc(keep_last=1, grace_seconds=0)
    assert report.deleted_steps == [1, 2] and report.deleted_objects > 0
    assert again.complete_steps() == [3]
    assert_same(again.read("latest"), state(3))
    after = validate(again, full=True)
    assert after.ok and "orphan_object" not in after.kinds(), after.to_json()


def test_open_missing_store_and_bucket(moto_server, s3_url):
    with pytest.raises(StoreNotFoundError):
        _store(s3_url, moto_server.url, create=False)
    with pytest.raises(StorageError, match="ravex-no-such-bucket"):
        _store("s3://ravex-no-such-bucket/x", moto_server.url, create=True)


# ---- request counts ------------------------------------------------------------------------


def _requests(proxy, fn):
    """Run ``fn``; return its requests as a Counter of kinds: PUT_object, PUT_manifest, PUT_other,
    GET, LIST, HEAD, ..."""
    proxy.reset_counts()
    result = fn()
    kinds = Counter()
    for r in proxy.log:
        if r.op == "PUT":
            kinds["PUT_object" if "/objects/" in r.path else "PUT_manifest" if "/rank-" in r.path else "PUT_other"] += 1
        else:
            kinds[r.op] += 1
    return kinds, result


def _write_and_resume(proxy, url, small):
    store = _store(url, proxy.url)
    with store.writer() as w:
        first, stats1 = _requests(proxy, lambda: w.commit(1, state(1, small=small)))
        second, stats2 = _requests(proxy, lambda: w.commit(2, state(2, small=small)))
    resumed = _store(url, proxy.url, create=False)
    resume, tree = _requests(proxy, lambda: resumed.read("latest"))
    assert_same(tree, state(2, small=small))
    return first, second, resume, stats1, stats2


def test_requests_no_per_chunk_head_or_list_and_small_tensors_pack(moto_server, proxy, s3_url):
    first, second, resume, stats1, stats2 = _write_and_resume(proxy, s3_url, small=300)
    print("\nrequests (300 small tensors): commit 1", dict(first), "commit 2", dict(second), "resume", dict(resume))
    assert stats1.chunks == 302
    # big (2 MiB) + frozen (1 MiB) + ONE pack of 300 x 6 KB; then one manifest
    assert first["PUT_object"] == 3 and first["PUT_manifest"] == 1, first
    # the delta: the changed big tensor and one pack of the 43 changed small ones
    assert stats2.reused_chunks >= 257
    assert second["PUT_object"] == 2 and second["PUT_manifest"] == 1, second
    for counts in (first, second, resume):
        assert counts["HEAD"] == 0, counts
    assert resume["GET"] <= 10, resume  # not one per small tensor

    # nothing per chunk: ten times fewer tensors, the very same requests
    few = _write_and_resume(proxy, s3_url + "-few", small=30)
    print("requests (30 small tensors): commit 1", dict(few[0]), "commit 2", dict(few[1]), "resume", dict(few[2]))
    assert (few[0], few[1], few[2]) == (first, second, resume)


def test_uploads_are_concurrent(moto_server, proxy, s3_url):
    store = _store(s3_url, proxy.url)
    proxy.configure(delay=1.0, delay_seconds=(0.2, 0.2), methods=frozenset({"PUT"}))  # every PUT takes 0.2 s
    proxy.reset_counts()
    with store.writer(chunk_bytes=256 << 10) as w:  # 2 MiB + 1 MiB tensors: 12 objects
        t0 = time.monotonic()
        w.commit(1, state(1, small=2))
        elapsed = time.monotonic() - t0
    proxy.configure()
    puts = proxy.counts["PUT"]
    assert puts >= 12
    assert proxy.max_in_flight["PUT"] >= 3, proxy.max_in_flight  # the evidence: PUTs overlap
    # and the commit beats one-at-a-time; the manifest and ravex.json PUTs are serial by design, and
    # moto's own CPU time counts on a loaded 2-core machine (0.6 of serial failed at 1.85 s of 3.0 s)
    assert elapsed < puts * 0.2 * 0.8, (elapsed, puts)


# ---- injected faults -----------------------------------------------------------------------


def test_transient_faults_lose_nothing(moto_server, proxy, s3_url):
    store = _store(s3_url, proxy.url)
    proxy.configure(seed=7, reset=0.06, error=0.08, delay=0.04)  # ~18% of requests faulted
    with store.writer() as w:
        for step in range(1, 7):
            w.commit(step, state(step))
    injected = proxy.faults_injected
    assert sum(injected.values()) >= 5, injected
    assert store.storage.retries >= 5

    # read everything back through the same faulty proxy, from a fresh store object
    again = _store(s3_url, proxy.url, create=False)
    assert again.complete_steps() == list(range(1, 7))
    for step in range(1, 7):
        assert_same(again.read(step), state(step))
    report = validate(again, full=True)
    assert report.ok, report.to_json()

    gc = again.gc(keep_last=2, grace_seconds=0)  # GC under the same faults
    proxy.configure()
    assert again.complete_steps() == [5, 6], gc
    for step in (5, 6):
        assert_same(again.read(step), state(step))
    report = validate(again, full=True)
    assert report.ok and "orphan_object" not in report.kinds(), report.to_json()
    assert objects_all_whole(again.storage) == []
    print("\nfaults injected:", dict(injected), "retries:", store.storage.retries + again.storage.retries)


@pytest.mark.parametrize("outage", ["reset", 503])
def test_persistent_outage_fails_commit_in_bounded_time_and_keeps_earlier_steps(moto_server, proxy, s3_url, outage):
    store = _store(s3_url, proxy.url)
    with store.writer() as w:
        w.commit(1, state(1))
        w.commit(2, state(2))
        proxy.configure(outage=outage, methods=frozenset({"PUT"}))  # listings work, uploads do not
        proxy.reset_counts()
        t0 = time.monotonic()
        with pytest.raises(StorageError) as info:
            w.commit(3, state(3))
        elapsed = time.monotonic() - t0
        puts = proxy.counts["PUT"]
        err = info.value
        assert isinstance(err, RavexError) and isinstance(err, OSError)
        msg = str(err)
        assert s3_url in msg and "write" in msg and "after 6 tries" in msg, msg
        assert ("SlowDown" in msg) if outage == 503 else ("onnect" in msg), msg
        assert elapsed < FAST_RETRY.budget_seconds + 5, elapsed
        # one retry layer: at most `tries` attempts per upload, for the few uploads in flight
        assert puts <= FAST_RETRY.tries * 4 + 1, puts

        proxy.configure()  # the outage ends: the same writer goes on
        w.commit(4, state(4))
    assert store.complete_steps() == [1, 2, 4]
    for step in (1, 2, 4):
        assert_same(store.read(step), state(step))
    report = validate(store, full=True)
    assert report.ok, report.to_json()


def test_outage_of_everything_fails_fast_then_recovers(moto_server, proxy, s3_url):
    store = _store(s3_url, proxy.url)
    with store.writer() as w:
        w.commit(1, state(1))
    proxy.configure(outage="reset")
    t0 = time.monotonic()
    with store.writer() as w, pytest.raises(OSError) as info:
        w.commit(2, state(2))
    assert time.monotonic() - t0 < FAST_RETRY.budget_seconds + 5
    assert isinstance(info.value, StorageError)
    proxy.configure()
    assert store.complete_steps() == [1]
    assert_same(store.read("latest"), state(1))


def test_server_down_connection_refused(moto_server, s3_url):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(StorageError, match=r"after \d+ tries") as info:
        _store(s3_url, f"http://127.0.0.1:{port}")
    assert time.monotonic() - t0 < FAST_RETRY.budget_seconds + 5
    assert "onnect" in str(info.value)


def test_permanent_errors_are_not_retried(moto_server, proxy, s3_url):
    store = _store(s3_url, proxy.url)
    with store.writer() as w:
        w.commit(1, state(1))

    proxy.reset_counts()  # absent: a plain FileNotFoundError after one GET
    with pytest.raises(FileNotFoundError):
        store.storage.read("objects/00/" + "0" * 32)
    assert proxy.counts["GET"] == 1

    proxy.configure(outage=403, methods=frozenset({"PUT"}))
    proxy.reset_counts()
    with pytest.raises(StorageError, match=r"AccessDenied|Access Denied") as info:
        store.storage.write("objects/ff/" + "f" * 32, b"x" * 1000)
    assert proxy.counts["PUT"] == 1
    assert "tries" not in str(info.value)
    proxy.configure()


def test_slow_responses_time_out_and_are_retried(moto_server, proxy, s3_url):
    store = _store(s3_url, proxy.url, read_timeout=0.5, connect_timeout=0.5)
    proxy.configure(seed=3, delay=0.3, delay_seconds=(1.0, 1.2), methods=frozenset({"PUT"}))
    with store.writer() as w:
        w.commit(1, state(1, small=4))
    proxy.configure()
    print("\nslow responses:", dict(proxy.faults_injected), "retries:", store.storage.retries)
    assert proxy.faults_injected["delay"] >= 1 and store.storage.retries >= 1
    assert_same(store.read(1), state(1, small=4))


# ---- the retry helper on its own -------------------------------------------------------------


class _Flaky:
    def __init__(self, failures):
        self.failures = list(failures)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


def _bare_storage(policy):
    s = FsspecStorage("memory://retry-unit", retry=policy)
    return s


def test_retry_helper_bounds_and_classification():
    quick = RetryPolicy(tries=4, base_delay=0.001, max_delay=0.002, budget_seconds=1.0)
    s = _bare_storage(quick)
    f = _Flaky([ConnectionResetError(104, "reset"), TimeoutError("slow")])
    assert s._retry("read", "k", f) == "ok" and f.calls == 3

    f = _Flaky([ConnectionResetError(104, "reset")] * 10)
    with pytest.raises(StorageError, match="after 4 tries") as info:
        s._retry("write", "k", f)
    assert f.calls == 4 and info.value.errno == 104

    for permanent in (PermissionError(13, "denied"), OSError(28, "No space left on device"), ValueError("bad")):
        f = _Flaky([permanent])
        with pytest.raises(StorageError):
            s._retry("write", "k", f)
        assert f.calls == 1

    f = _Flaky([FileNotFoundError("gone")])
    with pytest.raises(FileNotFoundError):
        s._retry("read", "k", f, absent_ok=True)
    assert f.calls == 1

    budget = RetryPolicy(tries=50, base_delay=0.05, max_delay=0.05, budget_seconds=0.2)
    s = _bare_storage(budget)
    f = _Flaky([ConnectionResetError(104, "reset")] * 100)
    t0 = time.monotonic()
    with pytest.raises(StorageError):
        s._retry("read", "k", f)
    assert time.monotonic() - t0 < 0.5 and f.calls < 10


def test_transient_http_errors_classified_from_botocore():
    from botocore.exceptions import ClientError

    from ravex.format.storage import is_transient

    def client_error(status, code):
        return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                           "PutObject")

    assert is_transient(client_error(500, "InternalError"))
    assert is_transient(client_error(503, "SlowDown"))
    assert is_transient(client_error(502, "BadGateway"))
    assert not is_transient(client_error(403, "AccessDenied"))
    assert not is_transient(client_error(404, "NoSuchBucket"))
    wrapped = OSError(5, "We encountered an internal error")  # what s3fs raises, cause attached
    wrapped.__cause__ = client_error(500, "InternalError")
    assert is_transient(wrapped)
    assert not is_transient(FileNotFoundError("NoSuchKey"))


def test_a_missing_bucket_and_refused_credentials_say_the_fix():
    from botocore.exceptions import ClientError

    from ravex.format.storage.faults import storage_error

    def failed(status, code):
        cause = ClientError({"Error": {"Code": code, "Message": "no"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                            "PutObject")
        return str(storage_error("s3://runs/mlp", "write", "ravex.json", cause))

    assert failed(404, "NoSuchBucket").endswith(
        "HTTP 404 NoSuchBucket: An error occurred (NoSuchBucket) when calling the PutObject operation: no; "
        "fix: create the bucket (s3://runs), or name one that exists")
    assert "; fix: use credentials allowed to write in s3://runs" in failed(403, "AccessDenied")
    assert "fix:" not in failed(503, "SlowDown")


def test_retry_policy_delays_grow_with_jitter():
    p = RetryPolicy(base_delay=0.2, max_delay=3.0)
    rng = np.random.default_rng(0)
    del rng
    import random

    r = random.Random(0)
    delays = [p.delay(n, r) for n in range(1, 7)]
    for n, d in enumerate(delays, start=1):
        cap = min(3.0, 0.2 * 2 ** (n - 1))
        assert cap / 2 <= d <= cap
    assert sum(p.delay(n, random.Random(1)) for n in range(1, 6)) <= 10.0  # the default's worst case fits
