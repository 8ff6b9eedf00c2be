"""ravex.format.interop.zarr_store: a step is a Zarr v3 hierarchy for stock zarr-python, and the
store passes zarr's own StoreTests for everything a read-only store can do."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import zarr
from open_helpers import same
from zarr.core.buffer import Buffer, cpu, default_buffer_prototype
from zarr.core.sync import _collect_aiterator, sync
from zarr.testing.store import StoreTests

from ravex.format import open_store
from ravex.format.errors import CorruptObjectError
from ravex.format.interop.zarr_store import KeyEntry, StepStore
from ravex.format.objects.chunkref import ChunkRef
from ravex.format.objects.hashing import digest
from ravex.format.objects.names import object_key

READ_ONLY = "store was opened in read-only mode and does not support writing"


# ---- the step as a Zarr hierarchy ---------------------------------------------------------------


def test_open_group_reads_every_array(zoo):
    group = zarr.open_group(store=StepStore(zoo.root, zoo.step), mode="r")
    for path, expected in zoo.arrays.items():
        array = group[path]
        assert array.dtype == expected.dtype or str(array.dtype) == expected.dtype.name
        assert same(array[...], expected), path
    assert group.attrs["ravex"]["step"] == zoo.step
    assert group.attrs["ravex"]["tree"]["lr"] == {"$float": "0.5"}
    assert group.attrs["ravex"]["world_size"] == 2


def test_partial_read_and_members(zoo_zstd):
    group = zarr.open_group(store=StepStore(zoo_zstd.root), mode="r")
    assert same(group["tensors/bfloat16/multi"][10:30, 2:5], zoo_zstd.arrays["tensors/bfloat16/multi"][10:30, 2:5])
    names = {name for name, _ in group.members(max_depth=None)}
    assert {"tensors", "tensors/float8_e5m2", "tensors/float8_e5m2/multi", "big/whole"} <= names


def test_example_store(example_dir):
    group = zarr.open_group(store=StepStore(example_dir, 1), mode="r")
    expected = np.load(example_dir / "expected" / "1" / "model" / "emb.npy")
    assert same(group["model/emb"][...], expected)
    assert group["count"][()] == 1000


def test_corrupt_object_is_refused(zoo_zstd, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(zoo_zstd.root, root)
    store = StepStore(root)
    ref = store._keys["big/whole/c/1/0"].ref
    assert ref.offset is None and ref.inline is None  # a whole object, checked by its name
    path = root / object_key(ref.object)
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError, match="does not match"):
        zarr.open_group(store=store, mode="r")["big/whole"][...]


def test_read_only_and_pickle(zoo_zstd):
    store = StepStore(zoo_zstd.root, "latest")
    with pytest.raises(ValueError, match="read-only"):
        StepStore(zoo_zstd.root, read_only=False)
    with pytest.raises(ValueError, match=READ_ONLY):
        sync(store.set("x", cpu.Buffer.from_bytes(b"1")))
    again = pickle.loads(pickle.dumps(store))
    assert again == store and again.step == zoo_zstd.step
    assert store._keys.keys() == again._keys.keys()


# ---- zarr's own store suite ---------------------------------------------------------------------
#
# zarr's StoreTests puts test data into a store "behind its back" (the ``set`` hook) and reads
# it through the store's API. The backend of a StepStore is its key table; the hook writes
# each value as a content-addressed object and adds a key naming it, so reads go through
# object storage and hash verification like any chunk. Tests that write through the store
# API are replaced by checks that it refuses, with the same reads done via the hook.


class TestStepStore(StoreTests[StepStore, cpu.Buffer]):
    store_cls = StepStore
    buffer_cls = cpu.Buffer

    @pytest.fixture
    def store_kwargs(self, tmp_path) -> dict[str, Any]:
        root = tmp_path / "ckpt"
        with open_store(root, create=True).writer() as w:
            w.commit(1, {})  # an empty step: its key table is the root zarr.json only
        return {"store": str(root), "step": 1, "read_only": True}

    @pytest.fixture
    def store(self, open_kwargs: dict[str, Any]) -> StepStore:
        return sync(self.store_cls.open(**open_kwargs))

    @pytest.fixture
    def store_not_open(self, store_kwargs: dict[str, Any]) -> StepStore:
        return self.store_cls(**store_kwargs)

    async def set(self, store: StepStore, key: str, value: Buffer) -> None:
        data = value.to_bytes()
        name = digest(data)
        store._ckpt.storage.write(object_key(name), data)
        store._keys[key] = KeyEntry(ref=ChunkRef(raw=name, size=len(data), object=name))

    async def get(self, store: StepStore, key: str) -> Buffer:
        return self.buffer_cls.from_bytes(store._ckpt.storage.read(object_key(store._keys[key].ref.object)))

    def test_store_repr(self, store: StepStore) -> None:
        assert repr(store) == f"StepStore({store.url!r}, step=1)"

    def test_store_supports_writes(self, store: StepStore) -> None:
        assert not store.supports_writes

    def test_store_supports_listing(self, store: StepStore) -> None:
        assert store.supports_listing

    def test_store_read_only(self, store: StepStore) -> None:
        assert store.read_only
        with pytest.raises(AttributeError):
            store.read_only = False  # type: ignore[misc]

    @pytest.mark.parametrize("read_only", [True, False])
    async def test_store_open_read_only(self, open_kwargs: dict[str, Any], read_only: bool) -> None:
        open_kwargs["read_only"] = read_only
        if not read_only:
            with pytest.raises(ValueError, match="read-only"):
                await self.store_cls.open(**open_kwargs)
            return
        store = await self.store_cls.open(**open_kwargs)
        assert store._is_open and store.read_only

    async def test_serializable_store(self, store: StepStore) -> None:
        new_store = pickle.loads(pickle.dumps(store))
        assert new_store == store and new_store.read_only
        root = await new_store.get("zarr.json", prototype=default_buffer_prototype())
        assert root is not None and b'"ravex"' in root.to_bytes()

    @pytest.mark.parametrize("key", ["zarr.json", "c/0", "foo/c/0.0", "foo/0/0"])
    @pytest.mark.parametrize("data", [b"\x01\x02\x03\x04", b""])
    async def test_set(self, store: StepStore, key: str, data: bytes) -> None:
        with pytest.raises(ValueError, match=READ_ONLY):
            await store.set(key, self.buffer_cls.from_bytes(data))

    async def test_set_not_open(self, store_not_open: StepStore) -> None:
        with pytest.raises(ValueError, match=READ_ONLY):
            await store_not_open.set("c/0", self.buffer_cls.from_bytes(b"\x01"))

    async def test_set_many(self, store: StepStore) -> None:
        with pytest.raises(ValueError, match=READ_ONLY):
            await store._set_many([("c/0", self.buffer_cls.from_bytes(b"\x01"))])

    async def test_set_if_not_exists(self, store: StepStore) -> None:
        with pytest.raises(ValueError, match=READ_ONLY):
            await store.set_if_not_exists("k", self.buffer_cls.from_bytes(b"1111"))

    async def test_clear(self, store: StepStore) -> None:
        with pytest.raises(NotImplementedError):
            await store.clear()

    async def test_exists(self, store: StepStore) -> None:
        assert not await store.exists("foo")
        await self.set(store, "foo/zarr.json", self.buffer_cls.from_bytes(b"bar"))
        assert await store.exists("foo/zarr.json")

    async def test_getsize_prefix(self, store: StepStore) -> None:
        data_buf = self.buffer_cls.from_bytes(b"\x01\x02\x03\x04")
        for key in ["c/0/0", "c/0/1", "c/1/0", "c/1/1"]:
            await self.set(store, key, data_buf)
        assert await store.getsize_prefix("c") == 16

    async def test_is_empty(self, store: StepStore) -> None:
        assert not await store.is_empty("")  # a step always has its root group
        await self.set(store, "foo/bar", self.buffer_cls.from_bytes(b"something"))
        assert await store.is_empty("fo")
        assert not await store.is_empty("foo/")
        assert not await store.is_empty("foo")
        assert await store.is_empty("spam/")

    async def _baseline(self, store: StepStore) -> set[str]:
        keys = set(await _collect_aiterator(store.list()))
        assert keys == {"zarr.json"}
        return keys

    async def test_list(self, store: StepStore) -> None:
        base = await self._baseline(store)
        keys = ["foo/zarr.json", *(f"foo/c/{i}" for i in range(10))]
        for k in keys:
            await self.set(store, k, self.buffer_cls.from_bytes(b""))
        assert sorted(await _collect_aiterator(store.list())) == sorted(base | set(keys))

    async def test_list_prefix(self, store: StepStore) -> None:
        prefixes = ("", "a/", "a/b/", "a/b/c/")
        keys = [p + "zarr.json" for p in prefixes]
        for k in keys:
            await self.set(store, k, self.buffer_cls.from_bytes(b""))
        for prefix in prefixes:
            observed = sorted(await _collect_aiterator(store.list_prefix(prefix)))
            assert observed == sorted(k for k in keys if k.startswith(prefix))

    async def test_list_empty_path(self, store: StepStore) -> None:
        base = await self._baseline(store)
        keys = ["foo/bar/zarr.json", "foo/bar/c/1", "foo/baz/c/0"]
        for k in keys:
            await self.set(store, k, self.buffer_cls.from_bytes(b""))
        assert sorted(await _collect_aiterator(store.list())) == sorted(base | set(keys))
        assert sorted(await _collect_aiterator(store.list_prefix(""))) == sorted(base | set(keys))
        assert sorted(await _collect_aiterator(store.list_prefix("foo/bar/"))) == sorted(keys[:2])

    async def test_list_dir(self, store: StepStore) -> None:
        assert await _collect_aiterator(store.list_dir("")) == ("zarr.json",)
        for root, keys in [("foo", ["foo/zarr.json", "foo/c/1"]), ("foo/bar", ["foo/bar/x", "foo/bar/y/zarr.json"])]:
            assert await _collect_aiterator(store.list_dir(root)) == ()
            for k in keys:
                await self.set(store, k, self.buffer_cls.from_bytes(b"1"))
            expected = sorted({k.removeprefix(root + "/").split("/")[0] for k in keys})
            assert sorted(await _collect_aiterator(store.list_dir(root))) == expected
            assert sorted(await _collect_aiterator(store.list_dir(root + "/"))) == expected
