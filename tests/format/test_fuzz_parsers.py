"""Fuzzing the two parsers a store feeds: manifests (``steps/<n>/rank-<r>.json``) and the root
document (``ravex.json``).

Whatever the bytes (arbitrary JSON, or a real manifest truncated, bit-flipped, with a value of
the wrong type or a deep nest in place of any field), parsing, listing, reading, ``validate
--full`` and ``gc`` raise only :class:`RavexError` subclasses: no other exception, no hang, no
allocation beyond a few MiB, and no path outside the store is opened, listed or deleted.

Sized to run in a few seconds (``max_examples``); ``tests/fuzz/atheris_manifest.py`` runs the
same property for as long as you like, coverage-guided, outside CI.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravex.format import RavexError, open_store
from ravex.format.objects.names import manifest_key
from ravex.format.reports.validate import validate
from ravex.format.steps.manifest import Manifest

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
STORE_FUZZ = settings(FUZZ, max_examples=50)  # each example lists, reads, validates and GCs a store
MAX_PEAK = 32 << 20  # the store holds < 1 MiB; nothing a manifest says may make a verb allocate more
MAX_SECONDS = 10.0

# ---- a real store to mutate -----------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Any]:
    """A store with steps 1 and 2 (whole-object, packed and inline chunks, a typed tree)."""
    root = tmp_path_factory.mktemp("fuzz") / "s"
    store = open_store(root, create=True)
    rng = np.random.default_rng(0)
    with store.writer(compression="zstd", chunk_bytes=16 << 10) as w:
        for s in (1, 2):
            w.commit(s, {"model": {"w": rng.standard_normal((64, 128)).astype(np.float32),
                                   "b": np.arange(40, dtype=np.float16), "n": np.array(s)},
                         "opt": {"lr": 0.1, "betas": (0.9, 0.99), 3: b"\x00\x01", "$k": None}})
    manifest = (root / manifest_key(2, 0)).read_bytes()
    return {"root": root, "manifest": manifest, "doc": json.loads(manifest),
            "ravex.json": (root / "ravex.json").read_bytes()}


# ---- strategies -----------------------------------------------------------------------------

HOSTILE_TEXT = st.sampled_from([
    "..", "../secret", "../../../../secret", "/etc/passwd", "a/../../secret", "c/0/0", "c/-1/0", "c/1e9/0",
    "%2E%2E", "\x00", "0" * 32, "A" * 32, "0" * 31 + "/", "objects/00/" + "0" * 32, "__x", "$array", "$float",
    "nan", "inf", "1.0", "2.0", "9.9", "ravex-manifest", "xxh3-128", "zstd", "blosc", "bytes", "float128", "",
])
SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from([0, 1, -1, 10**12, 10**18])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | HOSTILE_TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8) | HOSTILE_TEXT, inner, max_size=4), max_leaves=12)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


_NEST = "__ravex_fuzz_nest__"


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


@st.composite
def mutated(draw: Any, original: bytes, doc: dict) -> bytes:
    """A valid document with one or two mutations: a value replaced (wrong type, hostile name,
    huge number), a key deleted, a deep nest spliced in, bytes truncated or flipped."""
    doc = json.loads(json.dumps(doc))
    data = original
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "nest", "truncate", "flip"]))
        if kind in ("replace", "delete", "nest"):
            path = draw(st.sampled_from(_paths(doc)))
            if kind == "delete" and path:
                parent = doc
                for key in path[:-1]:
                    parent = parent[key]
                del parent[path[-1]]
            else:
                doc = _set(doc, path, _NEST if kind == "nest" else draw(JSON))
            text = json.dumps(doc)
            if kind == "nest":
                depth = draw(st.sampled_from([50, 900, 1100, 5000, 100_000]))
                text = text.replace(json.dumps(_NEST), "[" * depth + "1" + "]" * depth, 1)
            data = text.encode()
        elif kind == "truncate":
            data = data[: draw(st.integers(0, max(0, len(data) - 1)))]
        else:
            pos = draw(st.integers(0, max(0, len(data) - 1)))
            data = data[:pos] + bytes([data[pos] ^ draw(st.integers(1, 255))]) + data[pos + 1 :] if data else data
    return data


# ---- the properties ---------------------------------------------------------------------------


class _Audit:
    """Every path this process opens, lists, or removes while active (one audit hook, ever)."""

    EVENTS = frozenset({"open", "os.listdir", "os.scandir", "os.remove", "os.unlink", "os.rmdir", "os.rename",
              "os.replace", "shutil.rmtree", "os.mkdir"})
    paths: list[str] | None = None
    installed = False

    @classmethod
    def hook(cls, event: str, args: tuple) -> None:
        if cls.paths is not None and event in cls.EVENTS and args and isinstance(args[0], (str, bytes, os.PathLike)):
            cls.paths.append(os.fsdecode(args[0]))

    def __enter__(self) -> list[str]:
        if not _Audit.installed:
            sys.addaudithook(_Audit.hook)
            _Audit.installed = True
        _Audit.paths = []
        return _Audit.paths

    def __exit__(self, *exc: object) -> None:
        _Audit.paths = None


def _only_ravex_errors(fn: Any) -> Any:
    try:
        return fn()
    except RavexError:
        return None


def _exercise(root: Path) -> None:
    """Every verb that reads manifests: each may fail, but only with a RavexError."""

    def read_all() -> None:
        store = open_store(root)
        for info in store.steps():
            if info.complete:
                _only_ravex_errors(lambda s=info.step: store.read(s))

    _only_ravex_errors(read_all)
    _only_ravex_errors(lambda: validate(str(root), full=True))
    _only_ravex_errors(lambda: open_store(root).gc(keep_last=1, dry_run=True))
    # for real: every complete step is kept, step 2 is fresh (kept even when incomplete) and every
    # object is younger than the grace period, so nothing may go
    _only_ravex_errors(lambda: open_store(root).gc())


def _check_store(base: dict[str, Any], key: str, data: bytes) -> None:
    root: Path = base["root"]
    outside = root.parent
    (outside / "secret").write_bytes(b"never read, never deleted" * 4)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    (root / key).write_bytes(data)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with _Audit() as touched:
            _exercise(root)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        (root / key).write_bytes(base[key] if key == "ravex.json" else base["manifest"])
    assert time.perf_counter() - started < MAX_SECONDS
    assert peak < MAX_PEAK, f"peak {peak} bytes"
    store_root = os.path.realpath(root)
    escaped = [p for p in touched if os.path.realpath(p).startswith(os.path.realpath(outside) + os.sep)
               and not (os.path.realpath(p) + os.sep).startswith(store_root + os.sep)]
    assert escaped == []
    assert (outside / "secret").exists()
    # a fresh step or one whose manifest is unreadable is kept, so GC deleted nothing here
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


@FUZZ
@given(data=st.binary(max_size=300) | JSON.map(lambda d: json.dumps(d).encode()))
def test_manifest_parser_on_arbitrary_documents(data):
    try:
        Manifest.from_bytes(data, "step 2 rank 0")
    except RavexError as exc:
        assert str(exc).startswith("step 2 rank 0")


@FUZZ
@given(st.data())
def test_manifest_parser_on_mutations_of_a_valid_one(base, data):
    blob = data.draw(mutated(base["manifest"], base["doc"]))
    try:
        Manifest.from_bytes(blob, "step 2 rank 0")
    except RavexError as exc:
        assert str(exc).startswith("step 2 rank 0") and len(str(exc)) < 4000


@STORE_FUZZ
@given(st.data())
def test_store_verbs_on_a_mutated_manifest(base, data):
    _check_store(base, manifest_key(2, 0), data.draw(mutated(base["manifest"], base["doc"])))


@STORE_FUZZ
@given(st.data())
def test_store_verbs_on_a_mutated_root_document(base, data):
    doc = json.loads(base["ravex.json"])
    blob = data.draw(mutated(base["ravex.json"], doc) | JSON.map(lambda d: json.dumps(d).encode())
                     | st.binary(max_size=100))
    _check_store(base, "ravex.json", blob)


@STORE_FUZZ
@given(name=HOSTILE_TEXT | st.text(max_size=40), where=st.sampled_from(["object", "path", "chunk key"]))
def test_hostile_names_never_leave_the_store(base, name, where):
    doc = json.loads(base["manifest"])
    entry = doc["arrays"]["model/w"]
    if where == "object":
        next(iter(entry["chunks"].values()))["object"] = name
    elif where == "path":
        doc["arrays"][name] = doc["arrays"].pop("model/w")
    else:
        entry["chunks"][name] = entry["chunks"].pop("c/0/0")
    _check_store(base, manifest_key(2, 0), json.dumps(doc).encode())


def test_the_mutations_reach_the_verbs(base, tmp_path):
    """The fuzzed verbs really run: an untouched copy reads back and validates clean (so a
    property above that never reached them would not pass by accident)."""
    root = tmp_path / "copy"
    shutil.copytree(base["root"], root)
    store = open_store(root)
    assert store.complete_steps() == [1, 2]
    assert store.read(2)["opt"]["betas"] == (0.9, 0.99)
    assert validate(store, full=True).ok
