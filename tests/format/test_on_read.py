"""``StepWriter.commit(on_read=...)``: called once every byte of the tree's arrays is read and
before anything names them, so a caller that handed over live arrays (the runtime over its
``staging_max_bytes``) may change them from then on without changing the step."""

from __future__ import annotations

import numpy as np

from ravex.format import open_store

CHUNK = 256 << 10


def _tree(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"big": rng.standard_normal((256, 1024)).astype(np.float32),  # 1 MiB: own objects
            "small": rng.standard_normal(512).astype(np.float32),  # packed
            "lr": 0.1}


def test_on_read_comes_before_the_manifest_and_later_changes_do_not_reach_the_step(tmp_path):
    store = open_store(str(tmp_path / "s"), create=True)
    tree = _tree(0)
    want = {k: v.copy() for k, v in tree.items() if isinstance(v, np.ndarray)}
    calls: list[bool] = []

    def on_read() -> None:
        calls.append(store.step_info(1).complete)
        for k in want:  # training goes on: the arrays change in place
            tree[k] += 1.0

    with store.writer(chunk_bytes=CHUNK) as w:
        w.commit(1, tree, on_read=on_read)
        assert calls == [False]  # once, before the step was complete
        got = store.read(1)
        for k, v in want.items():
            assert got[k].tobytes() == v.tobytes(), k
        tree2 = _tree(0)  # a second commit reusing the first one's chunks calls it too
        w.commit(2, tree2, on_read=lambda: calls.append(True))
    assert calls == [False, True]
