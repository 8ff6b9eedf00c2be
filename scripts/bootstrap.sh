#!/usr/bin/env bash
# Create .venv (once) and install Ravex with what the tests and demo need.
# torch is pinned to the exact CPU build that lies on these machines' disks first,
# so that resolving ravex's own `torch>=2.4` floor never downloads a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
