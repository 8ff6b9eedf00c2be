#!/usr/bin/env bash
# Kill/resume harness for real public training scripts under Ravex. See README.md.
#
# usage: bash scripts/realworld/run_all.sh CHECKOUT [--work DIR] [--venv DIR] [--src DIR] [--results DIR]
#                                          [--python PY] [--trials N] [--seed S] [--scripts a,b]
#   CHECKOUT   the Ravex checkout under test (a git worktree); installed editable into the venv
#   --work     work directory (default: $RAVEX_RS_WORK, else ./realworld-work); holds the defaults below
#   --venv     venv the scripts run in (default: WORK/venv; built when missing; env RAVEX_RS_VENV); the
#              autoloader is enabled there, so never the checkout's own .venv
#   --src      sources: SRC/nanoGPT, SRC/examples, SRC/minGPT, SRC/pytorch-template (default: WORK/src;
#              env RAVEX_RS_SRC); the last two only for the scripts that use them
#   --results  results root (default: WORK/results; env RAVEX_RS_RESULTS); writes RESULTS/<sha>/
#   --python   interpreter used to build a missing venv (default: python3)
# Every other option goes to harness.py (--trials, --seed, --scripts).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  sed -n '2,15p' "$0" >&2; exit 2
fi
CHECKOUT=$(realpath "$1"); shift
WORK=${RAVEX_RS_WORK:-}
VENV=${RAVEX_RS_VENV:-}
SRC=${RAVEX_RS_SRC:-}
RESULTS=${RAVEX_RS_RESULTS:-}
PY=python3
PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --work) WORK=$2; shift 2 ;;
    --venv) VENV=$2; shift 2 ;;
    --src) SRC=$2; shift 2 ;;
    --results) RESULTS=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    *) PASS+=("$1"); shift ;;
  esac
done
WORK=$(realpath -m "${WORK:-realworld-work}")
VENV=$(realpath -m "${VENV:-$WORK/venv}")
SRC=$(realpath -m "${SRC:-$WORK/src}")
RESULTS=$(realpath -m "${RESULTS:-$WORK/results}")
if [ "$VENV" = "$CHECKOUT/.venv" ]; then  # 'ravex enable' there would start the autoloader in the test suite
  echo "--venv $VENV is the checkout's test venv; give the scripts a venv of their own (default WORK/venv)" >&2; exit 2
fi
for d in "$SRC/nanoGPT" "$SRC/examples"; do
  [ -d "$d" ] || { echo "missing $d: clone karpathy/nanoGPT and pytorch/examples there (README.md)" >&2; exit 2; }
done
for d in "$SRC/minGPT" "$SRC/pytorch-template"; do  # chargpt; pytorch-template
  [ -d "$d" ] || echo "note: no $d: the scripts that use it will fail (README.md)" >&2
done
mkdir -p "$WORK"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  # torch 2.14.1 + torchvision 0.29.1: PyPI's torchvision does not import beside torch 2.13.0
  "$VENV/bin/pip" install -q torch==2.14.1 torchvision==0.29.1
  "$VENV/bin/pip" install -q "numpy>=1.26" "zarr>=3.1,<4" "numcodecs>=0.15" "fsspec>=2024.6" "xxhash>=3.4" \
    "ml_dtypes>=0.4" "pyyaml>=6" "textual>=1.0" "rich>=13"
fi
# the scripts' own dependencies: hydra-core and boto3 (mingpt-ddp), pandas (pytorch-template; its
# MetricTracker assigns through chained indexing, which pandas 3 no longer writes through)
"$VENV/bin/python" -c "import hydra, boto3, pandas; assert pandas.__version__ < '3'" 2>/dev/null \
  || "$VENV/bin/pip" install -q "hydra-core>=1.3" boto3 "pandas>=2,<3" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/pip" install -q --no-deps -e "$CHECKOUT" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/ravex" enable >/dev/null  # the autoloader, in this venv only
"$VENV/bin/python" -c "import ravex, sys; assert ravex.__file__.startswith(sys.argv[1]), ravex.__file__" "$CHECKOUT"
SHA=$(git -C "$CHECKOUT" rev-parse --short HEAD)
# what is measured: HEAD now (the table is written later, when HEAD may have moved) and whether the
# tree under test differs from it (a live working copy is measured as it is, not as HEAD)
RS_CHECKOUT_DESC=$(git -C "$CHECKOUT" log -1 --format='%h %s')
DIRTY=$(git -C "$CHECKOUT" status --porcelain -- ravex | wc -l)
[ "$DIRTY" -eq 0 ] || RS_CHECKOUT_DESC="$RS_CHECKOUT_DESC; plus uncommitted changes to $DIRTY files under ravex/ when the run started"
export RS_CHECKOUT_DESC
OUT="$RESULTS/$SHA"
mkdir -p "$OUT"
export OMP_NUM_THREADS=1
"$VENV/bin/python" "$HERE/harness.py" "$CHECKOUT" --src "$SRC" --out "$OUT" ${PASS[@]+"${PASS[@]}"}
"$VENV/bin/python" "$HERE/make_table.py" "$OUT/results.json" "$CHECKOUT" > "$OUT/TABLE.md"
cp "$OUT/TABLE.md" "$WORK/TABLE.md"
echo "table: $OUT/TABLE.md (copied to $WORK/TABLE.md)"
