#!/usr/bin/env bash
# The main job: a fuzz campaign. On the CPU it fuzzes the real Triton kernels on the
# interpreter tier; where CUDA exists it uses the compiled kernels (the nightly GPU job).
# Knobs: KVFUZZ_BACKEND, KVFUZZ_KERNELS (a module or a .py file: your kernel set; default
# ours), KVFUZZ_HOSTILE (spec|off|all; default all for our kernels, which mask every id,
# spec for yours), KVFUZZ_BUDGET_S, KVFUZZ_WORKERS, KVFUZZ_SEED, KVFUZZ_SHARD (I/N),
# KVFUZZ_OP_TIMEOUT, KVFUZZ_CHECK_EVERY (N > 1: the GPU throughput mode), KVFUZZ_OUT (case
# files, summary.json, junit.xml), KVFUZZ_BASELINE (known failures: a kvfuzz-baseline/1 file
# or a folder of accepted cases; they are reported as known and do not fail the job).
# KVFUZZ_CORPUS (a directory): coverage-guided generation from the corpus kept there, resumed if
# it holds one, grown with what this run reaches (--corpus: --scale small; the nightly keeps one).
# Work limits (a pre-merge job that must do the same work on any runner): KVFUZZ_MAX_SEQUENCES,
# KVFUZZ_MAX_OPS (this shard's total, all workers together; the budget is then a safety cap,
# default 3600 s).
# Exit: 0 clean (or only known failures), 1 new failures (case files in KVFUZZ_OUT), 2 setup
# error, 3 harness error.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash ci/setup.sh)
if [ -z "${KVFUZZ_BACKEND:-}" ]; then
  if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    KVFUZZ_BACKEND=cuda
  else
    KVFUZZ_BACKEND=interpret
  fi
fi
OUT=${KVFUZZ_OUT:-kvfuzz-out}
BUDGET=${KVFUZZ_BUDGET_S:-$([ -n "${KVFUZZ_MAX_SEQUENCES:-}${KVFUZZ_MAX_OPS:-}" ] && echo 3600 || echo 120)}

exec "$PY" -m fuzz run --backend "$KVFUZZ_BACKEND" --kernels "${KVFUZZ_KERNELS:-kvkernels}" \
  --hostile "${KVFUZZ_HOSTILE:-$([ -n "${KVFUZZ_KERNELS:-}" ] && echo spec || echo all)}" \
  --budget-s "$BUDGET" --max-sequences "${KVFUZZ_MAX_SEQUENCES:-}" --max-ops "${KVFUZZ_MAX_OPS:-}" --workers "${KVFUZZ_WORKERS:-$(nproc)}" \
  --seed "${KVFUZZ_SEED:-$(date +%Y%m%d)}" --shard "${KVFUZZ_SHARD:-0/1}" \
  --op-timeout "${KVFUZZ_OP_TIMEOUT:-auto}" --check-every "${KVFUZZ_CHECK_EVERY:-1}" --out "$OUT" \
  --summary "$OUT/summary.json" --junit-xml "$OUT/junit.xml" --baseline "${KVFUZZ_BASELINE:-}" \
  --corpus "${KVFUZZ_CORPUS:-}"
