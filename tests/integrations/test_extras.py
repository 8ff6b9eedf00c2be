"""The framework extras cost nothing unless used: a plain run under ``ravex enable`` imports
neither transformers, accelerate nor lightning; using an integration whose framework is missing
fails in one line naming the extra to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from runtime import harness  # tests/runtime: the kill-and-rerun harness
from runtime.conftest import make_venv

FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning")

PLAIN = textwrap.dedent("""
    import sys
    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    for x, y in torch.utils.data.DataLoader(data, batch_size=4):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    assert "ravex" in sys.modules, "the autoloader did not run"
    print("LOADED", sorted(m for m in sys.modules if m.split(".")[0] in {names!r}))
""")


def test_a_plain_run_imports_no_framework(tmp_path):
    for name in ("transformers", "lightning"):  # installed (the dev extra): else the check proves nothing
        pytest.importorskip(name)
    python = make_venv(tmp_path / "venv")
    (tmp_path / "ravex.yaml").write_text("storage: ./ckpt\ncheckpoint_every: 2\n")
    (tmp_path / "plain.py").write_text(PLAIN.format(names=set(FRAMEWORKS)))
    result = harness.run([python, "plain.py"], tmp_path, harness.child_env())
    assert result.returncode == 0, result.explain()
    assert "LOADED []" in result.stdout, result.explain()
    assert (tmp_path / "ckpt").is_dir(), "the run was not checkpointed: the check would prove nothing"


def test_the_lightning_plugin_without_lightning_names_the_extra(tmp_path):
    """Neither ``lightning`` nor the standalone ``pytorch_lightning`` importable (as if not installed;
    either one is enough): one line naming ``ravex[lightning]``."""
    code = textwrap.dedent("""
        import sys
        for name in ("lightning", "pytorch_lightning", "lightning_fabric"):
            sys.modules[name] = None  # an import of it now raises ImportError, as when absent
        try:
            import ravex.integrations.lightning
        except ImportError as exc:
            print("ERROR", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], env=harness.child_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("ERROR ravex.integrations.lightning needs PyTorch Lightning: "
                                  "pip install 'ravex[lightning]'"), out.stdout
