#!/usr/bin/env bash
# The batched GPU session, in two parts that each fit one device call (10 minutes):
#   part 1: environment, the whole test suite on CUDA, a GPU fuzz campaign, kvfuzz bench
#   part 2: the no-sync GPU ground truth (calibration) and the mutant hunt on compiled kernels
# Logs go to $OUT/session-PART.log; JSON results beside it (few files: the device tool
# brings back at most 8).
set -u
PART=${1:-1}
OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
PY=${PY:-python3}
LOG="$OUT/session-$PART.log"
{
  echo "== environment"; date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
  if [ "$PART" = 1 ]; then
    echo "== pytest (whole suite; interpreter-tier tests skip where CUDA exists)"
    timeout "${TEST_S:-240}" $PY -m pytest -q -p no:cacheprovider -n 8 tests 2>&1 | tail -30
    echo "== kvfuzz run --backend cuda"
    timeout "${FUZZ_S:-200}" $PY -m fuzz run --backend cuda --budget-s "${CAMPAIGN_S:-120}" --workers 4 --seed 7 --out "$OUT/cases"
    echo "exit $?"
    echo "== kvfuzz bench"
    timeout "${BENCH_S:-200}" $PY -m fuzz bench --seconds 15 --out "$OUT/bench-gpu.json"
  else
    echo "== no-sync GPU ground truth"
    timeout "${SYNC_S:-330}" $PY -m fuzz.sync.calibrate --gpu --out "$OUT" --timeout-s 300
    echo "exit $?"
    echo "== kvfuzz mutants --backend cuda"
    timeout "${MUT_S:-220}" $PY -m fuzz mutants --backend cuda --budget-s "${MUT_BUDGET_S:-10}"
    echo "exit $?"
  fi
} 2>&1 | tee "$LOG"
