"""The async pipeline: reused staging buffers, one write in flight, failures kept."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import torch

from ravex.saving.plan import SavePlan
from ravex.saving.stager import Stager
from ravex.saving.writer_thread import AsyncSaver, Job


def test_staging_buffers_are_allocated_once_and_reused():
    stager = Stager(as_numpy=True)
    w = torch.randn(64, 32)
    tree = {"w": w, "bf": torch.ones(4, dtype=torch.bfloat16), "n": 3, "t": (torch.zeros(2),)}
    first = stager.stage(tree)
    w.add_(1)
    second = stager.stage(tree)
    assert first["w"] is second["w"]  # the same buffer, refilled
    assert np.array_equal(second["w"], w.numpy()) and not np.shares_memory(second["w"], w.numpy())
    assert second["bf"].dtype == ml_dtypes.bfloat16 and second["n"] == 3
    assert isinstance(second["t"], tuple)
    assert stager.nbytes == w.numel() * 4 + 4 * 2 + 2 * 4


def test_noncontiguous_and_zero_dim_tensors_are_staged_contiguous():
    stager = Stager(as_numpy=True)
    staged = stager.stage({"t": torch.arange(12.0).reshape(3, 4).T, "s": torch.tensor(5.0)})
    assert staged["t"].flags.c_contiguous and staged["t"].tolist() == torch.arange(12.0).reshape(3, 4).T.tolist()
    assert staged["s"].shape == () and float(staged["s"]) == 5.0


def test_staged_sequences_of_plain_values_are_private_copies():
    """The fast path for lists of plain values (Python's RNG state, param_groups' params)
    must still hand the writer a copy: the live list may change before it is written."""
    stager = Stager(as_numpy=True)
    params, rng = [0, 1, 2], (3, tuple(range(625)), None)
    staged = stager.stage({"params": params, "rng": rng, "mixed": [1, torch.ones(2)]})
    params.append(3)
    assert staged["params"] == [0, 1, 2] and staged["params"] is not params
    assert staged["rng"] == rng
    assert isinstance(staged["mixed"][1], np.ndarray)  # a list with a tensor is still walked


def test_staging_buffers_of_every_dtype_hold_the_bytes():
    """CPU staging buffers come from numpy's allocator (huge pages) viewed as the tensor's
    dtype: every dtype and shape must round-trip, including the ones numpy lacks."""
    tree = {
        "f32": torch.randn(3, 5), "bf16": torch.randn(7, dtype=torch.bfloat16),
        "f8": torch.randn(9).to(torch.float8_e4m3fn), "i64": torch.arange(6).reshape(2, 3),
        "bool": torch.tensor([True, False, True]), "c64": torch.randn(4, dtype=torch.complex64),
        "empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5, dtype=torch.float16),
    }
    staged = Stager(as_numpy=False).stage(tree)
    for name, src in tree.items():
        buf = staged[name]
        assert buf.dtype == src.dtype and buf.shape == src.shape and buf.is_contiguous(), name
        assert torch.equal(buf.view(torch.uint8) if buf.dtype == torch.float8_e4m3fn else buf,
                           src.view(torch.uint8) if src.dtype == torch.float8_e4m3fn else src), name
        if src.numel():
            assert buf.data_ptr() != src.data_ptr(), name


def test_one_write_in_flight_and_backpressure_is_measured():
    release = threading.Event()
    started = threading.Event()
    done: list[tuple[int, object]] = []

    def write(job: Job) -> dict:
        started.set()
        release.wait()
        if job.step == 2:
            raise OSError("disk on fire")
        return {}

    saver = AsyncSaver(write, lambda job, result, error: done.append((job.step, error)))
    saver.submit(Job(SavePlan(1, {}, {}), {"wait": 0, "stage": 0}, 0))
    started.wait()
    assert saver.busy
    waiter = threading.Thread(target=lambda: done.append(("waited", saver.wait_idle())))
    waiter.start()
    release.set()
    waiter.join()
    assert done[0] == (1, None) and done[1][0] == "waited" and done[1][1] >= 0
    saver.submit(Job(SavePlan(2, {}, {}), {"wait": 0, "stage": 0}, 0))
    saver.flush()
    assert done[-1][0] == 2 and isinstance(done[-1][1], OSError)  # kept, not raised
    saver.close()
