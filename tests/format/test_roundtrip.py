"""Round-trips: every value type and dtype comes back exactly (types, bits, key order)."""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from fmt_helpers import assert_same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravex.format import UnsupportedValueError, open_store
from ravex.format.objects.dtypes import BY_NAME
from ravex.format.objects.names import check_array_path, escape_key, unescape_key

DTYPE_NAMES = sorted(BY_NAME)
SPECIAL_KEYS = [
    "layer.0.weight", "a.b.c", "état", "日本語", "🙂", "a/b", "/", "//", "%", "%2F", "%00", "a%b",
    "__x", "__", "___", "_", ".", "..", "...", ".hidden", "$float", "$array", "$", "$dict", "$tuple",
    "", "~", "a~b", " ", "a b", "c/0", "zarr.json", "\x00", "\\", "?#&=+", "-",
]


def _bits(dtype: np.dtype, n: int) -> st.SearchStrategy[np.ndarray]:
    """``n`` elements of ``dtype`` from arbitrary bits (every NaN payload, -0.0, inf, subnormals)."""
    if dtype == np.bool_:
        return st.lists(st.booleans(), min_size=n, max_size=n).map(lambda v: np.array(v, dtype=np.bool_))
    size = n * dtype.itemsize
    return st.binary(min_size=size, max_size=size).map(lambda b: np.frombuffer(b, dtype=dtype).copy())


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = BY_NAME[draw(st.sampled_from(DTYPE_NAMES))].numpy.newbyteorder("=")
    shape = draw(
        st.one_of(
            st.just(()),
            st.tuples(st.integers(0, 48)),
            st.tuples(st.integers(0, 12), st.integers(0, 12)),
            st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(0, 5)),
        )
    )
    view = draw(st.sampled_from(["contiguous", "transposed", "strided", "reversed"]))
    if view == "transposed" and len(shape) >= 2:
        base = draw(_bits(dtype, math.prod(shape))).reshape(shape[::-1])
        return base.T  # an F-ordered view
    if view in ("strided", "reversed") and shape:
        wide = (shape[0] * 2, *shape[1:]) if view == "strided" else shape
        base = draw(_bits(dtype, math.prod(wide))).reshape(wide)
        return base[::2] if view == "strided" else base[::-1]
    return draw(_bits(dtype, math.prod(shape))).reshape(shape)


str_keys = st.one_of(st.sampled_from(SPECIAL_KEYS), st.text(max_size=6))
any_keys = st.one_of(
    str_keys,
    st.integers(-(2**40), 2**40),
    st.tuples(st.integers(-3, 3), st.text(max_size=3)),
)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # unbounded: big ints stay exact
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 1e308, 0.1]),
    st.text(),
    st.binary(max_size=24),
    arrays(),
)


def _unique_names(pairs: list) -> dict:
    return dict(pairs)


def _dicts(children: st.SearchStrategy, keys: st.SearchStrategy) -> st.SearchStrategy[dict]:
    # keys whose escaped tensor names collide (0 and "0", "" and "\x00") are an error by design
    return st.lists(
        st.tuples(keys, children), max_size=4, unique_by=lambda kv: escape_key(str(kv[0]))
    ).map(_unique_names)


trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        _dicts(children, str_keys),
        _dicts(children, any_keys),
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def shared_writer(tmp_path_factory):
    """One store and writer for all examples: each example is a new step (so deltas get used too).
    chunk_bytes=1 KiB: arrays span several chunks, edge chunks are padded, chunks are inline or packed."""
    store = open_store(tmp_path_factory.mktemp("rt") / "store", create=True)
    with store.writer(chunk_bytes=1024, threads=2) as w:
        yield store, w, itertools.count(1)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tree=trees)
def test_tree_roundtrip_exact(shared_writer, tree):
    store, writer, steps = shared_writer
    step = next(steps)
    writer.commit(step, tree)
    got = open_store(store.url).read(step)  # a fresh reader: nothing cached
    assert_same(got, tree)


