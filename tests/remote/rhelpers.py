"""Helpers of the storage-reliability tests: deterministic states and exact checks."""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from ravex.format.objects.hashing import digest
from ravex.format.storage import RetryPolicy
from ravex.format.storage.remote import s3_storage_options

BUCKET = "ravex-test"
KEY, SECRET = "testing-key", "testing-secret"
#: Retries fast enough for tests, as many tries as the default.
FAST_RETRY = RetryPolicy(tries=6, base_delay=0.02, max_delay=0.3, budget_seconds=5.0)


def options_for(endpoint: str, **extra: Any) -> dict:
    """s3fs options for the test server, through the module under test."""
    opts = s3_storage_options(
        endpoint=endpoint, region="us-east-1", access_key=KEY, secret_key=SECRET, env={}, **extra
    )
    # Each store gets its own s3fs instance: a test's proxy must not leak into another's.
    opts["skip_instance_cache"] = True
    return opts


def state(step: int, small: int = 40, big_rows: int = 512) -> dict[str, Any]:
    """A state tree that is a pure function of ``step``: a big tensor whose rows change
    a little each step, many small tensors of which a few change, a frozen tensor."""
    rng = np.random.default_rng(12345)
    big = rng.standard_normal((big_rows, 1024)).astype("float32")  # 2 MiB, one chunk
    big[step % big_rows] += step
    frozen = rng.standard_normal((256, 1024)).astype("float32")  # 1 MiB, never changes
    smalls = {f"norm.{i}": rng.standard_normal(1500).astype("float32") for i in range(small)}  # 6 KB each
    for i in range(0, small, 7):
        smalls[f"norm.{i}"] = smalls[f"norm.{i}"] + np.float32(step)
    return {
        "model": {"big": big, "frozen": frozen, "small": smalls},
        "step": step,
        "lr": 0.001 * (1 + step),
        "note": f"step {step}",
    }


def assert_same(got: Any, want: Any, where: str = "root") -> None:
    """Arrays bit-exact (dtype, shape, bytes); other values equal; dict keys in order."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: got {type(got).__name__}"
        assert got.dtype == want.dtype and got.shape == want.shape, f"{where}: {got.dtype}{got.shape}"
        assert got.tobytes() == want.tobytes(), f"{where}: bytes differ"
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys differ"
        for k in want:
            assert_same(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length differs"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}/{i}")
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} != {want!r}"


def objects_all_whole(storage) -> list[str]:
    """Keys of objects whose bytes do not hash to their name (half-written ones)."""
    bad = []
    for info in storage.walk("objects"):
        name = info.key.rsplit("/", 1)[-1]
        if name.startswith(".tmp-") or digest(storage.read(info.key)) != name:
            bad.append(info.key)
    return bad


def listed_folders(proxy: Any) -> Counter[str]:
    """How many times each top folder of a store was listed, from a counting proxy's log (the
    store's prefix is the first path part of the listing's ``prefix``)."""
    prefixes = [parse_qs(urlsplit(r.path).query)["prefix"][0] for r in proxy.log if r.op == "LIST"]
    return Counter(p.rstrip("/").split("/", 1)[1].split("/")[0] for p in prefixes)
