"""ravex.format.storage.direct: large objects written from page-aligned buffers past the page cache.

What is checked: an aligned buffer goes the O_DIRECT way (the flag reaches ``open``) and the
object published is its exact bytes, a partial last block included; an unaligned or small
buffer goes through the page cache as before; a file system that refuses direct I/O (EINVAL on
the first write) leaves no temp file, the object is still written whole, and that file system
is not asked again; the runtime's staging buffers start on a page, so its chunks qualify.
"""

from __future__ import annotations

import errno
import fcntl
import os

import numpy as np
import pytest
import torch

from ravex.format import open_store
from ravex.format.storage import LocalStorage
from ravex.format.storage import direct as direct_mod
from ravex.saving.stager import _staging_buffer

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="O_DIRECT is Linux's")


def _aligned(nbytes: int, seed: int = 0) -> np.ndarray:
    block = np.empty(nbytes + direct_mod.ALIGN, dtype=np.uint8)
    skip = -block.ctypes.data % direct_mod.ALIGN
    out = block[skip:skip + nbytes]
    out[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    return out


@pytest.fixture
def opens(monkeypatch):
    """The flags of every ``os.open`` of a temp file, in order."""
    seen: list[int] = []
    real = os.open

    def spy(path, flags, *args, **kwargs):
        if os.path.basename(os.fspath(path)).startswith(".tmp-"):
            seen.append(flags)
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    monkeypatch.setattr(direct_mod, "_refused", set())
    return seen


def _publish(storage: LocalStorage, key: str, data) -> bytes:
    pending = storage.write_pending(key, data)
    storage.publish([pending])
    storage.sync()
    with open(os.path.join(storage.root, key), "rb") as f:
        return f.read()


@pytest.mark.parametrize("nbytes", [4 << 20, (4 << 20) + 1234, (2 << 20) + 4096])
def test_aligned_buffer_is_written_direct_and_whole(tmp_path, opens, nbytes):
    storage = LocalStorage(str(tmp_path / "s"))
    data = _aligned(nbytes, seed=nbytes)
    got = _publish(storage, "objects/ab/x", memoryview(data))
    assert got == data.tobytes()
    assert opens and opens[0] & os.O_DIRECT, "the aligned body did not go the O_DIRECT way"
    assert [n for n in os.listdir(tmp_path / "s" / "objects" / "ab") if n.startswith(".tmp-")] == []


@pytest.mark.parametrize("offset, nbytes", [(1, 4 << 20), (0, 64 << 10)])
def test_unaligned_or_small_buffer_goes_through_the_page_cache(tmp_path, opens, offset, nbytes):
    storage = LocalStorage(str(tmp_path / "s"))
    data = _aligned(nbytes + offset)[offset:]
    assert _publish(storage, "objects/cd/y", memoryview(data)) == data.tobytes()
    assert opens and not any(f & os.O_DIRECT for f in opens)


def test_a_file_system_refusing_direct_io_falls_back_once(tmp_path, opens, monkeypatch):
    real_write = os.write
    refused: list[int] = []

    def write(fd, data):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    storage = LocalStorage(str(tmp_path / "s"))
    first, second = _aligned(4 << 20, 1), _aligned(4 << 20, 2)
    assert _publish(storage, "objects/ef/1", memoryview(first)) == first.tobytes()
    assert _publish(storage, "objects/ef/2", memoryview(second)) == second.tobytes()
    assert len(refused) == 1, "the file system was asked for direct I/O again after refusing it"
    assert sorted(os.listdir(tmp_path / "s" / "objects" / "ef")) == ["1", "2"]  # no temp file left


def test_staging_buffers_start_on_a_page_and_a_commit_reads_back(tmp_path, opens):
    src = torch.randn(1024, 1024)
    buf = _staging_buffer(src)
    assert buf.data_ptr() % direct_mod.ALIGN == 0
    buf.copy_(src)
    store = open_store(tmp_path / "store", create=True)
    with store.writer(chunk_bytes=1 << 20) as w:
        w.commit(1, {"w": buf.numpy(), "odd": buf.numpy()[:, :1000].copy()})
    assert any(f & os.O_DIRECT for f in opens)
    back = open_store(tmp_path / "store").read(1)
    assert np.array_equal(back["w"], src.numpy()) and np.array_equal(back["odd"], src.numpy()[:, :1000])
