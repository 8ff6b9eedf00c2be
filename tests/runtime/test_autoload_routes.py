"""Every way torch arrives under ``ravex enable``, in real processes: each run is SIGKILLed
once its checkpoint of step 10 is written, and the rerun resumes from it. And the exit net: a
process that trains where Ravex did not start says so, once, and no other process does."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from . import harness

#: the training, after torch has arrived by the route under test. It prints each step as Ravex
#: counts it; told to (``T_BLOCK``), it waits at step 11 for the write of step 10's checkpoint
#: (taken when the loop comes round after step 10) and blocks for the kill. Without Ravex the
#: count stays 0: the run ends without ``FLUSHED``.
TRAIN = """
import os
import sys
import ravex

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(14):
    model(torch.ones(4)).sum().backward()
    opt.step()
    opt.zero_grad()
    print("STEP", ravex.step(), flush=True)
    if ravex.step() == 11 and os.environ.get("T_BLOCK"):
        ravex.flush()
        print("FLUSHED", flush=True)
        sys.stdin.read()
"""

PROBES = "import importlib.util\nfor _ in range(3):\n    assert importlib.util.find_spec('torch') is not None\n"


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


#: route -> (the files, the command after the interpreter)
ROUTES: dict[str, tuple[dict[str, str], list[str]]] = {
    # what `datasets` and `transformers` do at import, several times over, before `import torch`
    "find_spec probes": ({"train.py": PROBES + "import torch\n" + TRAIN}, ["train.py"]),
    "importlib.import_module": (
        {"train.py": "import importlib\ntorch = importlib.import_module('torch')\n" + TRAIN}, ["train.py"]),
    # a library that probes (like `datasets`), then one that imports torch for the script
    "imported by a library": ({"probing_lib.py": PROBES, "torch_lib.py": "import torch\n",
                               "train.py": "import probing_lib\nfrom torch_lib import torch\n" + TRAIN},
                              ["train.py"]),
    "python -m package": ({"pkg/__init__.py": "", "pkg/__main__.py": "import torch\n" + TRAIN},
                          ["-m", "pkg"]),
    # a notebook kernel: cells are compiled and executed, and there is no main file
    "exec, no main file": ({"cell.py": "import torch\n" + TRAIN},
                           ["-c", "exec(compile(open('cell.py').read(), '<cell>', 'exec'))"]),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_zero_code_starts_however_torch_arrives(enabled_python, tmp_path, route):
    files, args = ROUTES[route]
    _write(tmp_path, {**files, "ravex.yaml": "storage: ./ck\ncheckpoint_every: 5\n"})
    argv = [enabled_python, *args]

    first = harness.run(argv, tmp_path, harness.child_env(T_BLOCK="1"), kill_on="^FLUSHED")
    assert first.stdout[-1:] == ["FLUSHED"] and first.returncode == -9, first.explain()

    rerun = harness.run(argv, tmp_path, harness.child_env())
    assert rerun.returncode == 0 and rerun.resumed_from == 10, rerun.explain()
    assert rerun.stdout[0] == "STEP 11", rerun.explain()
    assert "never started" not in first.stderr + rerun.stderr


#: torch found by a finder put ahead of the autoloader's: the one route Ravex cannot see
AHEAD = """
import importlib.machinery
import sys


class Ahead:
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, path) if name == "torch" else None


sys.meta_path.insert(0, Ahead())
import torch
"""

STEPS = """
def train(rank, steps):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.ones(2)).sum().backward()
        opt.step()
"""


def _run(python: str, cwd: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    (cwd / "train.py").write_text(script)
    done = subprocess.run([python, "train.py"], cwd=cwd, env=harness.child_env(**env),
                          capture_output=True, text=True, timeout=harness.WATCHDOG_S)
    assert done.returncode == 0, done.stderr
    return done


def test_a_process_that_trained_without_ravex_says_so_once_at_exit(enabled_python, tmp_path):
    (tmp_path / "ravex.yaml").write_text("storage: ./ck\ncheckpoint_every: 5\n")
    unseen = AHEAD + STEPS + "train(0, 7)\n"
    said = _run(enabled_python, tmp_path, unseen).stderr
    assert said.count("ravex: ") == 1, said
    assert ("ravex: this process ran 7 optimizer steps but Ravex never started (torch was imported "
            "through a finder put ahead of the autoloader's on sys.meta_path: Ahead): no checkpoint "
            "was taken. Put `import ravex; ravex.activate()` at the top of the script") in said
    assert not (tmp_path / "ck").exists()

    # the fix it names works, and then nothing is said; RAVEX_DISABLE asks for no Ravex at all
    fixed = _run(enabled_python, tmp_path, "import ravex; ravex.activate()\n" + unseen).stderr
    assert "never started" not in fixed and "checkpoint step 5" in fixed, fixed
    assert _run(enabled_python, tmp_path, unseen, RAVEX_DISABLE="1").stderr == ""


def test_ravex_activate_at_the_top_under_the_autoloader(enabled_python, tmp_path):
    """``ravex.activate()`` imports the runtime, which imports torch: the autoloader leaves the
    start to that call (the runtime cannot start half-imported). Another call into ravex that
    brings torch in first starts nothing, and the net says so."""
    (tmp_path / "ravex.yaml").write_text("storage: ./ck\ncheckpoint_every: 5\n")
    train = STEPS + "train(0, 6)\n"
    started = _run(enabled_python, tmp_path, "import ravex\nravex.activate()\nimport torch\n" + train).stderr
    assert "checkpoint step 5" in started and "never started" not in started, started
    said = _run(enabled_python, tmp_path, "import ravex\nravex.is_active()\nimport torch\n" + train).stderr
    assert ("ravex: this process ran 6 optimizer steps but Ravex never started (torch was first imported "
            "by a call into ravex") in said and "Call `ravex.activate()` before anything else" in said, said


def test_the_exit_net_leaves_multiprocessing_children_to_their_parent(enabled_python, tmp_path):
    """A rank that ``torch.multiprocessing`` starts trains where a framework or its parent
    answers for it: it says nothing. Its parent, training after the join, is counted alone."""
    (tmp_path / "ravex.yaml").write_text("storage: ./ck\n")
    script = AHEAD + STEPS + ("if __name__ == '__main__':\n"
                              "    torch.multiprocessing.spawn(train, args=(3,), nprocs=1)\n"
                              "    train(0, 2)\n")
    said = _run(enabled_python, tmp_path, script).stderr
    assert said.count("never started") == 1 and "ran 2 optimizer steps" in said, said


def test_the_hook_asks_the_other_finders_without_coming_back_to_itself(monkeypatch):
    """A finder behind the hook that asks the import system again (as ``importlib.util.find_spec``
    does) leads back to the hook in the same thread: it declines there, where asking the finders
    once more would recurse without end. The probe leaves the hook in place, its spec marked."""
    import importlib.machinery

    from ravex.runtime.autoload import TorchImportHook, _marked

    hook = TorchImportHook()

    class AsksAgain:
        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            assert hook.find_spec(name, path, target) is None  # the way back declines
            return importlib.machinery.PathFinder.find_spec(name, path)

    monkeypatch.setattr("sys.meta_path", [hook, AsksAgain(), importlib.machinery.PathFinder])
    spec = hook.find_spec("torch")
    assert spec is not None and _marked(spec) and not hook.fired
    assert sys.meta_path[0] is hook
