"""The inspector driven headless through the Pilot, on stores written by the format."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest
from conftest import settle
from stores import corrupt_object_of, write_run

from ravex.format import open_store
from ravex.tui.app import InspectorApp
from ravex.tui.widgets import StepsPane, TensorTree

pytestmark = pytest.mark.timeout(120)


def aio(fn):
    """Run an async test with asyncio.run (no async pytest plugin needed)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return run


def details_text(app: InspectorApp) -> str:
    return str(app.query_one("#details-body").render())


@aio
async def test_opens_on_latest_complete_step_and_navigates(run_store):
    app = InspectorApp(str(run_store))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert [s.step for s in app.summaries] == [100, 200, 300, 400]
        assert app.step == 300  # the newest complete one, not the half-written 400
        assert "step_300" in details_text(app) and "reused" in details_text(app)
        await pilot.press("down")  # to the incomplete step: marked, no tensors, no crash
        await settle(pilot)
        assert app.step == 400 and app.query_one(TensorTree).leaves == []
        assert "incomplete" in details_text(app)
        await pilot.press("up", "up")
        await settle(pilot)
        assert app.step == 200
        groups = [str(n.label).split(" ")[0] for n in app.query_one(TensorTree).root.children]
        assert groups == ["data", "model", "optimizer", "rng", "scheduler"]
        await pilot.press("tab", "down", "enter")  # into the tree, open "model"
        await settle(pilot)
        await pilot.press("down")
        await settle(pilot)
        assert app.leaf is not None and app.leaf.name == "model/embed.weight"
        text = details_text(app)
        assert "64×32" in text and "vs step_100: 1 shared, 1 changed, 0 new" in text
        assert "L2" in text and "NaN 0 Inf 0" in text
        want = open_store(run_store).read(200)["model"]["embed.weight"]
        assert f"{want.astype('float64').max():.4g}" in text


@aio
async def test_filter_narrows_the_tree_and_escape_clears_it(run_store):
    app = InspectorApp(str(run_store))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("slash")
        await pilot.press(*"attn weight")
        await settle(pilot)
        tree = app.query_one(TensorTree)
        assert [leaf.name for leaf in tree.leaves] == ["model/layers.0.attn.weight", "model/layers.1.attn.weight"]
        await pilot.press("enter")  # keep the filter, go to the (expanded) tree
        assert tree.has_focus
        await pilot.press("down")  # past "model"
        await settle(pilot)
        assert app.leaf is not None and app.leaf.name == "model/layers.0.attn.weight"
        await pilot.press("slash", "escape")
        await settle(pilot)
        assert len(tree.leaves) == 16 and tree.has_focus


@aio
async def test_diff_previous_step_sorted_by_relative_change(run_store):
    app = InspectorApp(str(run_store))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await settle(pilot)
        assert app.mode == "diff" and app.diff_pair == (200, 300)
        names = [t.name for t in app.diff_rows]
        assert names[0] == "optimizer/state/0/exp_avg"  # from zeros: infinite relative change first
        rel = [t.rel_l2 for t in app.diff_rows[1:]]
        assert rel == sorted(rel, reverse=True) and all(r is not None and r > 0 for r in rel)
        assert "model/frozen.table" not in names
        title = str(app.query_one("#diff-title").render())
        assert "4 changed, 4 unchanged, 4 values changed" in title  # RNG state sits apart
        assert [v.name for v in app.diff_values] == [
            "data/index", "optimizer/param_groups/0/lr", "optimizer/state/0/step", "scheduler/last_epoch"]
        table = app.query_one("#diff-table")
        assert table.row_count == 8
        table.move_cursor(row=5)  # a value row: lr before and after
        await settle(pilot)
        assert "0.0005" in str(app.query_one("#diff-a").render())
        assert "0.00025" in str(app.query_one("#diff-b").render())
        table.move_cursor(row=0)
        await pilot.press("down")  # second row: its two sides, side by side
        await settle(pilot)
        assert "step_200" in str(app.query_one("#diff-a").render())
        assert "step_300" in str(app.query_one("#diff-b").render())
        await pilot.press("escape")
        assert app.mode == "details"


