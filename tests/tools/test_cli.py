"""The inspector verbs through real subprocesses, on stores written by the format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from stores import corrupt_object_of, write_run

from ravex.format import open_store
from ravex.format.objects.hashing import digest
from ravex.format.objects.names import object_key


def test_ls_json_lists_steps_bytes_and_incomplete(cli, run_store):
    r = cli("ls", run_store, "--json")
    assert r.rc == 0, r
    doc = r.json()
    steps = {s["step"]: s for s in doc["steps"]}
    assert sorted(steps) == [100, 200, 300, 400]
    assert [steps[s]["complete"] for s in (100, 200, 300, 400)] == [True, True, True, False]
    assert "missing manifests of ranks [1]" in steps[400]["problem"]
    first, second = steps[100], steps[200]
    assert first["tensors"] == second["tensors"] == 9
    assert first["reused_bytes"] == 0 and first["new_bytes"] > 0
    # the frozen table and the untouched layers are reused: step 200 writes much less than step 100
    assert 0 < second["new_bytes"] < first["new_bytes"]
    assert second["reuse_ratio"] == second["reused_bytes"] / second["logical_bytes"]
    assert first["created_at"].startswith("20")


def test_ls_table_for_humans_marks_incomplete_steps(cli, run_store):
    r = cli("ls", run_store)
    assert r.rc == 0, r
    assert "step_100" in r.out and "step_300" in r.out
    assert "incomplete: missing manifests of ranks [1]" in r.out
    assert r.err == ""  # no progress bar when stderr is not a terminal


def test_ls_table_has_no_empty_column(cli, tmp_path):
    """Every column of the table holds something: the problem column only when a step has a problem."""
    r = cli("ls", write_run(tmp_path / "all-complete"))
    assert r.rc == 0, r
    rows = [line for line in r.out.splitlines() if "step_" in line]
    assert len(rows) == 3, r.out
    for line in rows:
        cells = line.split("│")[1:-1]
        assert len(cells) == 8 and all(c.strip() for c in cells), line
    assert "problem" not in r.out


def test_diff_of_a_rechunked_tensor_with_equal_values_lists_it_unchanged(cli, tmp_path):
    store = open_store(tmp_path / "s", create=True)
    x = np.arange(4096, dtype="float32").reshape(64, 64)
    with store.writer() as w:
        w.commit(1, {"x": x, "y": x})
        w.commit(2, {"x": x, "y": x + 1}, chunk_bytes={"x": 1024})
    r = cli("diff", f"{tmp_path / 's'}@1", "2", "--json")
    assert r.rc == 0, r
    assert [t["name"] for t in r.json()["tensors"]] == ["y"] and r.json()["summary"] == {"changed": 1, "unchanged": 1}
    x_row = next(t for t in cli("diff", f"{tmp_path / 's'}@1", "2", "--json", "--all").json()["tensors"]
                 if t["name"] == "x")
    assert (x_row["status"], x_row["chunks_changed"], x_row["max_abs"]) == ("unchanged", 0, 0.0)


def test_store_defaults_to_ravex_yaml_then_env(cli, tmp_path):
    write_run(tmp_path / "runs" / "a", steps=(1, 2))
    write_run(tmp_path / "runs" / "b", steps=(7,))
    (tmp_path / "ravex.yaml").write_text("storage: runs/a\nkeep_last: 3\n")
    r = cli("ls", "--json")
    assert r.rc == 0, r
    assert [s["step"] for s in r.json()["steps"]] == [1, 2]
    r = cli("ls", "--json", env={"RAVEX_STORAGE": str(tmp_path / "runs" / "b")})
    assert [s["step"] for s in r.json()["steps"]] == [7]
    # `ravex diff step_1 step_2` works from the training directory as is
    r = cli("diff", "step_1", "latest", "--json")
    assert r.rc == 0, r
    assert r.json()["a"].endswith("@1") and r.json()["b"].endswith("@2")


def test_default_store_missing_is_exit_2_with_the_fix(cli, tmp_path):
    r = cli("ls")
    assert r.rc == 2
    assert r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r
    assert "checkpoints" in lines[0] and "not a Ravex store" in lines[0] and "ravex.yaml" in lines[0]


def test_bad_store_and_bad_step_are_exit_2_one_line(cli, run_store, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    r = cli("show", f"{run_store}@400")  # through a real process once, then in this one (faster)
    assert r.rc == 2 and len(r.err.strip().splitlines()) == 1, r
    assert "not readable" in r.err and "complete steps: [100, 200, 300]" in r.err
    r = cli("gc", run_store, "--keep-last", "0")
    assert r.rc == 2 and "must be at least 1" in r.err

    from ravex.cli import main

    for args in (("validate", tmp_path / "empty"), ("show", f"{run_store}@step_999"),
                 ("show", "yesterday"), ("diff", f"{run_store}@100", "x@y"), ("ls", tmp_path / "nowhere")):
        assert main([str(a) for a in args]) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith(f"ravex {args[0]}: error: "), (args, err)


def test_show_tree_lists_tensors_and_values(cli, run_store):
    r = cli("show", f"{run_store}@latest", "--json")
    assert r.rc == 0, r
    doc = r.json()
    assert doc["step"] == 300
    names = {t["name"]: t for t in doc["tensors"]}
    assert names["model/embed.weight"]["shape"] == [64, 32]
    assert names["model/embed.weight"]["dtype"] == "float32"
    assert names["model/embed.weight"]["chunks"] == 2
    assert names["model/embed.weight"]["logical_bytes"] == 64 * 32 * 4
    assert doc["values"]["optimizer/param_groups/0/lr"] == 0.00025
    r = cli("show", f"{run_store}@300")
    assert r.rc == 0, r
    assert "layers.1.attn.weight" in r.out and "last_epoch" in r.out


def test_show_tensor_statistics_match_numpy(cli, run_store):
    r = cli("show", f"{run_store}@200", "model/head.weight", "--json", "--bins", "8")
    assert r.rc == 0, r
    [t] = r.json()["tensors"]
    want = open_store(run_store).read(200)["model"]["head.weight"].astype(np.float64)
    s = t["stats"]
    assert s["count"] == want.size and s["nan"] == 0 and s["inf"] == 0
    assert math.isclose(s["min"], want.min()) and math.isclose(s["max"], want.max())
    assert math.isclose(s["mean"], want.mean(), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(s["std"], want.std(), rel_tol=1e-6)
    assert math.isclose(s["l2"], np.linalg.norm(want), rel_tol=1e-9)
    assert len(s["hist_counts"]) == 8 and sum(s["hist_counts"]) == want.size
    r = cli("show", f"{run_store}@200", "model/head.weight", "optimizer/param_groups/0/lr")
    assert r.rc == 0 and "NaN / Inf" in r.out and "█" in r.out and "lr = 0.0005" in r.out
    r = cli("show", f"{run_store}@200", "model/head.wieght")
    assert r.rc == 2 and "did you mean model/head.weight" in r.err


def test_diff_sorted_by_relative_change_with_values(cli, run_store):
    r = cli("diff", f"{run_store}@100", f"{run_store}@200", "--json")
    assert r.rc == 0, r
    doc = r.json()
    changed = [t for t in doc["tensors"] if t["status"] == "changed"]
    assert {t["name"] for t in changed} == {
        "optimizer/state/0/exp_avg", "model/head.weight", "model/layers.1.attn.weight", "model/embed.weight"}
    rel = [t["rel_l2"] for t in changed]
    assert rel[0] == "inf"  # exp_avg starts at zero: any change is infinitely large relative to it
    assert rel[1:] == sorted(rel[1:], reverse=True)
    head = next(t for t in changed if t["name"] == "model/head.weight")
    a, b = (open_store(run_store).read(s)["model"]["head.weight"].astype(np.float64) for s in (100, 200))
    assert math.isclose(head["max_abs"], np.abs(b - a).max())
    assert math.isclose(head["rel_l2"], np.linalg.norm(b - a) / np.linalg.norm(a))
    embed = next(t for t in changed if t["name"] == "model/embed.weight")
    assert embed["chunks_changed"] == 1 and embed["chunks_total"] == 2
    assert "model/frozen.table" not in {t["name"] for t in doc["tensors"]}  # unchanged hidden without --all
    assert doc["summary"] == {"changed": 4, "unchanged": 4}  # training tensors: RNG state sits apart
    assert doc["bookkeeping"] == [] and "rng/numpy" not in {t["name"] for t in doc["tensors"]}
    r = cli("diff", f"{run_store}@100", f"{run_store}@200", "--json", "--all")
    assert [(t["name"], t["status"]) for t in r.json()["bookkeeping"]] == [("rng/numpy", "unchanged")]
    values = {v["name"]: v for v in doc["values"]}
    assert values["optimizer/param_groups/0/lr"] == {"name": "optimizer/param_groups/0/lr", "status": "changed",
                                                     "a": 0.001, "b": 0.0005}
    r = cli("diff", f"{run_store}@100", f"{run_store}@200", "--threshold", "0.01", "--json")
    assert {t["name"] for t in r.json()["tensors"]} == {"optimizer/state/0/exp_avg", "model/head.weight"}
    r = cli("diff", f"{run_store}@100", f"{run_store}@200")
    assert r.rc == 0 and "model/head.weight" in r.out and "lr" in r.out


def test_diff_across_two_stores(cli, tmp_path):
    a = write_run(tmp_path / "a", steps=(1,), seed=1)
    b = write_run(tmp_path / "b", steps=(1,), seed=2)
    r = cli("diff", f"{a}@latest", f"{b}@step_1", "--json", "--all")
    assert r.rc == 0, r
    statuses = {t["name"]: t["status"] for t in r.json()["tensors"]}
    assert statuses["model/head.weight"] == "changed"
    assert statuses["model/layers.0.attn.bias"] == "unchanged"  # zeros in both runs


def test_diff_with_the_store_apart_names_the_form_it_takes(cli, run_store):
    r = cli("diff", run_store, "100", "200")
    assert r.rc == 2 and "unrecognized" not in r.err, r
    assert f"a store goes into A ({run_store}@100 200)" in r.err and len(r.err.strip().splitlines()) == 1, r
    assert cli("diff", f"{run_store}@100", "200").rc == 0


def test_validate_ok_and_json(cli, run_store):
    r = cli("validate", run_store, "--full", "--json")
    assert r.rc == 0, r
    doc = r.json()
    assert doc["ok"] is True and doc["steps_checked"] == [100, 200, 300, 400]
    assert doc["objects_checked"] > 0
    assert [f["kind"] for f in doc["findings"]] == ["incomplete_step"]
    r = cli("validate", run_store)
    assert r.rc == 0 and "ok" in r.out and "incomplete_step" in r.out


def test_validate_full_finds_a_corrupted_object_and_names_the_tensor(cli, run_store):
    corrupt_object_of(run_store, "model/frozen.table")
    r = cli("validate", run_store, "--full", "--json")
    assert r.rc == 1, r
    doc = r.json()
    assert doc["ok"] is False
    [bad] = [f for f in doc["findings"] if f["kind"] == "hash_mismatch"]
    assert bad["severity"] == "error"
    # the pack holding frozen.table's chunk may hold others: the finding names one of its tensors
    step = open_store(run_store).open_step(bad["step"])
    assert bad["tensor"] in step.arrays and bad["chunk"].startswith("c/")
    r = cli("validate", run_store, "--full")
    assert r.rc == 1 and "hash_mismatch" in r.out and bad["tensor"] in r.out


def test_gc_dry_run_then_keep_last(cli, run_store):
    r = cli("gc", run_store, "--keep-last", "1", "--dry-run", "--json")
    assert r.rc == 0, r
    doc = r.json()
    assert doc["dry_run"] is True and doc["deleted_steps"] == [100, 200]
    assert open_store(run_store).complete_steps() == [100, 200, 300]
    r = cli("gc", run_store, "--keep-last", "1", "--grace", "0")
    assert r.rc == 0, r
    assert "deleted 3 steps (step_100, step_200, step_400)" in r.out  # grace 0: the half-written step too
    store = open_store(run_store)
    assert store.complete_steps() == [300]
    assert store.read("latest")["model"]["frozen.table"].shape == (128, 32)
    r = cli("validate", run_store, "--full", "--json")
    assert r.rc == 0 and r.json()["ok"], r


def test_verbs_import_neither_torch_nor_textual(tmp_path, run_store):
    import subprocess
    import sys

    from conftest import ROOT

    s = str(run_store)
    code = (
        "import sys, contextlib, io\n"
        "from ravex.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    for argv in (['ls', {s!r}], ['diff', {s + '@100'!r}, {s + '@200'!r}],\n"
        f"                 ['validate', {s!r}], ['show', {s + '@latest'!r}, 'model/head.weight']):\n"
        "        assert main(argv) == 0, argv\n"
        "heavy = sorted(m for m in ('torch', 'textual') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_export_safetensors_and_zarr(cli, run_store, tmp_path):
    from safetensors.numpy import load_file

    want = open_store(run_store).read(200)
    out = tmp_path / "out.safetensors"
    r = cli("export", f"{run_store}@200", "--format", "safetensors", out)
    assert r.rc == 0, r
    got = load_file(str(out))
    np.testing.assert_array_equal(got["model.head.weight"], want["model"]["head.weight"])
    r = cli("export", f"{run_store}@200", "--format", "zarr", tmp_path / "out.zarr", "--json")
    assert r.rc == 0, r
    assert json.loads((Path(tmp_path / "out.zarr") / "zarr.json").read_text())["node_type"] == "group"
    r = cli("export", f"{run_store}@200", "--format", "zarr", tmp_path / "out.zarr")
    assert r.rc == 2 and "already exists" in r.err, r


def test_export_pt_loads_with_weights_only(cli, run_store, tmp_path):
    torch = __import__("pytest").importorskip("torch")
    out = tmp_path / "step.pt"
    r = cli("export", f"{run_store}@latest", "--format", "pt", out)
    assert r.rc == 0, r
    state = torch.load(out, weights_only=True)
    want = open_store(run_store).read(300)
    np.testing.assert_array_equal(state["model"]["embed.weight"].numpy(), want["model"]["embed.weight"])
    assert state["optimizer"]["param_groups"][0]["lr"] == want["optimizer"]["param_groups"][0]["lr"]


def test_on_a_store_written_by_a_real_training_run(cli, tmp_path):
    """examples/train_demo.py with Ravex active, then the verbs from its directory, as a user would."""
    import subprocess
    import sys

    from conftest import ROOT

    __import__("pytest").importorskip("torch")
    (tmp_path / "ravex.yaml").write_text("storage: ./checkpoints\ncheckpoint_every: 10\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RAVEX_")}
    env["PYTHONPATH"] = str(ROOT)
    train = subprocess.run([sys.executable, str(ROOT / "examples" / "train_demo.py"), "--activate", "--epochs", "1"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr[-2000:]
    steps = cli("ls", "--json").json()["steps"]
    assert [s["step"] for s in steps] == [10, 16] and all(s["complete"] for s in steps)
    d = cli("diff", "step_10", "latest", "--json").json()
    changed = {t["name"] for t in d["tensors"] if t["status"] == "changed"}
    assert "models/0/state/head.2.weight" in changed
    assert all(t["rel_l2"] != "inf" for t in d["tensors"] if t["name"].startswith("models/"))
    show = cli("show", "latest", "models/0/state/head.2.weight", "--json").json()
    assert show["tensors"][0]["shape"] == [10, 512] and show["tensors"][0]["stats"]["nan"] == 0
    r = cli("validate", "--full")
    assert r.rc == 0 and "ok" in r.out, r


def test_verbs_and_inspector_on_an_fsspec_url(capsys):
    """A store behind an fsspec URL (memory://, in this process) reads like a local one."""
    import asyncio

    from conftest import settle
    from stores import training_state

    from ravex.cli import main
    from ravex.tui.app import InspectorApp

    url = "memory://tools-test/run"
    store = open_store(url, create=True)
    state = training_state(np.random.default_rng(3))
    with store.writer() as w:
        w.commit(1, state)
        state["model"]["head.weight"] += 1
        w.commit(2, state)
    assert main(["ls", url, "--json"]) == 0
    assert [s["step"] for s in json.loads(capsys.readouterr().out)["steps"]] == [1, 2]
    assert main(["diff", f"{url}@1", f"{url}@2", "--json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)["tensors"]] == ["model/head.weight"]
    assert main(["validate", url, "--full", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True

    async def browse() -> None:
        app = InspectorApp(url)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            assert app.step == 2 and len(app.leaves) == 16
            await pilot.press("d")
            await settle(pilot)
            assert [t.name for t in app.diff_rows] == ["model/head.weight"]

    asyncio.run(browse())


def test_inspect_verb_opens_the_app_on_the_named_or_default_store(tmp_path, monkeypatch):
    from ravex.cli import main
    from ravex.tui.app import InspectorApp

    opened = []
    monkeypatch.setattr(InspectorApp, "run", lambda self: opened.append((self.url, self.storage_options)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAVEX_STORAGE", raising=False)
    monkeypatch.delenv("RAVEX_CONFIG", raising=False)
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\n")
    assert main(["inspect"]) == 0
    assert main(["inspect", "other"]) == 0
    assert opened == [(str(tmp_path / "ckpt"), None), (str(tmp_path / "other"), None)]


def test_validate_folds_many_orphan_objects_into_one_row_and_json_lists_each(cli, run_store):
    store = open_store(run_store)
    blobs = [f"garbage {i}".encode() * 50 for i in range(5)]
    for blob in blobs:
        store.storage.write(object_key(digest(blob)), blob)
    r = cli("validate", run_store)
    assert r.rc == 0, r
    assert "5 objects are named by no manifest" in r.out and "incomplete_step" in r.out
    assert not [d for d in map(digest, blobs) if d in r.out]  # no row of its own
    assert "(4 steps; 6 warnings, 5 of them orphan objects)" in r.out
    orphans = [f for f in cli("validate", run_store, "--json").json()["findings"] if f["kind"] == "orphan_object"]
    assert sorted(f["object"] for f in orphans) == sorted(map(digest, blobs))


def test_each_verb_says_a_whole_sentence_in_the_verb_list_and_its_whole_first_paragraph_in_its_help():
    from ravex.cli import VERBS, build_parser

    listed = build_parser().format_help()
    for verb in VERBS:
        assert verb.help.endswith((".", ")")), (verb.name, verb.help)  # a docstring's line cut mid-sentence
        assert " ".join(verb.help.split()) in " ".join(listed.split()), verb.name
    validate = next(v for v in VERBS if v.name == "validate")
    assert validate.description.endswith("what crashes leave and GC collects).")
