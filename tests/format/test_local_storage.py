"""A local store's folders come and go under one writer: a step's folder written into (its
witness grows after it) and then removed by retention must not fail the next commit's sync, and a
late write into it (the retired step's witness) must not make the folder again: a folder holding
only a witness is an incomplete step, which the next retention of any run deletes."""

from __future__ import annotations

import pytest

from ravex.format.errors import StorageError
from ravex.format.storage.local import LocalStorage


def test_a_folder_retention_removed_after_a_write_fails_no_later_sync(tmp_path):
    storage = LocalStorage(str(tmp_path))
    storage.write("steps/15/witness-0.json", b"{}")  # the witness of a step, after its commit's sync
    storage.delete(["steps/15/witness-0.json"])  # retention removes the step
    storage.remove_empty_dir("steps/15")
    assert not (tmp_path / "steps" / "15").exists()
    storage.write("steps/30/manifest-0.json", b"{}")
    storage.sync()  # the next commit: its folders are durable, the gone one is no error
    with pytest.raises(StorageError):
        storage.write("steps/15/witness-0.json", b"{}")
    assert not (tmp_path / "steps" / "15").exists()
