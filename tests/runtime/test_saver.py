"""The async pipeline: reused staging buffers, one write in flight, failures kept."""

from __future__ import annotations

import threading

import ml_dtypes
import numpy as np
import torch

from ravex._saver import AsyncSaver, Job, Stager


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
    saver.submit(Job(1, {}, {}, {"wait": 0, "stage": 0}, 0))
    started.wait()
    assert saver.busy
    waiter = threading.Thread(target=lambda: done.append(("waited", saver.wait_idle())))
    waiter.start()
    release.set()
    waiter.join()
    assert done[0] == (1, None) and done[1][0] == "waited" and done[1][1] >= 0
    saver.submit(Job(2, {}, {}, {"wait": 0, "stage": 0}, 0))
    saver.flush()
    assert done[-1][0] == 2 and isinstance(done[-1][1], OSError)  # kept, not raised
    saver.close()
