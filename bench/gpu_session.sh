#!/usr/bin/env bash
# A lent GPU session's checks, prepared to fit 15 minutes of device time with room for the
# machine's start (about 3 minutes): the CUDA tests, then bench/gpu_virtual.py's four
# sections, each under a wall-clock cap, all of it within BUDGET_S (default 570 s, under
# the 600 s a command may run): a section gets what is left of the budget if that is less
# than its cap, and none when under 20 s are left. A section that fails or is cut off
# leaves the later ones running. Expected: about 6.5 minutes in all on an H200.
#
# Usage: bash bench/gpu_session.sh [SECTION ...], SECTION one of tests, population,
# resnet, study, steps (default: all, in that order), as ONE command of the device tool,
# with `.whl` carried (docs/gpu.md, "Measuring on a lent GPU").
#
# What comes back ($OUT, default ./gpu-out; at most 8 files come back from a lent
# machine): gpu.txt (the machine, the environment), session.log (every section's output,
# appended as it runs, so a cut-off command still returns it), tests.xml, and one JSON a
# bench section (written after each section, so a cut-off section loses only itself).
#
# Run from the repository root, with no install (PYTHONPATH=.). pytest-asyncio, which the
# tests need and the lent machine lacks, is installed from wheels in .whl/ if it is not
# importable. The machine sets PYTHONDONTWRITEBYTECODE and its torch has no bytecode, so
# every Python process compiled torch anew (import torch 2.3-4.6 s, some 20 processes):
# here Python caches its bytecode under /tmp, as any installed package has it
# (BYTECODE=off keeps the machine's setting).
set -uo pipefail
OUT=${OUT:-gpu-out}
BUDGET_S=${BUDGET_S:-570}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu rehearses the script on a machine without a GPU
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [[ ${BYTECODE:-on} != off ]]; then
    unset PYTHONDONTWRITEBYTECODE
    export PYTHONPYCACHEPREFIX=/tmp/pycache
fi
if ! python3 -c "import pytest_asyncio" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null
then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=.:/tmp/site
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "no GPU"
    git log --oneline -1 2> /dev/null
    python3 -c "import sys, torch, pytest; print(sys.version.split()[0], torch.__version__,
        pytest.__version__, sep=' / ')"
    python3 -c "import pytest_asyncio; print('pytest-asyncio', pytest_asyncio.__version__)" \
        2>&1 | tail -n 1
    echo "bytecode cached: ${PYTHONPYCACHEPREFIX:-no}; budget ${BUDGET_S} s"
} 2>&1 | tee "$OUT/gpu.txt"

wanted=" ${*:-tests population resnet study steps} "
LOG="$OUT/session.log"
: > "$LOG"
section() {  # NAME CAP_S COMMAND...: one capped step, its output appended to $LOG
    local name=$1 cap=$2 left seconds status before
    shift 2
    [[ $wanted == *" $name "* ]] || return 0
    left=$((BUDGET_S - SECONDS))
    if ((left < 20)); then
        echo "== $name: skipped, ${left} s of the budget left" | tee -a "$LOG"
        return 0
    fi
    seconds=$((cap < left ? cap : left))
    before=$(wc -l < "$LOG")
    echo "== $name (at most ${seconds} s)" | tee -a "$LOG"
    timeout -k 5 "$seconds" "$@" >> "$LOG" 2>&1
    status=$?
    tail -n "+$((before + 2))" "$LOG" | tail -n 40
    echo "== $name: exit ${status}$( ((status == 124)) && echo ' (cut off)') after" \
        "${SECONDS} s in all" | tee -a "$LOG"
}

section tests 100 python3 -m pytest -q -p no:cacheprovider --timeout 60 --durations 15 \
    --junitxml "$OUT/tests.xml" tests/test_gpu.py tests/test_gpu_cohort.py
section population 110 python3 bench/gpu_virtual.py --device "$DEVICE" --only population \
    --population-wall-s 45 --json "$OUT/population.json"
section resnet 75 python3 bench/gpu_virtual.py --device "$DEVICE" --only resnet \
    --resnet-wall-s 60 \
    --json "$OUT/resnet.json"
section study 170 python3 bench/gpu_virtual.py --device "$DEVICE" --only study --study-repeats 1 \
    --study-wall-s 75 --jobs 4 --json "$OUT/study.json"
section steps 100 python3 bench/gpu_virtual.py --device "$DEVICE" --only steps --reps 2 \
    --json "$OUT/steps.json"
