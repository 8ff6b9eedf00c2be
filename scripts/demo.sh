#!/usr/bin/env bash
# The main job, end to end: train, SIGKILL mid-run, rerun the same command, and show that
# it resumed and ended bit-for-bit where an uninterrupted run ends. Then list the store.
#
#   bash scripts/demo.sh [KILL_AT_STEP]        (default 37 of 80)
#
# Uses .venv/bin/python (or $PYTHON). Works in a temporary directory; nothing else is touched.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    bash "$ROOT/scripts/bootstrap.sh"   # a fresh machine: .venv with torch==2.13.0 and ravex
fi
PY="${PYTHON:-$ROOT/.venv/bin/python}"
KILL_AT="${1:-37}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ravex-demo.XXXXXX")"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
unset RAVEX_CONFIG
DEMO=("$PY" "$ROOT/examples/train_demo.py")

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1. Reference: the same script, uninterrupted, without Ravex ($WORK/reference)"
mkdir -p "$WORK/reference" && cd "$WORK/reference"
"${DEMO[@]}" --digest-out digest.txt | tail -n 2

say "2. With Ravex (ravex.yaml + --activate), SIGKILL at step $KILL_AT ($WORK/run)"
mkdir -p "$WORK/run" && cd "$WORK/run"
cat > ravex.yaml <<'YAML'
storage: ./checkpoints
checkpoint_every: 10
keep_last: 3
YAML
cat ravex.yaml
coproc TRAIN { exec "${DEMO[@]}" --activate 2>&1; }
train_pid=$TRAIN_PID
while IFS= read -r line <&"${TRAIN[0]}"; do
    echo "$line"
    if [[ "$line" == *"step $(printf '%4d' "$KILL_AT") loss"* ]]; then
        kill -KILL "$train_pid"
        echo ">>> kill -9 $train_pid at step $KILL_AT (no warning, no cleanup)"
        break
    fi
done
wait "$train_pid" 2>/dev/null || echo ">>> exit status $? (killed)"

say "3. Rerun the very same command: it resumes"
"${DEMO[@]}" --activate --digest-out digest.txt 2>&1 \
    | grep -E "resumed from|ravex: resume (verified|diverged|not verified)|checkpoint step|epoch [0-9]+ step|sha256" \
    | awk 'NR <= 4 || /ravex: resume / {print; shown = NR; next} {last = $0; at = NR} END {if (at > shown) print last}'

say "4. Compare the final parameters"
ref="$(cat "$WORK/reference/digest.txt")"
got="$(cat "$WORK/run/digest.txt")"
echo "uninterrupted: $ref"
echo "killed+resumed: $got"
if [[ "$ref" == "$got" ]]; then
    echo "IDENTICAL: the resumed run ended bit-for-bit where the uninterrupted one did"
else
    echo "DIFFERENT: resume is not exact" >&2
    exit 1
fi

say "5. The store"
"$PY" -m ravex status | sed -n '1,3p;$p'
if "$PY" -m ravex --help 2>/dev/null | grep -qw ls; then
    COLUMNS="${COLUMNS:-120}" "$PY" -m ravex ls ./checkpoints
else
    find checkpoints -maxdepth 3 -name '*.json' | sort
fi
echo
echo "demo directory: $WORK"
