"""SVG snapshots of the inspector's main screens at 80x24 (pytest-textual-snapshot).

Review a changed snapshot before accepting it (``--snapshot-update``): the report that
pytest prints on a mismatch shows both pictures side by side.
"""

from __future__ import annotations

import pytest
from conftest import settle
from stores import corrupt_object_of, write_run

from ravex.tui.app import InspectorApp

pytest.importorskip("pytest_textual_snapshot")

SIZE = (80, 24)


@pytest.fixture
def app(tmp_path, monkeypatch) -> InspectorApp:
    monkeypatch.chdir(tmp_path)
    write_run("ckpt", incomplete=400)
    return InspectorApp("ckpt")  # a relative path, so the header reads the same on every machine


def keys(*presses: str):
    async def run_before(pilot) -> None:
        await settle(pilot)
        for key in presses:
            await pilot.press(key)
            await settle(pilot)

    return run_before


def test_main_screen(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=keys())


def test_tensor_details(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=keys("tab", "down", "enter", "down", "down"))


def test_diff_mode(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=keys("d", "down"))


def test_validate_finds_corruption(snap_compare, app):
    corrupt_object_of("ckpt", "model/head.weight")
    assert snap_compare(app, terminal_size=SIZE, run_before=keys("v"))


def test_help(snap_compare, app):
    assert snap_compare(app, terminal_size=SIZE, run_before=keys("question_mark"))


def test_not_a_store(snap_compare, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    assert snap_compare(InspectorApp("logs"), terminal_size=SIZE, run_before=keys())