@aio
async def test_diff_against_a_marked_step(run_store):
    app = InspectorApp(str(run_store))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("up", "up", "m", "down", "down")
        await settle(pilot)
        await pilot.press("d")
        await settle(pilot)
        assert app.diff_pair == (100, 300)
        await pilot.press("up")  # from step_100, with nothing marked before it: no diff, a notice
        await settle(pilot)


@aio
async def test_validate_finds_a_corrupted_chunk_and_opens_its_tensor(run_store):
    corrupt_object_of(run_store, "model/head.weight", step=300)
    app = InspectorApp(str(run_store))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("v")
        await settle(pilot)
        assert app.mode == "validate" and app.validated
        bad = [f for f in app.findings if f.kind == "hash_mismatch"]
        assert len(bad) == 1 and app.findings[0] is bad[0]  # errors first
        assert "✗ 1 error:" in str(app.query_one("#validate-title").render())
        assert bad[0].tensor in open_store(run_store).open_step(bad[0].step).arrays
        await pilot.press("enter")  # open the tensor the finding names
        await settle(pilot)
        assert app.mode == "details" and app.step == bad[0].step
        assert app.leaf is not None and app.leaf.path == bad[0].tensor
        if bad[0].tensor == "model/head.weight":
            assert "cannot read" in details_text(app)  # reading it hits the corrupt bytes


