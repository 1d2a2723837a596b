#!/usr/bin/env bash
# One batched GPU session (the device tool runs it on an H200 with its own torch/Triton):
# environment, the CUDA tests, a GPU fuzz campaign, the mutant hunt on compiled kernels,
# kvfuzz bench (fuzz rates + kernel benchmarks), and the no-sync GPU ground truth.
# Everything lands under $OUT (at most 8 files come back).
set -u
OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
PY=${PY:-python3}
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
( timeout ${TEST_S:-200} $PY -m pytest -q -p no:cacheprovider -n 8 tests 2>&1 | tail -25 ) > "$OUT/pytest-gpu.txt"
cat "$OUT/pytest-gpu.txt"
timeout ${FUZZ_S:-200} $PY -m fuzz run --backend cuda --budget-s ${CAMPAIGN_S:-150} --workers 4 --seed 7 --out "$OUT/cases" > "$OUT/campaign-cuda.txt" 2>&1
echo "campaign exit $?" >> "$OUT/campaign-cuda.txt"; cat "$OUT/campaign-cuda.txt"
timeout ${MUT_S:-150} $PY -m fuzz mutants --backend cuda --budget-s ${MUT_BUDGET_S:-8} > "$OUT/mutants-cuda.txt" 2>&1
cat "$OUT/mutants-cuda.txt"
timeout ${BENCH_S:-200} $PY -m fuzz bench --seconds 15 --out "$OUT/bench-gpu.json" > "$OUT/bench-gpu.txt" 2>&1
cat "$OUT/bench-gpu.txt"
