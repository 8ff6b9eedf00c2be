"""ravex.format.objects.dtypes resolves ml_dtypes' types on first use, with the same names, sizes and dtypes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ravex.format.objects.dtypes import BY_NAME, data_type, from_numpy

ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_dtype_table_matches_numpy_both_ways(name):
    dt = data_type(name)
    native = np.dtype(getattr(ml_dtypes, name)) if name in EXTENSIONS else np.dtype(name)
    assert dt.numpy == native.newbyteorder("<") and dt.itemsize == native.itemsize
    assert dt.extension == (name in EXTENSIONS)
    assert from_numpy(native) is dt and from_numpy(native.newbyteorder(">")) is dt


def test_dtype_reading_a_float32_store_never_imports_ml_dtypes(tmp_path):
    """Reading float32 in a fresh process leaves ml_dtypes unimported; a bfloat16 dtype imports it.

    (Writing still imports it, through refs.py -> zarr_store, which zarr-python needs.)
    """
    from ravex.format import open_store

    store = open_store(tmp_path / "s", create=True)
    with store.writer() as w:
        w.commit(1, {"w": np.ones((8, 8), "float32"), "i": np.arange(4)})
    probe = f"""
import sys
import numpy as np
from ravex.format import open_store
from ravex.format.objects.dtypes import data_type
state = open_store({str(tmp_path / "s")!r}).read(1)
assert state["w"].dtype == np.float32 and state["i"].dtype == np.int64 and data_type("bfloat16").itemsize == 2
print("ml_dtypes" in sys.modules, end=" ")
print(data_type("bfloat16").numpy, "ml_dtypes" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "bfloat16", "True"], out.stdout


def test_dtype_unstorable_numpy_type_is_a_clear_error():
    with pytest.raises(Exception, match=r"numpy dtype object cannot be stored; supported: \['bfloat16'"):
        from_numpy(np.dtype(object))
