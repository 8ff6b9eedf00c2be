"""What a ``ravex`` command imports: a listing pays for neither ``ml_dtypes`` nor zarr-python.

``ml_dtypes``' C extension takes ~0.8 s to import and zarr-python ~0.15 s, against ~0.4 s for a
whole ``ravex ls``: they are imported where a verb needs them. Each test runs the CLI's ``main``
in a fresh interpreter, then reports which of the heavy modules it loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from ravex.format import open_store

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("ml_dtypes", "zarr", "torch", "textual")

_PROBE = """
import contextlib, io, json, sys
from ravex.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(sys.argv[1:])
loaded = sorted(m for m in {heavy!r} if m in sys.modules)
print(json.dumps({{"rc": rc, "out": out.getvalue(), "loaded": loaded}}))
"""


def run_main(*args: str, cwd: Path) -> dict:
    """``ravex.cli.main(ARGS)`` in a fresh interpreter: its exit status, output and heavy imports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAVEX_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_ls_of_a_float32_store_imports_neither_ml_dtypes_nor_zarr(run_store, tmp_path):
    r = run_main("ls", str(run_store), "--json", cwd=tmp_path)
    assert r["rc"] == 0 and len(json.loads(r["out"])["steps"]) == 4, r
    assert r["loaded"] == [], f"`ravex ls` imported {r['loaded']}; import them where they are used"
    # the default store comes from ravex.yaml through ravex.runtime.config, which must stay torch-free
    (tmp_path / "ravex.yaml").write_text(f"storage: {run_store}\ncompression: zstd\nkeep_last: 2\n")
    r = run_main("ls", "--json", cwd=tmp_path)
    assert r["rc"] == 0 and len(json.loads(r["out"])["steps"]) == 4, r
    assert r["loaded"] == [], f"`ravex ls` (STORE from ravex.yaml) imported {r['loaded']}"


def test_show_of_a_bfloat16_tensor_still_reads_it_through_ml_dtypes(tmp_path):
    """The other side of the lazy import: a bfloat16 array still comes out as ml_dtypes' bfloat16."""
    import ml_dtypes

    w = np.arange(-8, 8, dtype="float32").reshape(4, 4).astype(ml_dtypes.bfloat16)
    store = open_store(tmp_path / "ckpt", create=True)
    with store.writer() as writer:
        writer.commit(1, {"model": {"w": w, "b": np.ones(4, "float32")}})
    r = run_main("show", f"{tmp_path / 'ckpt'}@1", "model/w", "--json", cwd=tmp_path)
    assert r["rc"] == 0, r
    assert "ml_dtypes" in r["loaded"] and "zarr" not in r["loaded"], r["loaded"]
    (tensor,) = json.loads(r["out"])["tensors"]
    assert tensor["dtype"] == "bfloat16" and (tensor["stats"]["min"], tensor["stats"]["max"]) == (-8.0, 7.0), tensor