@settings(max_examples=40, deadline=None)
@given(arr=arrays(), compression=st.sampled_from(["none", "zstd", "blosc", "blosc:zstd"]))
def test_array_roundtrip_every_compression(tmp_path_factory, arr, compression):
    store = open_store(tmp_path_factory.mktemp("arr") / "s", create=True)
    with store.writer(compression=compression, chunk_bytes=512, threads=1) as w:
        w.commit(1, {"x": arr})
    got = store.read(1)["x"]
    assert_same(got, arr.copy())


@pytest.mark.parametrize("compression", ["none", "blosc"])
@pytest.mark.parametrize("name", DTYPE_NAMES)
def test_every_dtype_every_shape(tmp_path, name, compression):
    """Each dtype: 0-d, empty along dim 0 and a later dim, non-contiguous, multi-chunk with a
    padded edge chunk, whole-object chunks (>= 256 KiB) and packed ones, read whole and by rows."""
    dt = BY_NAME[name].numpy.newbyteorder("=")
    rng = np.random.default_rng(len(name))
    big = np.frombuffer(rng.bytes(700 * 1024 // dt.itemsize * dt.itemsize), dtype=np.uint8)
    if dt == np.bool_:
        big = big & 1
    big = big.view(dt)
    big = big[: (len(big) // 512) * 512].reshape(-1, 512)  # rows of 512 elements
    small = big[:37, :21]
    tree = {
        "scalar": big.reshape(-1)[3:4].reshape(()),
        "empty0": big[:0],
        "empty1": big[:5, :0],
        "empty_mid": np.zeros((3, 0, 4), dt),
        "small": small,
        "transposed": small.T,
        "strided": big[::3, ::5],
        "big": big,  # > 256 KiB chunks for 8-byte types with chunk_bytes=256 KiB
    }
    store = open_store(tmp_path / "s", create=True)
    with store.writer(chunk_bytes=256 << 10, compression=compression) as w:
        w.commit(1, tree)
    reader = open_store(tmp_path / "s").open_step(1)
    got = reader.read()
    assert_same(got, {k: v.copy() for k, v in tree.items()})
    entry = reader.arrays["big"]
    assert len(entry.chunks) >= 2
    # partial reads at chunk edges, into a caller buffer of the same item size
    crow = entry.chunk_shape[0]
    for rows in (slice(0, 1), slice(crow - 1, crow + 1), slice(len(big) - 2, None), slice(5, 5)):
        assert reader.read_array("big", rows=rows).tobytes() == big[rows].tobytes()
    out = np.empty(big.shape, dtype=f"u{dt.itemsize}" if dt.itemsize in (1, 2, 4, 8) else f"V{dt.itemsize}")
    assert reader.read_array("big", out=out) is out
    assert out.tobytes() == big.tobytes()


def test_value_types_stay_exact(store):
    tree = {
        "int": 1, "float_one": 1.0, "neg0": -0.0, "nan": math.nan, "inf": math.inf, "ninf": -math.inf,
        "big": 2**100, "bool": True, "none": None, "bytes": b"\x00\xff", "str": "ünï\u2028",
        "tuple": (1, (2.0, "3")), "list": [1, [2, (3,)]], "empty": {}, "empty_t": (), "empty_l": [],
        "int_keys": {0: "a", -1: "b", 10**20: "c"}, "tuple_keys": {(0, "x"): 1, (): 2},
        "dollar": {"$float": "not a float", "$array": "x", "plain": 1},
        "mixed_keys": {"0x": 1, 0: 2},
    }
    with store.writer() as w:
        w.commit(1, tree)
    assert_same(store.read(1), tree)


@pytest.mark.parametrize("key", SPECIAL_KEYS)
def test_escaped_names_are_valid_and_reversible(key):
    seg = escape_key(key)
    check_array_path(seg, "test")  # a valid node name, or this raises
    assert "/" not in seg and not seg.startswith("__") and set(seg) != {"."}
    if key not in ("", "\x00"):  # the empty key is kept by the tree, not the name
        assert unescape_key(seg) == key


@given(st.text())
def test_escape_key_any_text(key):
    seg = escape_key(key)
    check_array_path(seg, "test")
    if key:
        assert unescape_key(seg) == key


def test_unsupported_values_are_refused(store):
    with store.writer() as w:
        with pytest.raises(UnsupportedValueError, match=r"model/x.*object"):
            w.commit(1, {"model": {"x": object()}})
        with pytest.raises(UnsupportedValueError, match="same tensor name"):
            w.commit(1, {0: np.zeros(3), "0": np.zeros(3)})
        with pytest.raises(Exception, match="cannot be stored"):
            w.commit(1, {"x": np.array(["a"])})
    assert store.latest_step() is None


def test_bfloat16_and_float8_nan_payloads(store):
    for dt in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        bits = np.arange(2 ** (8 * np.dtype(dt).itemsize), dtype=f"u{np.dtype(dt).itemsize}")
        with store.writer() as w:
            step = (store.latest_step() or 0) + 1
            w.commit(step, {"all_bit_patterns": bits.view(dt)})
        assert store.read(step)["all_bit_patterns"].view(bits.dtype).tobytes() == bits.tobytes()


def test_manifest_bytes_are_exactly_what_json_writes(tmp_path):
    """Manifest.to_bytes writes chunk maps with f-strings (fast for 400k entries); the bytes
    must be json.dumps' own, for every kind of chunk entry and for names json must escape."""
    import json

    from ravex.format import open_store
    from ravex.format.objects.chunkref import ChunkRef
    from ravex.format.steps.manifest import ArrayEntry, Manifest

    store = open_store(tmp_path / "s", create=True)
    rng = np.random.default_rng(1)
    tree = {"état": {"big": rng.standard_normal((256, 1024)).astype(np.float32),  # whole objects
                     'q"uote\\': rng.standard_normal(3000).astype(np.float32),  # packed
                     "tiny": np.arange(3, dtype=np.int8)},  # inline
            "meta": {"lr": 0.1, "name": "ünïcode"}}
    with store.writer(chunk_bytes=512 << 10) as w:
        w.commit(1, tree, metadata={"note": "tab\there"})
    m = open_store(store.url).manifest(1, 0)
    kinds = {("inline" if c.inline is not None else "packed" if c.offset is not None else "object")
             for e in m.arrays.values() for c in e.chunks.values()}
    assert kinds == {"inline", "packed", "object"}
    want = json.dumps(m.to_json(), separators=(",", ":"), allow_nan=False).encode()
    assert m.to_bytes() == want
    odd = Manifest(step=2, rank=0, world_size=1, run="r", created_at="now", tree={}, arrays={
        "a/%22b": ArrayEntry(zarr={"shape": [1]}, chunks={'c/0"': ChunkRef(raw="0" * 32, size=4, object="1" * 32)})})
    assert odd.to_bytes() == json.dumps(odd.to_json(), separators=(",", ":"), allow_nan=False).encode()


def test_a_restored_dict_pickles_to_the_bytes_of_the_one_saved(tmp_path):
    """``pickle`` writes a string it met before in the same dump as a reference to that object.
    Attribute names and literals are interned, so in a training script an optimizer's
    ``param_groups`` keys and ``argparse``'s attributes are the same objects; restored keys must be
    too, or the script's own ``torch.save`` after a resume writes other bytes (timm's
    ``checkpoint-N.pth.tar``, which pickles its args beside the optimizer)."""
    import argparse
    import pickle

    parser = argparse.ArgumentParser()
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    args = parser.parse_args([])
    group = {"momentum": 0.9, "weight_decay": 1e-4, "params": [0, 1]}
    typed = {("weight_decay", 1): "x"}  # a $dict: keys of any type
    store = open_store(str(tmp_path / "s"), create=True)
    store.writer(run="r").commit(1, {"optimizer": {"param_groups": [group]}, "typed": typed})
    back = open_store(str(tmp_path / "s")).read(1)  # a reader of its own: keys decoded from the manifest
    [restored] = back["optimizer"]["param_groups"]
    assert restored == group and back["typed"] == typed
    assert pickle.dumps([restored, back["typed"], args]) == pickle.dumps([group, typed, args])
