"""Regenerate spec/example/: a tiny Ravex store that is the format's conformance fixture.

    python spec/make_example.py            # rewrites spec/example/

What it holds (a few KB), chosen so that one store shows every part of the format:

- step 1, one rank, no compression: ``model/weight`` float32 in two whole-object
  chunks; ``model/emb`` bfloat16 in two chunks packed into one object, the second a
  padded edge chunk; ``model/bias`` bfloat16 and ``model/scale`` float8_e4m3fn inline;
  ``count`` a 0-d int64; a tree of non-tensor values (int, float, nan, str, None,
  bool, bytes, tuple, int keys, list).
- step 2, two ranks, zstd: ``model/weight`` sharded by rows over both ranks (each
  rank writes its chunks of the global array), the rest as in step 1 with new values.
- ``steps/<step>/refs.json`` for both steps.
- ``expected/<step>/<tensor path>.npy``: every tensor as numpy wrote it; bfloat16 and
  float8 tensors as their raw bits (uint16 / uint8), since ``.npy`` has no such types.

Deterministic: fixed seeds, run ids and timestamps. (zstd output may differ between
zstd builds; the decoded tensors never do.)
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from contextlib import contextmanager
from unittest import mock

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from ravex.format import ArrayShard, open_store  # noqa: E402
from ravex.format.history import clock  # noqa: E402
from ravex.format.objects.names import manifest_key  # noqa: E402
from ravex.format.steps.manifest import Manifest  # noqa: E402
from ravex.format.steps.refs import write_refs  # noqa: E402
from ravex.format.writing import writer as writer_mod  # noqa: E402

EXAMPLE = os.path.join(HERE, "example")
CREATED_AT = "2026-01-01T00:00:00.000+00:00"
RAW_BITS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def state(step: int) -> dict:
    """The state tree written at ``step`` (also what tests compare against)."""
    rng = np.random.default_rng(step)
    return {
        "model": {
            "weight": rng.standard_normal((20, 16)).astype(np.float32),
            "emb": rng.standard_normal((69, 8)).astype(ml_dtypes.bfloat16),
            "bias": rng.standard_normal(8).astype(ml_dtypes.bfloat16),
            "scale": np.linspace(-2, 2, 12).astype(ml_dtypes.float8_e4m3fn),
        },
        "count": np.array(step * 1000, dtype=np.int64),
        "lr": 0.001 * step,
        "loss": float("nan") if step == 1 else 2.5,
        "name": "example",
        "done": step == 2,
        "note": None,
        "seed": b"\x00\x01ravex",
        "betas": (0.9, 0.999),
        "milestones": {10: "warmup", 20: "decay"},
        "history": [1, 2.0, "three"],
    }


@contextmanager
def small_limits():
    """Shrink the writer's inline/pack limits so that a few-KB store has every kind of chunk."""
    with mock.patch.object(writer_mod, "INLINE_MAX_BYTES", 64), mock.patch.object(
        writer_mod, "PACK_MAX_CHUNK_BYTES", 600
    ), mock.patch.object(clock, "now_iso", lambda: CREATED_AT):
        yield


def fix_manifest(store, step: int, rank: int) -> None:
    """Pin the manifest's creation time, so that the fixture is byte-for-byte reproducible."""
    import dataclasses

    key = manifest_key(step, rank)
    m = Manifest.from_bytes(store.storage.read(key), key)
    store.storage.write(key, dataclasses.replace(m, created_at=CREATED_AT).to_bytes())


def main(dest: str = EXAMPLE) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    with small_limits():
        store = open_store(dest, create=True, created_by="spec/make_example.py")
        with store.writer(chunk_bytes=1000, run="example-step-1") as w:
            w.commit(1, state(1), metadata={"purpose": "conformance fixture"})
        fix_manifest(store, 1, 0)

        tree = state(2)
        weight = tree["model"]["weight"]
        rows = 10
        for rank in (0, 1):
            part = dict(tree)
            part["model"] = dict(tree["model"])
            mine = weight[rank * rows : (rank + 1) * rows]
            part["model"]["weight"] = ArrayShard(mine, weight.shape, rank * rows, rows)
            with store.writer(rank, 2, "zstd", chunk_bytes=1000, run="example-step-2") as w:
                w.commit(2, part, metadata={"purpose": "conformance fixture"})
            fix_manifest(store, 2, rank)
    store = open_store(dest)
    for step in (1, 2):
        write_refs(store, step)
        for path, array in store.open_step(step).read_arrays(list(store.open_step(step).arrays)).items():
            out = os.path.join(dest, "expected", str(step), *path.split("/")) + ".npy"
            os.makedirs(os.path.dirname(out), exist_ok=True)
            bits = RAW_BITS.get(store.open_step(step).arrays[path].data_type)
            np.save(out, array.view(bits) if bits else array, allow_pickle=False)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(dest) for f in fs)
    print(f"wrote {dest}: {math.ceil(size / 1024)} KiB")


if __name__ == "__main__":
    main(*sys.argv[1:])