@aio
async def test_help_opens_and_closes(run_store):
    app = InspectorApp(str(run_store))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        assert app.screen.__class__.__name__ == "HelpScreen"
        await pilot.press("escape")
        assert app.screen.__class__.__name__ != "HelpScreen"
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.parametrize("kind", ["missing", "not_a_store", "empty", "only_incomplete"])
@aio
async def test_bad_input_shows_a_message_not_a_traceback(tmp_path: Path, kind: str):
    path = tmp_path / "x"
    if kind == "not_a_store":
        path.mkdir()
        (path / "data.bin").write_bytes(b"\0" * 10)
    elif kind == "empty":
        open_store(path, create=True)
    elif kind == "only_incomplete":
        write_run(path, steps=(), incomplete=5)
    app = InspectorApp(str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        if kind == "only_incomplete":
            assert app.message is None and app.step == 5
            assert "incomplete" in details_text(app)
            await pilot.press("d", "v")  # nothing to diff; validation still runs
            await settle(pilot)
            assert [f.kind for f in app.findings] == ["incomplete_step"]
        else:
            assert app.message is not None
            assert ("no steps yet" if kind == "empty" else "not a Ravex store") in app.message
            await pilot.press("d", "v", "slash", "r")
            await settle(pilot)
        await pilot.press("q")
    assert app.return_code == 0


@aio
async def test_many_tensors_build_only_open_nodes(tmp_path: Path):
    import numpy as np

    store = open_store(tmp_path / "big", create=True)
    state = {"model": {f"blocks.{i}": {"w": np.full(2, i, "float32"), "b": np.zeros(1, "float32")}
                       for i in range(600)}, "step": 1}
    with store.writer() as w:
        w.commit(1, state)
        state["model"]["blocks.7"]["w"] += 1
        w.commit(2, state)
    app = InspectorApp(str(tmp_path / "big"))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        tree = app.query_one(TensorTree)
        assert len(tree.leaves) == 1201
        assert tree.root.children[0].data == "model/"
        assert all(not c.children for c in tree.root.children)  # nothing below the top built yet
        assert app.select_tensor("model/blocks.599/w")
        await settle(pilot)
        assert app.leaf is not None and app.leaf.name == "model/blocks.599/w"
        assert app.query_one(StepsPane).highlighted_step == 2
        await pilot.press("d")
        await settle(pilot)
        assert [t.name for t in app.diff_rows] == ["model/blocks.7/w"]


@aio
async def test_reload_picks_up_a_step_that_completed_meanwhile(tmp_path: Path):
    """A store being written: step 5 is half-written when the app opens, complete after `r`."""
    import numpy as np

    path = tmp_path / "live"
    store = open_store(path, create=True)
    state = {"w": np.arange(8, dtype="float32")}
    with store.writer(rank=1, world_size=2, run="live") as w:
        w.commit(5, state)
    app = InspectorApp(str(path))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.message is None and app.step == 5 and app.leaves == []
        assert "incomplete" in details_text(app)
        with store.writer(rank=0, world_size=2, run="live") as w:  # the last rank lands
            w.commit(5, state)
        await pilot.press("r")
        await settle(pilot)
        assert app.summaries[0].complete and [leaf.name for leaf in app.leaves] == ["w"]


@aio
async def test_results_for_a_step_left_behind_are_dropped(tmp_path: Path):
    """Arrowing through steps faster than they load: only the last one's tensors are shown."""
    import numpy as np

    store = open_store(tmp_path / "s", create=True)
    with store.writer() as w:
        for step in (1, 2, 3):
            w.commit(step, {"model": {f"only_in_{step}": np.full(4, step, "float32")}})
    app = InspectorApp(str(tmp_path / "s"))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert [leaf.name for leaf in app.leaves] == ["model/only_in_3"]
        await pilot.press("up", "up", "down")  # 2, 1, 2: three loads in flight, no waiting
        await settle(pilot)
        assert app.step == 2 and [leaf.name for leaf in app.leaves] == ["model/only_in_2"]
        await pilot.press("tab", "enter", "down")
        await settle(pilot)
        assert app.leaf is not None and app.leaf.name == "model/only_in_2"
        assert "step_2" in details_text(app) and "mean           2" in details_text(app)


def _blocks_store(path: Path, n: int = 600) -> Path:
    import numpy as np

    store = open_store(path, create=True)
    state = {"model": {f"blocks.{i}": {"w": np.full(2, i, "float32")} for i in range(n)}, "step": 1}
    with store.writer() as w:
        w.commit(1, state)
        state["model"]["blocks.7"]["w"] += 1
        w.commit(2, state)
    return path


@aio
async def test_no_manifest_is_parsed_in_one_call_and_the_gc_is_given_back(tmp_path: Path, monkeypatch):
    """json.loads of a whole manifest holds the GIL (0.2 s for 10,000 tensors): the UI thread waits
    that long even when a worker parses. The app parses manifests in pieces instead, to open a
    step, to diff and to validate."""
    import gc
    import json

    whole: list[int] = []
    loads = json.loads

    def spy(s, *args, **kwargs):
        b = s if isinstance(s, bytes) else s.encode()
        if b.startswith(b'{"format":"ravex-manifest"') and b'"tree":' in b:  # not a listing's header
            whole.append(len(b))
        return loads(s, *args, **kwargs)

    monkeypatch.setattr(json, "loads", spy)
    app = InspectorApp(str(_blocks_store(tmp_path / "s")))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("d")  # reads step 1 too
        await settle(pilot)
        assert [t.name for t in app.diff_rows] == ["model/blocks.7/w"]
        assert gc.get_freeze_count() > 0  # the parsed steps are out of the collector's walk
        await pilot.press("v")  # reads every manifest of the store
        await settle(pilot)
        assert app.validated and app.findings == []
    assert whole == []
    assert gc.get_freeze_count() == 0  # handed back on exit


@aio
async def test_opening_a_group_of_hundreds_scans_nothing_and_lays_out_once(tmp_path: Path, monkeypatch):
    """``model/blocks.`` opens onto 600 groups: the worker that read the step made them; the UI
    thread only adds the nodes, with one layout of the tree instead of one per node."""
    import threading

    from textual.widgets import Tree

    import ravex.tui.model
    import ravex.tui.widgets

    app = InspectorApp(str(_blocks_store(tmp_path / "s")))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        on_ui: list[str] = []
        layouts = [0]
        for module in (ravex.tui.model, ravex.tui.widgets):
            real = module.children

            def spy(leaves, *args, real=real):
                if threading.current_thread() is threading.main_thread():
                    on_ui.append(args[0] if args else "")
                return real(leaves, *args)

            monkeypatch.setattr(module, "children", spy)
        invalidate = Tree._invalidate

        def count(self):
            layouts[0] += 1
            invalidate(self)

        monkeypatch.setattr(Tree, "_invalidate", count)
        assert app.select_tensor("model/blocks.599/w")
        assert on_ui == [] and layouts[0] < 10
        await settle(pilot)
        assert app.leaf is not None and app.leaf.name == "model/blocks.599/w"
        blocks = app.query_one(TensorTree).root.children[0].children[0]
        assert str(blocks.label) == "blocks. (600)" and len(blocks.children) == 600
        assert str(blocks.children[10].label) == "10 (1)"


def test_loads_in_pieces_is_json_loads():
    import json

    from ravex.tui.manifests import loads_in_pieces

    doc = {"format": "ravex-manifest", "tree": {"a": {"b": [1, {"c": None}]}, "x": 1.5},
           "arrays": {"a/b": {"zarr": {"shape": [2]}, "chunks": {"c/0": {"raw": "ff"}}}}, "n": "é\"\\"}
    for text in (json.dumps(doc), json.dumps(doc, indent=2), json.dumps(doc, separators=(",", ":")), "{}", "[1]"):
        assert loads_in_pieces(text) == json.loads(text)
    for bad in ('{"a":1,}', '{"a" 1}', '{"a":1} x', '{"a":1', "", '{"tree":{"a":1 "b":2}}', "{1:2}"):
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            loads_in_pieces(bad)


@aio
async def test_a_diff_makes_its_rows_in_the_worker_and_fills_the_table_in_batches(run_store, monkeypatch):
    """Thousands of changed tensors: the cells are made off the UI thread and the table, which
    measures every new cell when idle, is filled a batch per turn of the event loop."""
    import threading

    import ravex.tui.app as app_module
    from ravex.tui.formatting import display_path

    on_ui: list[str] = []
    real = app_module.diff_cells

    def spy(td):
        if threading.current_thread() is threading.main_thread():
            on_ui.append(td.name)
        return real(td)

    monkeypatch.setattr(app_module, "diff_cells", spy)
    monkeypatch.setattr(app_module, "TABLE_BATCH", 3)  # 8 rows: three batches
    app = InspectorApp(str(run_store))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await settle(pilot)
        assert on_ui == []
        table = app.query_one("#diff-table")
        assert table.row_count == 8 and len(app.diff_rows) == 4
        shown = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        assert shown == [display_path(t.name) for t in app.diff_rows] + [v.name for v in app.diff_values]


@aio
async def test_a_rechunked_tensor_with_equal_values_leaves_the_diff(tmp_path: Path):
    """The manifests call a tensor chunked differently 'changed'; once read, equal values are
    unchanged, as in ``ravex diff``: the row goes and the title counts it unchanged."""
    import numpy as np

    store = open_store(tmp_path / "s", create=True)
    x = np.arange(4096, dtype="float32").reshape(64, 64)
    with store.writer() as w:
        w.commit(1, {"x": x, "y": x})
        w.commit(2, {"x": x, "y": x + 1}, chunk_bytes={"x": 1024})
    app = InspectorApp(str(tmp_path / "s"))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("d")
        await settle(pilot)
        assert [t.name for t in app.diff_rows] == ["y"]
        assert "1 changed, 1 unchanged" in str(app.query_one("#diff-title").render())
