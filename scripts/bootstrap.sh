#!/usr/bin/env bash
# Create .venv (once) and install Ravex with what the tests and demo need.
# torch is pinned to the exact CPU build that lies on these machines' disks first,
# so that resolving ravex's own `torch>=2.4` floor never downloads a CUDA build; the constraints
# file keeps the pin in every resolve (scripts/constraints.txt says why).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c scripts/constraints.txt "torch==2.13.0"
.venv/bin/python -m pip install -q -c scripts/constraints.txt -e ".[dev]"
.venv/bin/python -c 'import sys, torch; v = torch.__version__; sys.exit(0 if v.startswith("2.13.0") else f"bootstrap: torch {v} in .venv, expected 2.13.0 (rm -rf .venv and rerun)")'

