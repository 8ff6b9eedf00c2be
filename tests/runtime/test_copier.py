"""The stage's shared CPU copy: every byte lands, whoever copies it, and a helper that does not
run never holds the training thread."""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import sys
import threading

import numpy as np
import pytest
import torch

from ravex.format.storage.direct import ALIGN
from ravex.saving import copier as _copier
from ravex.saving.copier import PIECE_BYTES, Copier, byte_view
from ravex.saving.stager import Stager
from ravex.saving.staging.buffers import MAPPED_MIN_BYTES, _aligned_block


def _pairs(sizes: list[int], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 256, n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)) for n in sizes]


def test_every_byte_lands_across_piece_boundaries():
    sizes = [PIECE_BYTES * 3 + 17, 1, PIECE_BYTES - 1, PIECE_BYTES, 5 * PIECE_BYTES + PIECE_BYTES // 2]
    pairs = _pairs(sizes)
    copier = Copier(helpers=2)
    for src, dst in pairs:
        copier.add(src, dst)
    copier.run()
    assert all(np.array_equal(src, dst) for src, dst in pairs)
    copier.run()  # nothing queued: nothing happens
    copier.close()


def test_a_helper_that_never_runs_does_not_hold_the_caller():
    """The helper thread is kept busy elsewhere for the whole copy: the caller copies every
    piece itself and returns without waiting for the helper to come free."""
    copier = Copier(helpers=1)
    pairs = _pairs([8 * PIECE_BYTES])
    copier.add(*pairs[0])
    copier.run()  # starts the pool
    held, release = threading.Event(), threading.Event()
    assert copier._pool is not None
    blocker = copier._pool.submit(lambda: (held.set(), release.wait()))
    assert held.wait(10)
    pairs = _pairs([8 * PIECE_BYTES], seed=1)
    copier.add(*pairs[0])
    done = threading.Thread(target=copier.run)
    done.start()
    done.join(30)
    finished = not done.is_alive()
    release.set()
    blocker.result()
    done.join()
    assert finished, "the copy waited for a helper that never started"
    assert np.array_equal(*pairs[0])
    copier.close()


def _child_copies(copier: Copier, out: multiprocessing.Queue) -> None:
    pairs = _pairs([8 * PIECE_BYTES], seed=2)
    copier.add(*pairs[0])
    copier.run()
    out.put(bool(np.array_equal(*pairs[0])))


def test_a_forked_child_starts_its_own_helpers():
    """After fork() the child has none of the parent's threads: reusing the parent's pool
    would queue work no thread takes."""
    copier = Copier(helpers=1)
    copier.add(*_pairs([8 * PIECE_BYTES])[0])
    copier.run()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_copies, args=(copier, out))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0 and out.get(timeout=5) is True
    copier.close()


def test_byte_view_covers_dtypes_and_refuses_what_it_cannot_view():
    for t in (torch.randn(3, 4), torch.randn(5, dtype=torch.bfloat16), torch.tensor(2.0),
              torch.ones(3, dtype=torch.bool), torch.randn(4).to(torch.float8_e5m2)):
        view = byte_view(t)
        assert view is not None and view.nbytes == t.numel() * t.element_size()
    assert byte_view(torch.randn(4, 3).T) is None
    assert byte_view(torch.randn(3, dtype=torch.complex64).conj()) is None


def test_a_large_stage_goes_through_the_helpers_and_is_exact(monkeypatch):
    calls = []
    real_run = Copier.run

    def run(self):
        calls.append(self._bytes)
        real_run(self)

    monkeypatch.setattr(Copier, "run", run)
    tree = {f"w{i}": torch.randn(1_000_003 + i) for i in range(12)}  # ~48 MiB, odd sizes
    tree["t"] = torch.randn(64, 32).T  # strided: copied on the caller's thread
    staged = Stager(as_numpy=False).stage(tree)
    assert calls and calls[0] >= _copier.PARALLEL_MIN_BYTES
    for name, src in tree.items():
        assert torch.equal(staged[name], src), name


def test_a_failed_copy_stops_the_helpers_before_the_error_reaches_the_caller(monkeypatch):
    """The caller's copy fails at its first piece: it must not return while a helper is still
    writing staging buffers (the next stage would copy into them at the same time)."""
    caller = threading.get_ident()
    done = []

    def copy(dst, src):
        if threading.get_ident() == caller:
            raise RuntimeError("copy failed")
        _copier.np.copyto(dst, src)
        done.append(1)

    monkeypatch.setattr(_copier, "_copy", copy)
    copier = Copier(helpers=2)
    copier.add(*_pairs([64 * PIECE_BYTES])[0])
    try:
        copier.run()
    except RuntimeError as exc:
        assert "copy failed" in str(exc)
    else:
        raise AssertionError("the caller's error was lost")
    finished = len(done)
    copier.close()  # waits for any helper work still running
    assert len(done) == finished < 64  # nothing ran after run() raised; the helpers stopped early


def _resident_bytes(block: np.ndarray) -> int:
    """How many of the pages under ``block`` (page-aligned) are resident: ``mincore(2)``."""
    pages = -(-block.nbytes // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(block.ctypes.data, block.nbytes, vec) == 0, ctypes.get_errno()
    return sum(v & 1 for v in vec) * mmap.PAGESIZE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and madvise through libc are Linux's")
@pytest.mark.parametrize("populate", [True, False], ids=["madvise", "a store per page"])
def test_a_large_staging_block_is_a_mapping_of_its_own_that_touch_faults_in(monkeypatch, populate):
    """A staging block from 1 MiB on starts on a page, none of its pages resident until ``touch``
    faults every one in: with ``MADV_POPULATE_WRITE`` where the kernel has it, else a store per
    page; then the whole block is writable."""
    if not populate:
        monkeypatch.setattr(_copier, "_madvise", False)
    nbytes = MAPPED_MIN_BYTES * 8 + 12345
    block = _aligned_block(nbytes).numpy()
    assert block.nbytes == nbytes and block.ctypes.data % ALIGN == 0 and block.flags.writeable
    assert _resident_bytes(block) == 0
    for at in range(0, nbytes, PIECE_BYTES // 4):
        _copier.touch(block[at:at + PIECE_BYTES // 4])
    assert _resident_bytes(block) >= nbytes
    block[:] = 7  # the whole block is ours to write
    assert int(block.min()) == 7


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise through libc is Linux's")
def test_populating_changes_no_byte_of_a_buffer_in_use():
    """``touch`` through ``madvise`` may cover the pages a piece starts and ends in whole: the
    bytes around it, and its own, stay as they were."""
    data = np.arange(5 * 4096, dtype=np.uint8)
    before = data.copy()
    assert _copier._populate(data[100:3 * 4096 + 5]) in (True, False)
    assert np.array_equal(data, before)
