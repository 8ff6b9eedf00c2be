#!/usr/bin/env bash
# Issue 34 on a lent GPU machine, in one command (``python -m benchmarks gpu``, benchmarks/gpu.py).
#
# The device image holds PyTorch with CUDA (Python 3.12) but not zarr, numcodecs, donfig or
# google-crc32c, and it reaches no registry, so their wheels travel with the run:
#   here, once:   bash benchmarks/gpu.sh --fetch    downloads them into .whl/ (ignored by git, ~10 MiB)
#   on the GPU:   bash benchmarks/gpu.sh [ARGS]     with .whl carried along; ARGS go to
#                                                   python -m benchmarks gpu (default: every part)
# The log and the JSON go to $OUT (the device tool's folder that comes back), else /tmp.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WHEELS=(zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0)
if [ "${1:-}" = "--fetch" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${WHEELS[@]}"
  ls -l .whl
  exit 0
fi
[ -d .whl ] || { echo "no .whl/: run 'bash benchmarks/gpu.sh --fetch' where pip reaches PyPI, then carry .whl" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ravex-site .whl/*.whl
export PYTHONPATH="/tmp/ravex-site:$PWD" PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch, zarr; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'zarr', zarr.__version__)"
set -o pipefail
python3 -m benchmarks gpu --out "$out/gpu.json" "$@" 2>&1 | tee "$out/gpu.log"
