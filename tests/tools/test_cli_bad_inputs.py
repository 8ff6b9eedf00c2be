"""Bad inputs at the command line: every one is exit status 2 (bad usage, unreadable store) or 1
(``validate`` found damage) with one line on stderr naming the fix, never a traceback.

The rows of docs/BAD_INPUTS.md that concern ``ravex.yaml``, ``RAVEX_*`` and the CLI. A few go
through a real ``python -m ravex`` process (what a user runs); the rest call ``ravex.cli.main``
in this process, which is the same code without the interpreter start-up.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from ravex.cli import main
from ravex.errors import ConfigError
from ravex.format import open_store
from ravex.format.objects.names import manifest_key, object_key
from ravex.runtime.config import RavexConfig


@pytest.fixture
def here(tmp_path, monkeypatch):
    """cwd = a fresh directory, no RAVEX_* from the outside."""
    for name in [n for n in os.environ if n.startswith("RAVEX_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def store(tmp_path) -> Path:
    """Steps 1 and 2 of a small store: tensor ``w`` in two whole objects, ``b`` inline."""
    root = tmp_path / "st"
    s = open_store(root, create=True)
    with s.writer(chunk_bytes=256 << 10) as w:
        for step in (1, 2):
            w.commit(step, {"w": np.arange(128 << 10, dtype=np.float32) + step, "b": np.ones(8, np.float32),
                            "lr": 0.1})
    return root


def run(capsys, *args: object) -> tuple[int, str]:
    """``ravex ARGS`` in this process: (exit status, stderr); argparse's own exit counts too."""
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def edit_manifest(root: Path, step: int, edit) -> None:
    path = root / manifest_key(step, 0)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


# ---- ravex.yaml and RAVEX_* ------------------------------------------------------------------

def test_malformed_yaml_is_exit_2_in_a_real_process(cli, tmp_path):
    (tmp_path / "ravex.yaml").write_text("storage: [unclosed\nkeep_last: 3\n")
    r = cli("status")
    assert r.rc == 2, r
    assert one_line(r.err).startswith("ravex: ") and "ravex.yaml:2:10: not valid YAML: expected ',' or ']'" in r.err
    assert r.err.rstrip().endswith("; fix the YAML at that line or delete the file"), r.err
    # the inspector verbs read ravex.yaml for the default STORE through the same reader: the same
    # line, the same exit status, for every verb that falls back to the default store
    for verb in (("ls",), ("validate",), ("show", "latest"), ("gc", "--dry-run")):
        r2 = cli(*verb)
        assert (r2.rc, r2.out, r2.err) == (2, "", r.err), (verb, r2)
    # a store named on the command line does not need the file
    assert cli("ls", tmp_path / "nowhere").err.startswith("ravex ls: error: ")


@pytest.mark.parametrize("text", ["keep_last: -1\n", "storage:\n  url: ./x\n  endpont: http://h\n",
                                  "storage: [unclosed\n", "42\n"])
def test_default_store_reads_ravex_yaml_with_the_config_reader(here, capsys, text):
    """`ravex ls` (no STORE) and `ravex status` print the one ConfigError of RavexConfig.load."""
    (here / "ravex.yaml").write_text(text)
    with pytest.raises(ConfigError) as exc:
        RavexConfig.load()
    expected = f"ravex: {exc.value}\n"
    assert run(capsys, "status") == (2, expected)
    assert run(capsys, "ls") == (2, expected)
    assert run(capsys, "diff", "1", "2") == (2, expected)


def test_default_store_follows_ravex_config_and_ravex_storage(here, capsys, monkeypatch, store):
    (here / "other.yaml").write_text(f"storage:\n  path: {store}\n")
    monkeypatch.setenv("RAVEX_CONFIG", str(here / "other.yaml"))
    assert run(capsys, "validate") == (0, "")  # found through RAVEX_CONFIG: no ./ravex.yaml here
    monkeypatch.setenv("RAVEX_CONFIG", str(here / "missing.yaml"))
    rc, err = run(capsys, "ls")
    assert rc == 2 and one_line(err) == f"ravex: config file {str(here / 'missing.yaml')!r} does not exist " \
        "(named by RAVEX_CONFIG?)"
    monkeypatch.delenv("RAVEX_CONFIG")
    monkeypatch.setenv("RAVEX_STORAGE", str(store))
    assert run(capsys, "validate") == (0, "")
    monkeypatch.setenv("RAVEX_STORAGE", "")
    rc, err = run(capsys, "ls")
    assert rc == 2 and one_line(err).startswith("ravex: bad value for 'storage' in env RAVEX_STORAGE"), err


