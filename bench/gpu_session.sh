#!/usr/bin/env bash
# A lent GPU session's checks, prepared to fit 15 minutes of device time with room for a
# machine's start: the CUDA tests, then bench/gpu_virtual.py's four sections, each under a
# wall-clock cap. Every log and figure goes to $OUT (default ./gpu-out).
#
# Usage: bash bench/gpu_session.sh [SECTION ...], SECTION one of tests, steps, resnet,
# population, study (default: all, about 11 minutes). Under a 10-minute limit per command,
# run it as two: `tests steps resnet` (about 5 minutes), then `population study`.
#
# Run from the repository root, with no install (PYTHONPATH=.). pytest-asyncio, which the
# tests need and a bare GPU machine may lack, is installed first from wheels in .whl/ where
# there are any (docs/gpu.md, "Measuring on a lent GPU", says how to fetch them).
set -uo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=.:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"

wanted=" ${*:-tests steps resnet population study} "
section() {  # NAME SECONDS COMMAND...: one capped step, its log in $OUT/NAME.log
    local name=$1 seconds=$2
    shift 2
    [[ $wanted == *" $name "* ]] || return 0
    echo "== $name (at most ${seconds} s)"
    timeout -k 10 "$seconds" "$@" > "$OUT/$name.log" 2>&1
    echo "== $name: exit $? after ${SECONDS} s in all"
    tail -n 40 "$OUT/$name.log"
}

section tests 100 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_gpu_cohort.py
section steps 100 python3 bench/gpu_virtual.py --device cuda --only steps --reps 2 \
    --json "$OUT/steps.json"
section resnet 75 python3 bench/gpu_virtual.py --device cuda --only resnet --resnet-wall-s 60 \
    --json "$OUT/resnet.json"
section population 130 python3 bench/gpu_virtual.py --device cuda --only population \
    --population-wall-s 45 --json "$OUT/population.json"
section study 200 python3 bench/gpu_virtual.py --device cuda --only study --study-repeats 1 \
    --study-wall-s 90 --jobs 4 --json "$OUT/study.json"
