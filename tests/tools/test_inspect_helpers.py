"""The pure parts: the format's summaries, diff and validation as the tools call them, and the formatting
both tools share."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from stores import corrupt_object_of, write_run

from ravex.cli.common import UsageError, default_store, split_step
from ravex.errors import ConfigError
from ravex.format import open_store
from ravex.format.reports.diff import diff
from ravex.format.reports.summary import chunk_sharing, summarize_steps, tensor_stats
from ravex.format.reports.validate import validate
from ravex.tui.formatting import (
    bar,
    chunk_map,
    display_path,
    histogram_lines,
    human_bytes,
    number,
    short_bytes,
    sparkline,
)
from ravex.tui.model import Leaf, children, filter_leaves, step_leaves


def test_human_numbers():
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 << 20, None)] == ["0 B", "1023 B", "1.5 KiB", "5.0 MiB", "-"]
    assert [short_bytes(n) for n in (0, 980, 43315, 1153434, 99.99 * 1024, 5 << 40)] == [
        "0", "980", "42.3K", "1.1M", "100K", "5.0T"]
    assert [number(x) for x in (None, 0.0, 0.5, 1234.5678, 1e-7, math.inf, 3)] == [
        "-", "0", "0.5", "1235", "1.00e-07", "inf", "3"]


def test_bars_sparklines_chunk_maps():
    assert bar(1, 2, 4) == "██  "
    assert bar(0, 2, 4) == "    " and bar(1, 0, 4) == "    "
    assert bar(1e-9, 1, 4) == "▏   "  # anything above zero shows
    assert sparkline([0, 1, 2, 4]) == "▁▃▅█"  # eight levels, scaled to the largest
    assert sparkline([5, 0, 0, 5, 0, 0], width=3) == "██▁"  # each cell the max of its group
    assert len(sparkline(list(range(100)), width=10)) == 10
    assert chunk_map(["shared", "changed", "new"]) == "░██"
    assert chunk_map(["shared"] * 4 + ["new"] * 4 + ["shared", "new"] * 2, width=6) == "░░██▓▓"
    lines = histogram_lines([1, 4], [0.0, 0.5, 1.0], width=4)
    assert lines[1].endswith("████ 4") and "0.5" in lines[0]
    assert histogram_lines([], []) == ["(no finite values)"]


def test_tensor_stats_count_nan_inf_apart():
    x = np.array([1.0, 2.0, np.nan, np.inf, -np.inf, 3.0], "float32")
    s = tensor_stats(x, bins=4)
    assert (s.count, s.nan, s.inf) == (6, 1, 2)
    assert (s.min, s.max, s.mean) == (1.0, 3.0, 2.0)
    assert math.isclose(s.std, np.std([1.0, 2.0, 3.0]))
    assert math.isclose(s.l2, math.sqrt(14))
    assert sum(s.hist_counts) == 3 and len(s.hist_edges) == 5
    b = tensor_stats(np.arange(8, dtype="float32").astype(ml_dtypes.bfloat16))
    assert (b.min, b.max, b.count) == (0.0, 7.0, 8)
    empty = tensor_stats(np.array([np.nan], "float32"))
    assert empty.min is None and empty.hist_counts == ()
    const = tensor_stats(np.ones((3, 3), "int64"))
    assert const.std == 0.0 and sum(const.hist_counts) == 9


def test_summaries_and_chunk_sharing(tmp_path):
    store = open_store(write_run(tmp_path / "s", incomplete=400))
    seen = []
    rows = list(summarize_steps(store, lambda done, total, what: seen.append((done, total))))
    assert [r.step for r in rows] == [100, 200, 300, 400] and seen[-1] == (4, 4)
    assert [r.complete for r in rows] == [True, True, True, False]
    a, b = store.open_step(100), store.open_step(200)
    shares = chunk_sharing(b.arrays["model/embed.weight"], a.arrays["model/embed.weight"])
    assert [(c.key, c.status) for c in shares] == [("c/0/0", "changed"), ("c/1/0", "shared")]
    assert {c.status for c in chunk_sharing(b.arrays["model/frozen.table"], a.arrays["model/frozen.table"])} == {
        "shared"}
    assert {c.status for c in chunk_sharing(a.arrays["model/head.weight"], None)} == {"new"}


def test_diff_reports_progress_as_it_measures_changed_tensors(tmp_path):
    store = open_store(write_run(tmp_path / "s"))
    a, b = store.open_step(100), store.open_step(300)
    calls = []
    ours = diff(a, b, progress=lambda done, total, what: calls.append(done))
    theirs = diff(a, b, stats=True)
    assert ours.to_json() == theirs.to_json()
    assert calls == [0, 1, 2, 3, 4]


def test_a_rechunked_tensor_with_equal_values_is_unchanged(tmp_path):
    """Chunked differently in two steps, a tensor differs in every raw digest; read, its values are
    the same: unchanged, with no chunk changed, in the diff and in the measure of one tensor alike."""
    from ravex.format.reports.diff import TensorDiff, compare_tensor

    store = open_store(tmp_path / "s", create=True)
    x = np.arange(4096, dtype="float32").reshape(64, 64)
    with store.writer() as w:
        w.commit(1, {"x": x, "y": x})
        w.commit(2, {"x": x, "y": x + 1}, chunk_bytes={"x": 1024, "y": 1024})
    a, b = store.open_step(1), store.open_step(2)
    assert a.arrays["x"].chunk_shape != b.arrays["x"].chunk_shape
    manifests_only = {t.name: t for t in diff(a, b, stats=False).tensors}
    assert manifests_only["x"].status == "changed" and manifests_only["x"].chunks_changed > 0
    want = TensorDiff("x", "unchanged", 0, manifests_only["x"].chunks_total, (64, 64), "float32", 0.0, 0.0, 1.0)
    assert {t.name: t for t in diff(a, b).tensors}["x"] == want
    assert compare_tensor(a, b, manifests_only["x"]) == want
    y = compare_tensor(a, b, manifests_only["y"])  # rechunked and changed: still changed, measured
    assert y.status == "changed" and y.max_abs == 1.0


def test_validate_reports_progress_and_names_the_damaged_chunk_of_a_pack(tmp_path):
    path = write_run(tmp_path / "s")
    store = open_store(path)
    quick = validate(store)
    assert quick.ok and quick.objects_checked == 0
    corrupt_object_of(path, "model/head.weight", step=300)
    seen = []
    report = validate(open_store(path), full=True, progress=lambda d, t, w: seen.append((d, t)))
    assert not report.ok and seen[-1][0] == seen[-1][1] == report.objects_checked
    assert seen[:3] == [(0, 3), (0, 3), (1, 3)]  # the manifests of each step, then each object
    [bad] = report.findings
    # the corrupt byte lies in head.weight's chunk, though its pack holds other tensors' chunks too
    assert (bad.kind, bad.step, bad.tensor, bad.chunk) == ("hash_mismatch", 300, "model/head.weight", "c/0/0")


def test_leaves_children_and_filter(tmp_path):
    reader = open_store(write_run(tmp_path / "s")).open_step("latest")
    leaves = step_leaves(reader)
    assert [(label, n) for label, _leaf, n, _start in children(leaves)] == [
        ("data", 2), ("model", 7), ("optimizer", 4), ("rng", 1), ("scheduler", 2)]
    under = children(leaves, "optimizer/")
    assert [(label, leaf is None, start) for label, leaf, _n, start in under] == [
        ("param_groups", True, "optimizer/param_groups/"), ("state", True, "optimizer/state/")]
    many = [Leaf(f"model/layers.{i}.{k}", "tensor", "x") for i in range(40) for k in ("w", "b")]
    many.insert(0, Leaf("model/head", "tensor", "x"))
    assert [(label, n) for label, _leaf, n, _start in children(many, "model/")] == [("head", 1), ("layers.", 80)]
    assert len(children(many, "model/layers.")) == 40 and children(many, "model/layers.7.")[0][0] == "w"
    assert [leaf.name for leaf in step_leaves(reader)][:3] == ["data/epoch", "data/index", "model/embed.weight"]
    assert [leaf.name for leaf in filter_leaves(leaves, "LAYERS.1 bias")] == ["model/layers.1.attn.bias"]
    assert display_path("a%2Fb/%5F_x") == "a/b/__x"


def test_step_names_and_default_store(tmp_path):
    assert split_step("step_100") == (None, "step_100")
    assert split_step("s3://bucket/run@latest") == ("s3://bucket/run", "latest")
    assert split_step("/a/b@c/d@100") == ("/a/b@c/d", "100")
    for bad in ("yesterday", "store@", "@1x"):
        with pytest.raises(UsageError, match="step"):
            split_step(bad)
    assert default_store(str(tmp_path), {}) == (str(tmp_path / "checkpoints"), None)
    (tmp_path / "ravex.yaml").write_text("storage:\n  url: s3://b/run\n  endpoint: http://x:9000\n")
    url, opts = default_store(str(tmp_path), {"AWS_ACCESS_KEY_ID": "k"})
    assert url == "s3://b/run" and opts == {"key": "k", "client_kwargs": {"endpoint_url": "http://x:9000"}}
    assert default_store(str(tmp_path), {"RAVEX_STORAGE": "/elsewhere"}) == ("/elsewhere", None)
    (tmp_path / "ravex.yaml").write_text("storage: ./runs/../b\n")
    assert default_store(str(tmp_path), {}) == (str(tmp_path / "b"), None)
    (tmp_path / "ravex.yaml").write_text("storage: [unclosed\n")
    with pytest.raises(ConfigError, match=r"ravex\.yaml:2:1: not valid YAML: .* at 1:10\); fix the YAML at that line"):
        default_store(str(tmp_path), {})


def test_large_tensors_stream_in_blocks_with_the_same_statistics(tmp_path, monkeypatch):
    import ravex.format.reports.summary as fi

    store = open_store(tmp_path / "s", create=True)
    x = np.random.default_rng(5).standard_normal((300, 7)).astype("float32")
    x[17, 3] = np.nan
    with store.writer(chunk_bytes=1024) as w:
        w.commit(1, {"x": x})
    reader = store.open_step(1)
    whole = fi.read_tensor_stats(reader, "x", bins=10)
    monkeypatch.setattr(fi, "STATS_WHOLE_BYTES", 1000)
    monkeypatch.setattr(fi, "STATS_BLOCK_BYTES", 2000)
    calls = []
    streamed = fi.read_tensor_stats(reader, "x", bins=10, progress=lambda d, t, w: calls.append((d, t)))
    assert calls[-1] == (calls[-1][1], calls[-1][1]) and len(calls) > 4  # two passes over several blocks
    assert streamed.hist_counts == whole.hist_counts and streamed.nan == whole.nan == 1
    for field in ("min", "max", "mean", "std", "l2"):
        assert math.isclose(getattr(streamed, field), getattr(whole, field), rel_tol=1e-9)

    class Stop(Exception):
        pass

    def stop(done, total, what):
        raise Stop

    with pytest.raises(Stop):  # a caller can stop a long read between two blocks
        fi.read_tensor_stats(reader, "x", progress=stop)


def test_summaries_agree_with_the_store_on_completeness(tmp_path):
    """Header-only summaries call a step complete exactly when the store does."""
    store = open_store(write_run(tmp_path / "s", steps=(1,), incomplete=2))
    x = np.arange(6, dtype="float32")
    for rank in (0, 1):  # two ranks of one run
        with store.writer(rank=rank, world_size=2, run="two") as w:
            w.commit(3, {"x": x})
    for rank, value in ((0, x), (1, x + 1)):  # two ranks that disagree on a tensor's bytes
        with store.writer(rank=rank, world_size=2, run="bad") as w:
            w.commit(4, {"x": value})
    rows = {r.step: r for r in summarize_steps(store)}
    for step in (1, 2, 3, 4):
        info = store.step_info(step)
        assert rows[step].complete == info.complete, (step, rows[step], info)
    assert [rows[s].complete for s in (1, 2, 3, 4)] == [True, False, True, False]
