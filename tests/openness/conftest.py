"""Fixtures of the openness tests: stores written by the real writer with every data type
and every kind of chunk (whole object, packed, inline), plus the committed example store.

zarr's ``StoreTests`` are ``async def``; without pytest-asyncio installed, the hook below
runs a coroutine test function to completion with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from open_helpers import write_zoo  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**args))
    return True


@pytest.fixture(scope="session")
def example_dir() -> Path:
    return _REPO / "spec" / "example"


@pytest.fixture(scope="session", params=["none", "zstd", "blosc"])
def zoo(request, tmp_path_factory):
    """(store path, step, expected {array path: numpy array}, tree) for one compression."""
    return write_zoo(tmp_path_factory.mktemp(f"zoo-{request.param}") / "store", request.param)


@pytest.fixture(scope="session")
def zoo_zstd(tmp_path_factory):
    return write_zoo(tmp_path_factory.mktemp("zoo-zstd1") / "store", "zstd")
