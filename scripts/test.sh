#!/usr/bin/env bash
# The test command: installs what it needs, lints (ruff, the import layering, types), then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check ravex tests benchmarks spec
.venv/bin/lint-imports
.venv/bin/mypy
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
