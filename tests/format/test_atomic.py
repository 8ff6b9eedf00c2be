"""ravex.format.storage.atomic: the one temp-file-then-rename writer every local file goes through.

A target is the old file or the new one, never a mix; a failed write leaves no temp file.
"""

from __future__ import annotations

import os

import pytest

from ravex.format.storage import atomic_directory, atomic_file, atomic_write


class Boom(Exception):
    pass


def _names(folder) -> list[str]:
    return sorted(os.listdir(folder))


def test_atomic_write_replaces_whole(tmp_path):
    target = tmp_path / "f"
    atomic_write(target, b"old")
    atomic_write(target, memoryview(b"new bytes"))
    assert target.read_bytes() == b"new bytes"
    assert _names(tmp_path) == ["f"]


def test_atomic_file_streams_and_keeps_the_old_file_on_error(tmp_path):
    target = tmp_path / "f"
    with atomic_file(target) as f:
        f.write(b"first ")
        f.write(bytearray(b"second"))
    assert target.read_bytes() == b"first second"
    with pytest.raises(Boom), atomic_file(target) as f:
        f.write(b"half")
        assert target.read_bytes() == b"first second"  # nothing visible while writing
        raise Boom
    assert target.read_bytes() == b"first second"
    assert _names(tmp_path) == ["f"]


def test_atomic_directory_appears_whole_or_not_at_all(tmp_path):
    dest = tmp_path / "d"
    with pytest.raises(Boom), atomic_directory(dest) as tmp:
        os.makedirs(os.path.join(tmp, "a"))
        (tmp_path / os.path.basename(tmp) / "a" / "x").write_bytes(b"1")
        raise Boom
    assert _names(tmp_path) == []
    with atomic_directory(dest) as tmp:
        os.makedirs(os.path.join(tmp, "a"))
        with open(os.path.join(tmp, "a", "x"), "wb") as f:
            f.write(b"1")
        assert not dest.exists()
    assert (dest / "a" / "x").read_bytes() == b"1"
    assert _names(tmp_path) == ["d"]
