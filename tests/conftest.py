"""Fixtures for every test directory."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _ravex_logger_as_found() -> Iterator[None]:
    """Give each test the ``ravex`` logger as it was before it.

    ``activate()`` gives the logger its own stderr handler and stops propagation, so a test
    using ``caplog`` after an in-process runtime test saw nothing (order-dependent failure).
    """
    log = logging.getLogger("ravex")
    handlers, propagate, level = list(log.handlers), log.propagate, log.level
    yield
    log.handlers[:] = handlers
    log.propagate, log.level = propagate, level
