"""Fixtures of the format tests. The repo root goes on sys.path so ``ravex`` imports
without an install (the child processes get it through PYTHONPATH, see fmt_helpers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from ravex.format import open_store  # noqa: E402


@pytest.fixture
def store(tmp_path):
    """A fresh local store."""
    return open_store(tmp_path / "store", create=True)
