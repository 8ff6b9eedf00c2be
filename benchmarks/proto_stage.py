"""PROTOTYPE of fixes (A)+(B) proposed for ``ravex/_saver.py`` (benchmarks only, not used by Ravex).

``python -m benchmarks.proto_stage``: the runtime's ``Stager`` against a subclass that (A) copies CPU
tensors with ``np.copyto`` (one thread) instead of ``Tensor.copy_`` (intra-op threads, which wait on a
descheduled thread on a busy 2-core machine) and (B) skips a tensor whose ``(data_ptr, _version)`` did
not move since the last stage (its buffer already holds those bytes: frozen parameters). Dense 1 GiB
and 90%-frozen 512 MiB states, one optimizer step between stages, interleaved, median of 5; the
prototype's buffers are checked equal to the live state.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import torch

from ravex._saver import Stager, numpy_view

from . import limits as L
from . import state as S


class SkipUnchangedStager(Stager):
    def __init__(self) -> None:
        super().__init__(as_numpy=True)
        self._seen: dict[tuple, tuple[int, int]] = {}

    def _tensor(self, tensor: torch.Tensor, path: tuple) -> Any:
        src = tensor.detach()
        key = (src.data_ptr(), src._version)
        entry = self._buffers.get(path)
        self.nbytes += src.numel() * src.element_size()
        if entry is not None and self._seen.get(path) == key and entry[0].shape == src.shape:
            return entry[1]  # (B) nothing wrote to it since the last stage
        if entry is None or entry[0].shape != src.shape or entry[0].dtype != src.dtype:
            buf = torch.empty(src.shape, dtype=src.dtype)
            entry = (buf, numpy_view(buf))
            self._buffers[path] = entry
        np.copyto(entry[1], numpy_view(src.contiguous()))  # (A) one thread
        self._seen[path] = key
        return entry[1]


def main(reps: int = 5) -> None:
    for mib, frozen in ((1024, 0.0), (512, 0.9)):
        st = S.build(mib, frozen_fraction=frozen)
        tree = st.torch_state()
        cur, pro = Stager(as_numpy=True), SkipUnchangedStager()
        cur.stage(tree)
        pro.stage(tree)  # both allocate (first touch) before timing
        arrays = [v for v in S.flatten(S.to_numpy_tree(tree)).values() if isinstance(v, np.ndarray)]
        dst = [np.zeros_like(a) for a in arrays]
        res: dict[str, list[float]] = {"Stager (current)": [], "prototype A+B": [], "bare copy of all": []}
        out: Any = None
        for rep in range(reps):
            st.train(1, seed=rep)
            tree = st.torch_state()
            for name in list(res) if rep % 2 == 0 else list(res)[::-1]:
                t0 = time.perf_counter()
                if name == "Stager (current)":
                    cur.stage(tree)
                elif name == "prototype A+B":
                    out = pro.stage(tree)
                else:
                    L.copy_reused(arrays, dst)
                res[name].append(time.perf_counter() - t0)
        got, want = S.flatten(out), S.flatten(S.to_numpy_tree(tree))
        bad = [k for k, v in want.items() if isinstance(v, np.ndarray) and not np.array_equal(got[k], v)]
        assert not bad, f"prototype staged stale bytes: {bad[:3]}"
        print(f"{mib} MiB, frozen {frozen:.0%}: "
              + ", ".join(f"{k} {statistics.median(v):.3f} s" for k, v in res.items()))


if __name__ == "__main__":
    main()
