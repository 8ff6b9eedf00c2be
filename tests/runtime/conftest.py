"""Fixtures shared by the runtime tests: uninterrupted reference runs, a throwaway venv."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from . import harness

if str(harness.ROOT) not in sys.path:
    sys.path.insert(0, str(harness.ROOT))


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """The uninterrupted run *without Ravex*, per worker count: losses and final state."""
    cache: dict[int, tuple[harness.Result, dict]] = {}

    def get(workers: int) -> tuple[harness.Result, dict]:
        if workers not in cache:
            cwd = tmp_path_factory.mktemp(f"reference-w{workers}")
            out = cwd / "final.pt"
            env = harness.child_env(T_ENTRY="none", T_WORKERS=str(workers), T_OUT=str(out))
            result = harness.run([harness.PYTHON, str(harness.TRAINEE)], cwd, env)
            assert result.returncode == 0, result.stderr
            cache[workers] = (result, torch.load(out, weights_only=False))
        return cache[workers]

    return get


def make_venv(directory: Path, enable: bool = True) -> str:
    """A throwaway venv that sees our packages; ``ravex enable`` run in it if asked.

    The real venv is never enabled: ``ravex enable`` writes into the interpreter's own
    site-packages, and this interpreter's is a temporary directory.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = str(directory / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "_outer_venv.pth").write_text(f"{ours}\n{harness.ROOT}\n")
    if enable:
        out = subprocess.run([python, "-m", "ravex", "enable"], env=harness.child_env(),
                             cwd=directory, check=True, capture_output=True, text=True)
        assert purelib in out.stdout
    assert not any(
        os.path.exists(os.path.join(d, "ravex-autoload.pth"))
        for d in (ours, sysconfig.get_paths()["platlib"])
    ), "the real venv must never be enabled"
    return python


@pytest.fixture(scope="session")
def enabled_python(tmp_path_factory) -> str:
    """A session-wide throwaway venv with the autoloader installed."""
    return make_venv(tmp_path_factory.mktemp("enabled-venv"))


@pytest.fixture
def ravex_clean(monkeypatch, tmp_path):
    """No RAVEX_* variable, no stray ravex.yaml (cwd is tmp_path), and no runtime left behind."""
    import ravex

    for key in list(os.environ):
        if key.startswith("RAVEX_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    yield
    ravex.deactivate()