@pytest.mark.parametrize("text,message", [
    ("checkpoint_evry: 10\n", r"unknown key 'checkpoint_evry' in .*ravex.yaml; did you mean 'checkpoint_every'\?"),
    ("storage:\n  url: ./x\n  endpont: http://h\n", r"unknown key 'storage.endpont' .*did you mean 'storage.endpoint'"),
    ("keep_last: -1\n", r"bad value for 'keep_last' in .*: expected a positive integer \(or null/0 to disable\)"),
    ("compression: lz5\n", r"bad value for 'compression' .*unknown compression 'lz5'"),
    ("log_level: LOUD\n", r"bad value for 'log_level' .*expected one of \['DEBUG'"),
    ("delta: maybe\n", r"bad value for 'delta' .*expected true or false, got 'maybe'"),
    ("storage: ''\n", r"bad value for 'storage' .*expected a non-empty string"),
    ("storage: 5\n", r"bad value for 'storage' .*expected a path/URL string or a mapping"),
    ("42\n", r"expected a mapping of options, got int"),
])
def test_bad_ravex_yaml_is_one_config_error_and_exit_2(here, capsys, text, message):
    (here / "ravex.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        RavexConfig.load()
    rc, err = run(capsys, "status")
    assert rc == 2 and one_line(err).startswith("ravex: ")


@pytest.mark.parametrize("env,message", [
    ({"RAVEX_KEEP_LAST": "-3"}, r"bad value for 'keep_last' in env RAVEX_KEEP_LAST"),
    ({"RAVEX_CHECKPOINT_EVERY": "often"}, r"'checkpoint_every' in env RAVEX_CHECKPOINT_EVERY.*'often'"),
    ({"RAVEX_BACKEND": "pickle"}, r"'backend' in env RAVEX_BACKEND: expected one of \['zarr', 'torch_save'\]"),
    ({"RAVEX_CHECKPOINT_ON_SIGNAL": "SIGKILL"}, r"not a signal that can be caught"),
    ({"RAVEX_RESUME": "-1"}, r"'resume' in env RAVEX_RESUME: expected 'auto', 'never' or a step number"),
    ({"RAVEX_STORAGE_PATH_STYLE": "sideways"}, r"'storage.path_style' in env RAVEX_STORAGE_PATH_STYLE"),
    ({"RAVEX_CONFIG": "/nonexistent/ravex.yaml"}, r"config file '/nonexistent/ravex.yaml' does not exist "
                                                  r"\(named by RAVEX_CONFIG\?\)"),
])
def test_bad_env_values_are_one_config_error_and_exit_2(here, capsys, monkeypatch, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        RavexConfig.load()
    rc, err = run(capsys, "status")
    assert rc == 2 and one_line(err).startswith("ravex: ")


def test_unknown_env_variable_is_a_warning_not_an_error(cli):
    r = cli("status", env={"RAVEX_CHECKPOINT_EVRY": "10"})
    assert r.rc == 0, r
    assert "ignoring unknown environment variable RAVEX_CHECKPOINT_EVRY; did you mean 'RAVEX_CHECKPOINT_EVERY'?" \
        in r.err


# ---- stores and steps ------------------------------------------------------------------------

def test_paths_that_are_not_stores(here, capsys, store):
    (here / "plain").mkdir()
    for target, message in ((here / "plain", r"is not a Ravex store \(it has no ravex.json\); check the path"),
                            (here / "nowhere", "is not a Ravex store"),
                            (store / "ravex.json", r"ravex.json' is not a Ravex store \(it has no ravex.json\)")):
        for verb in ("ls", "validate", "gc"):
            rc, err = run(capsys, verb, target)
            assert rc == 2, (verb, target, err)
            line = one_line(err)
            assert line.startswith(f"ravex {verb}: error: ") and re.search(message, line), line


def test_future_major_version_is_exit_2_naming_the_upgrade(here, capsys, store):
    root_doc = json.loads((store / "ravex.json").read_text())
    (store / "ravex.json").write_text(json.dumps({**root_doc, "version": "2.0"}))
    for args in (("ls", store), ("validate", store), ("show", f"{store}@latest")):
        rc, err = run(capsys, *args)
        assert rc == 2 and "written with Ravex format 2.0, this reader understands 1.x only; upgrade ravex" in \
            one_line(err), (args, err)
    # a manifest from a future major: that step is unreadable, validate names it (exit 1)
    (store / "ravex.json").write_text(json.dumps(root_doc))
    edit_manifest(store, 2, lambda d: d.update(version="2.1"))
    rc, err = run(capsys, "validate", store, "--json")
    assert rc == 1
    rc, err = run(capsys, "show", f"{store}@2")
    assert rc == 2 and "format 2.1" in one_line(err)


@pytest.mark.parametrize("step", ["9" * 5000, "99999999999999999999", "-5", "1.5", "step_x", "yesterday", "", "@"])
def test_bad_step_numbers_are_exit_2(here, capsys, store, step):
    for args in (("show", f"{store}@{step}"), ("diff", f"{store}@1", f"{store}@{step}"),
                 ("export", f"{store}@{step}", "--format", "zarr", here / "out")):
        rc, err = run(capsys, *args)
        assert rc == 2, (args, err)
        assert one_line(err).startswith(f"ravex {args[0]}: error: ")
    assert not (here / "out").exists()


def test_a_5000_digit_step_in_a_real_process(cli, store):
    r = cli("show", f"{store}@{'9' * 5000}")
    assert r.rc == 2 and "is not a step" in one_line(r.err), r


@pytest.mark.parametrize("args,message", [
    (("gc", "{store}", "--grace", "nan"), r"grace_seconds=nan must be a number of seconds >= 0"),
    (("gc", "{store}", "--grace", "-5"), r"grace_seconds=-5.0 must be a number of seconds >= 0"),
    (("gc", "{store}", "--keep-last", "0"), r"argument --keep-last: 0 must be at least 1"),
    (("gc", "{store}", "--keep-every", "abc"), r"argument --keep-every: 'abc' is not a whole number"),
    (("show", "{store}@1", "--bins", "0"), r"argument --bins: 0 must be at least 1"),
    (("show", "{store}@1", "nope"), r"step 1 has no tensor 'nope'"),
    (("export", "{store}@1", "--format", "npz", "o"), r"argument --format: invalid choice: 'npz'"),
])
def test_bad_arguments_are_exit_2(here, capsys, store, args, message):
    rc, err = run(capsys, *(a.format(store=store) for a in args))
    assert rc == 2, err
    assert re.search(message, err.strip().splitlines()[-1]), err  # argparse prints its usage above
    assert "Traceback" not in err
    assert len(list((store / "objects").rglob("*"))) > 0  # nothing was collected


# ---- damaged and hostile stores --------------------------------------------------------------

@pytest.mark.parametrize("damage,kind", [
    ("flip", "hash_mismatch"), ("delete", "missing_object"), ("truncate", "size_mismatch"),
])
def test_damaged_object_is_exit_1_for_validate_and_2_for_readers(here, capsys, store, damage, kind):
    ref = open_store(store).manifest(2, 0).arrays["w"].chunks["c/1"]
    path = store / object_key(ref.object)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "delete":
        path.unlink()
    else:
        path.write_bytes(bytes(data[:-1]))
    assert main(["validate", str(store), "--full", "--json"]) == 1
    found = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["severity"] == "error"]
    assert [(f["kind"], f["step"], f["tensor"], f["chunk"]) for f in found] == [(kind, 2, "w", "c/1")]
    rc, err = run(capsys, "show", f"{store}@2", "w")
    assert rc == 2 and "step 2 tensor 'w' chunk c/1" in one_line(err), err
    rc, err = run(capsys, "export", f"{store}@2", "--format", "safetensors", here / "out.safetensors")
    assert rc == 2 and "export of step_2" in one_line(err)
    assert not (here / "out.safetensors").exists()


def test_export_zarr_of_a_bit_flipped_object_fails(here, capsys, store):
    ref = open_store(store).manifest(2, 0).arrays["w"].chunks["c/1"]
    path = store / object_key(ref.object)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    rc, err = run(capsys, "export", f"{store}@2", "--format", "zarr", here / "out")
    assert rc == 2 and "does not match its hash" in one_line(err), err
    assert not (here / "out").exists()


def test_damaged_object_findings_name_the_chunk(here, capsys, store):
    ref = open_store(store).manifest(2, 0).arrays["w"].chunks["c/1"]
    (store / object_key(ref.object)).unlink()
    main(["validate", str(store), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert not doc["ok"]
    assert [(f["kind"], f["step"], f["tensor"], f["chunk"]) for f in doc["findings"] if f["severity"] == "error"] \
        == [("missing_object", 2, "w", "c/1")]


@pytest.mark.parametrize("edit,kind,read_error", [
    (lambda d: d["arrays"]["w"]["chunks"]["c/0"].update(object="../../../etc/passwd"), "unsafe_name", "not readable"),
    (lambda d: d["arrays"].update({"/abs/w": d["arrays"].pop("w")}), "unsafe_name", "not readable"),
    (lambda d: d["arrays"]["w"]["zarr"].update(data_type="float128"), "malformed_manifest", "unknown data_type"),
    (lambda d: d["arrays"]["w"]["zarr"].update(shape=[10**12]), "malformed_manifest", "chunk entries for a grid"),
    (lambda d: d.update(metadata=[1]), "malformed_manifest", "not readable"),
])
def test_hostile_manifest_is_exit_1_for_validate_and_2_for_show(here, capsys, store, edit, kind, read_error):
    edit_manifest(store, 2, edit)
    assert main(["validate", str(store), "--json"]) == 1
    found = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["severity"] == "error"]
    assert [(f["kind"], f["step"]) for f in found] == [(kind, 2)]
    rc, err = run(capsys, "show", f"{store}@2", "w")
    assert rc == 2 and read_error in one_line(err), err
    rc, err = run(capsys, "ls", store, "--json")
    assert rc == 0  # listing never fails on one bad manifest
