"""tensorstore alone, in a process that cannot import Ravex or torch, walks a step through the
kvstack specs of ``tensorstore_step`` and reads every array bit-exact: every data type
(bfloat16 and float8 included), whole-object, packed and inline chunks, every compression."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from open_helpers import BLOCK_RAVEX_TORCH

from ravex.format import open_store
from ravex.format.interop.tensorstore_spec import tensorstore_step

#: The lines spec/FORMAT.md §18.3 shows, run verbatim below.
TENSORSTORE_LINES = """
import base64, json
import tensorstore as ts
doc = json.load(open(spec_file))  # ravex.format.interop.tensorstore_spec.tensorstore_step(store, step)
context = ts.Context()
memory = ts.KvStore.open({"driver": "memory"}, context=context).result()
for key, chunk in doc["memory"].items():  # packed and inline chunks: a byte range, or base64
    if isinstance(chunk, str):
        data = base64.b64decode(chunk.removeprefix("base64:"))
    else:
        location, offset, size = chunk
        with open(location, "rb") as f:
            f.seek(offset)
            data = f.read(size)
    memory.write(key, data).result()
arrays = {path: ts.open(spec, context=context, read=True).result() for path, spec in doc["arrays"].items()}
"""


def test_the_spec_shows_these_lines():
    spec = (Path(__file__).resolve().parents[2] / "spec" / "FORMAT.md").read_text()
    assert TENSORSTORE_LINES.strip() in spec


def test_tensorstore_walks_a_step_without_ravex(zoo, tmp_path):
    doc = tensorstore_step(open_store(zoo.root), zoo.step)
    assert doc["memory"], "the zoo has packed and inline chunks: the memory layers are exercised"
    spec_file = tmp_path / "step.tensorstore.json"
    spec_file.write_text(json.dumps(doc))  # plain JSON: no Ravex object in it
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code = "\n".join([
        BLOCK_RAVEX_TORCH,
        f"spec_file, out = {str(spec_file)!r}, {str(out_dir)!r}",
        TENSORSTORE_LINES,
        "kinds = {}",
        "for i, (path, t) in enumerate(sorted(arrays.items())):",
        "    a = t.read().result()",
        "    open(f'{out}/{i}.bin', 'wb').write(a.tobytes())",
        "    kinds[path] = [i, str(a.dtype), list(a.shape)]",
        "json.dump(kinds, open(f'{out}/kinds.json', 'w'))",
        'assert "ravex" not in sys.modules and "torch" not in sys.modules',
        'print("ok")',
    ])
    run = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok"
    kinds = json.loads((out_dir / "kinds.json").read_text())
    assert sorted(kinds) == sorted(zoo.arrays)  # walked: every array, extension types included
    for path, expected in zoo.arrays.items():
        i, dtype, shape = kinds[path]
        assert (dtype, tuple(shape)) == (expected.dtype.name, expected.shape), path
        assert (out_dir / f"{i}.bin").read_bytes() == expected.tobytes(), path
