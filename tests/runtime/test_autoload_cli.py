"""``ravex enable``/``disable``/``status`` and the .pth autoloader, in throwaway venvs."""

from __future__ import annotations

import json
import subprocess

import pytest

from . import harness
from .conftest import make_venv

PROBE = (
    "import sys; mods = set(sys.modules); "
    "print('torch' in mods, any(m == 'ravex' or m.startswith('ravex.') for m in mods), "
    "any(type(f).__name__ == 'TorchImportHook' for f in sys.meta_path))"
)


def _py(python: str, code: str, cwd, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", code], cwd=cwd, env=harness.child_env(**env),
                          capture_output=True, text=True, timeout=120)


def test_autoloader_imports_nothing_at_start_and_waits_for_torch(enabled_python, tmp_path):
    (tmp_path / "ravex.yaml").write_text("storage: ./ck\n")
    assert _py(enabled_python, PROBE, tmp_path).stdout.split() == ["False", "False", "True"]
    # it imports no module at all beyond its own (RAVEX_DISABLE stops it after the check)
    code = "import sys; print(sorted(sys.modules))"
    with_hook = set(eval(_py(enabled_python, code, tmp_path).stdout))
    without = set(eval(_py(enabled_python, code, tmp_path, RAVEX_DISABLE="1").stdout))
    assert "_ravex_autoload" in without and with_hook == without
    # and once torch is imported, Ravex is active
    out = _py(enabled_python, "import torch, ravex; print(ravex.is_active())", tmp_path)
    assert out.stdout.strip() == "True", out.stderr


def test_autoloader_does_nothing_without_a_ravex_yaml(enabled_python, tmp_path):
    assert _py(enabled_python, PROBE, tmp_path).stdout.split() == ["False", "False", "False"]
    out = _py(enabled_python, "import sys, torch; print('ravex' in sys.modules)", tmp_path)
    assert out.stdout.strip() == "False"


def test_ravex_config_env_names_the_file(enabled_python, tmp_path):
    elsewhere = tmp_path / "conf"
    elsewhere.mkdir()
    (elsewhere / "train.yaml").write_text(f"storage: {tmp_path / 'ck'}\n")
    out = _py(enabled_python, "import torch, ravex; print(ravex.status()['storage'])", tmp_path,
              RAVEX_CONFIG=str(elsewhere / "train.yaml"))
    assert out.stdout.strip() == str(tmp_path / "ck"), out.stderr


def test_bad_config_under_the_autoloader_is_one_line_and_exit_2(enabled_python, tmp_path):
    (tmp_path / "ravex.yaml").write_text("checkpoint_evry: 5\n")
    out = _py(enabled_python, "import torch", tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "'checkpoint_evry'" in out.stderr and "ravex.yaml" in out.stderr
    assert "did you mean 'checkpoint_every'" in out.stderr


def test_torchruns_launcher_starts_no_runtime_only_its_ranks_do(enabled_python, tmp_path):
    """torchrun's launcher imports torch but trains nothing. A runtime there found the ranks'
    steps, restored none, said so at exit and, exiting last, replaced rank 0's record of the run
    (``ravex status``) with its own: the record must be the rank's."""
    (tmp_path / "ravex.yaml").write_text("storage: ./ck\n")
    (tmp_path / "rank.py").write_text(
        "import os, torch, ravex; print('RANK', os.getpid(), ravex.is_active(), flush=True)\n")
    done = subprocess.run([enabled_python, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=1", "rank.py"], cwd=tmp_path, env=harness.child_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [(pid, active)] = [tuple(line.split()[1:]) for line in done.stdout.splitlines() if line.startswith("RANK ")]
    assert active == "True"
    [record] = (tmp_path / ".ravex").glob("last-run-*.json")
    assert json.loads(record.read_text())["pid"] == int(pid), done.stderr
    assert "never started" not in done.stderr  # the launcher, which trains nothing, says nothing


def test_enable_disable_and_status(tmp_path):
    python = make_venv(tmp_path / "venv", enable=False)
    work = tmp_path / "work"
    work.mkdir()
    (work / "ravex.yaml").write_text("storage: ./ck\ncheckpoint_every: 7\n")

    def ravex_cli(*args: str, **env: str) -> str:
        done = subprocess.run([python, "-m", "ravex", *args], cwd=work, env=harness.child_env(**env),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    status = ravex_cli("status", RAVEX_KEEP_LAST="4")
    assert "ravex 0.1.0" in status and "autoloader: not enabled" in status
    assert "checkpoint_every" in status and f"[{work / 'ravex.yaml'}]" in status
    assert "[env RAVEX_KEEP_LAST]" in status and "[default]" in status
    assert "latest step: none" in status

    assert "autoloader installed" in ravex_cli("enable")
    assert "autoloader: enabled" in ravex_cli("status")
    train = "import torch, ravex; w = torch.nn.Linear(2, 1); o = torch.optim.SGD(w.parameters(), 0.1)\n" \
            "for _ in range(7):\n    w(torch.ones(2)).sum().backward(); o.step()\n"
    out = _py(python, train, work)
    assert out.returncode == 0 and "checkpoint step 7" in out.stderr, out.stderr
    assert "never started" not in out.stderr
    assert "latest step: 7" in ravex_cli("status")

    assert "removed" in ravex_cli("disable")
    assert "autoloader: not enabled" in ravex_cli("status")
    assert _py(python, PROBE, work).stdout.split() == ["False", "False", "False"]


@pytest.mark.parametrize("verb", ["enable", "disable"])
def test_site_dir_option(tmp_path, verb):
    site = tmp_path / "site"
    done = subprocess.run([harness.PYTHON, "-m", "ravex", "enable", "--site-dir", str(site)],
                          env=harness.child_env(), capture_output=True, text=True, check=True)
    assert (site / "ravex-autoload.pth").exists(), done.stdout
    if verb == "disable":
        subprocess.run([harness.PYTHON, "-m", "ravex", "disable", "--site-dir", str(site)],
                       env=harness.child_env(), check=True, capture_output=True)
        assert not (site / "ravex-autoload.pth").exists()


def test_a_pth_line_naming_a_moved_autoloader_is_harmless(tmp_path):
    """A line that ``ravex enable`` wrote before the autoloader moved (``ravex/_autoload.py``)
    still runs at every interpreter start: it must do nothing, and say nothing."""
    import sys

    from ravex.runtime.autoload import PTH_NAME, pth_line, source_file

    site_dir = tmp_path / "site"
    site_dir.mkdir()
    moved = source_file().replace("runtime/autoload.py", "_autoload.py")
    (site_dir / PTH_NAME).write_text(pth_line(moved))
    (tmp_path / "ravex.yaml").write_text("storage: ./ck\n")
    code = (f"import site, sys; site.addsitedir({str(site_dir)!r}); "
            "print('_ravex_autoload' in sys.modules, any(m.startswith('ravex') for m in sys.modules))")
    done = _py(sys.executable, code, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split() == ["False", "False"]
