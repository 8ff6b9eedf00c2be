"""The files a script appends to (``ravex.runtime.state.appended``): a resume cuts each back to
its size at the checkpoint, and leaves, naming it, one it cannot (smaller now, or replaced)."""

from __future__ import annotations

import logging
import os

from ravex.runtime.state.appended import AppendedFiles


def _noted(files: AppendedFiles, path, mode: str = "a"):
    handle = open(path, mode)
    files.opened(path, mode, handle)
    return handle


def test_capture_counts_buffered_bytes_and_the_resume_cuts_what_came_after(tmp_path, caplog, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file under the working folder is named relative to it
    files = AppendedFiles()
    log = _noted(files, tmp_path / "train.log")
    log.write("step 1\n")  # still in the file object's buffer
    saved = files.capture()
    assert saved == [{"path": str(tmp_path / "train.log"), "size": 7,
                      "inode": os.stat(tmp_path / "train.log").st_ino}]
    log.write("step 2\n")
    log.close()
    with caplog.at_level(logging.WARNING, logger="ravex"):
        AppendedFiles().rewind(saved, 1)
    assert (tmp_path / "train.log").read_text() == "step 1\n"
    assert [r.getMessage() for r in caplog.records] == [
        "ravex: cut back to their size at step 1, since the steps after it run again and append once more: "
        "train.log (7 bytes)"]


def test_files_opened_to_write_or_read_are_not_noted(tmp_path):
    files = AppendedFiles()
    for mode in ("w", "r", "wb", "r+"):
        _noted(files, tmp_path / "model.pt", mode).close()
    assert files.capture() == []


def test_a_smaller_or_replaced_file_is_left_as_it_is_and_named(tmp_path, caplog):
    files = AppendedFiles()
    for name in ("shrunk.csv", "replaced.csv", "same.csv"):
        with _noted(files, tmp_path / name) as f:
            f.write("0,1.0\n1,0.5\n")
    saved = files.capture()
    (tmp_path / "shrunk.csv").write_text("0\n")
    os.replace(tmp_path / "same.csv", tmp_path / "kept.csv")  # the file by that name is another now
    (tmp_path / "new.csv").write_text("0,1.0\n1,0.5\n2,0.25\n")
    os.replace(tmp_path / "new.csv", tmp_path / "replaced.csv")  # made while the old one was there
    (tmp_path / "same.csv").write_text("0,1.0\n1,0.5\n2,0.25\n")
    with caplog.at_level(logging.WARNING, logger="ravex"):
        AppendedFiles().rewind(saved, 3)
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith("ravex: not cut back to their size at step 3") and "shrunk.csv (2 bytes, 12" in said
    assert "replaced.csv (another file by that name now)" in said and "same.csv (another" in said
    assert (tmp_path / "replaced.csv").read_text().endswith("2,0.25\n")


def test_the_noting_open_pickles_as_the_builtin_it_wraps(ravex_clean, tmp_path):
    """A script's objects that hold ``open`` (a DataLoader worker's dataset, a ``functools.partial``)
    pickle as before while the runtime is active: by the name ``io.open``."""
    import functools
    import pickle

    import ravex

    ravex.activate(storage=str(tmp_path / "ck"), checkpoint_every=10**6, checkpoint_on_exit=False)
    assert hasattr(open, "__wrapped__")  # the builtin is the runtime's wrapper now
    assert pickle.loads(pickle.dumps(open)) is open
    assert pickle.loads(pickle.dumps(functools.partial(open, "data.bin", "rb"))).func is open
