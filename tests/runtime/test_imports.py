"""What a training run with Ravex imports: float32 training pays for neither ``ml_dtypes``
nor zarr-python.

Both were imported on the writer thread at a run's first checkpoint (refs.json is built from
the step's Zarr key view, which lived beside the zarr-python store), ~0.9 s of imports that
also hold the import lock the training thread may need. A bfloat16 tensor still brings
``ml_dtypes`` in, as it must.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_TRAIN = """
import json, sys
import torch, ravex
ravex.activate(storage=sys.argv[1], checkpoint_every=2, checkpoint_on_exit=False, log_level="WARNING")
model = torch.nn.Linear(8, 8).to(getattr(torch, sys.argv[2]))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    model(torch.randn(2, 8, dtype=model.weight.dtype)).float().sum().backward()
    opt.step()
    opt.zero_grad()
ravex.flush()
status = ravex.status()
print(json.dumps({"step": status.get("last_checkpoint_step"), "error": status.get("last_error"),
                  "loaded": sorted(m for m in ("ml_dtypes", "zarr") if m in sys.modules)}))
"""


@pytest.mark.parametrize(("dtype", "expected"), [("float32", []), ("bfloat16", ["ml_dtypes"])])
def test_training_imports_only_what_its_dtypes_need(tmp_path, dtype, expected):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAVEX_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _TRAIN, str(tmp_path / "ck"), dtype], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] is None and out["step"] in (2, 4), out
    assert (tmp_path / "ck" / "steps" / str(out["step"]) / "refs.json").exists()  # the Zarr key view was built
    assert out["loaded"] == expected, out
