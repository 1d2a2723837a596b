#!/usr/bin/env bash
# Nightly job (GPU where present, else CPU): the test suite, a long small-scale campaign
# (sharded with KVFUZZ_SHARD=I/N across a CI matrix or a Slurm/Kubernetes array), a
# production-scale campaign (kernel-level ops at the kernel set's own block boundaries, and
# CUDA-graph replay), the letter-of-SPEC kernel sets at both scales (letter/), SGLang's allocator where SGLang is
# installed (sglang-allocator/), the mutant catalogue (kill rate), and kvfuzz bench. Results land in
# KVFUZZ_OUT (default nightly-out/): cases/, guided/ and production/ (case files, summary.json,
# junit.xml), coverage.txt, mutants.txt, bench.json, and the morning page report.html. Exit 1 if any step failed (3 if kvfuzz itself did).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=$(bash ci/setup.sh) || exit 2
OUT=${KVFUZZ_OUT:-nightly-out}
mkdir -p "$OUT"
status=0
# KVFUZZ_NIGHTLY_TESTS=0 skips the test suite (a quick look at the rest, e.g. the morning page's own check).
[ "${KVFUZZ_NIGHTLY_TESTS:-1}" = 0 ] || "$PY" -m pytest -q -n "${KVFUZZ_TEST_WORKERS:-2}" || status=1
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  BACKEND=cuda; GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  WORKERS=${KVFUZZ_WORKERS:-$((4 * GPUS))}; CHECK_EVERY=16  # GPU throughput mode: several workers per GPU
else
  BACKEND=interpret; GPUS=0; WORKERS=${KVFUZZ_WORKERS:-$(nproc)}; CHECK_EVERY=1
fi
# A host of several GPUs (or KVFUZZ_SIMULATE_GPUS=N): the three campaigns below as one per GPU each, each
# merged into one result in the same folders, and one corpus (ci/nightly-host.sh, docs/host.md).
if [ "$GPUS" -gt 1 ] || [ -n "${KVFUZZ_SIMULATE_GPUS:-}" ]; then
  KVFUZZ_NO_VENV=1 KVFUZZ_OUT="$OUT" PATH="$(dirname "$PY"):$PATH" bash ci/nightly-host.sh || status=1
else
KVFUZZ_NO_VENV=1 KVFUZZ_OUT="$OUT/cases" KVFUZZ_CORPUS= KVFUZZ_BUDGET_S="${KVFUZZ_BUDGET_S:-3600}" KVFUZZ_WORKERS="$WORKERS" KVFUZZ_CHECK_EVERY="$CHECK_EVERY" \
  PATH="$(dirname "$PY"):$PATH" bash ci/fuzz.sh || status=1
# Coverage-guided (docs/guided.md): a corpus kept between nights in KVFUZZ_CORPUS, resumed and grown
# each night; what every night's corpus reached and never reached, per kernel and function, goes to
# coverage.txt. Shards on machines of their own each keep theirs: `kvfuzz merge --corpus` makes one.
CORPUS=${KVFUZZ_CORPUS:-$HOME/.cache/kvfuzz/corpus}
KVFUZZ_NO_VENV=1 KVFUZZ_OUT="$OUT/guided" KVFUZZ_CORPUS="$CORPUS" KVFUZZ_BUDGET_S="${KVFUZZ_GUIDED_S:-1800}" \
  KVFUZZ_WORKERS="$WORKERS" KVFUZZ_CHECK_EVERY="$CHECK_EVERY" PATH="$(dirname "$PY"):$PATH" bash ci/fuzz.sh || status=1
"$PY" -m fuzz coverage "$CORPUS" > "$OUT/coverage.txt" || status=1
"$PY" -m fuzz run --backend "$BACKEND" --scale production --kernels "${KVFUZZ_KERNELS:-kvkernels}" \
  --budget-s "${KVFUZZ_PRODUCTION_S:-1800}" --cache-dir "${KVFUZZ_CACHE_DIR:-$HOME/.cache/kvfuzz/triton}" --workers "$([ "$GPUS" -gt 0 ] && echo "$GPUS" || nproc)" \
  --seed "${KVFUZZ_SEED:-$(date +%Y%m%d)}" --shard "${KVFUZZ_SHARD:-0/1}" --check-every "$CHECK_EVERY" \
  --out "$OUT/production" --summary "$OUT/production/summary.json" --junit-xml "$OUT/production/junit.xml" \
  || status=1
fi
# The letter-of-SPEC kernel sets (tests/fixtures/kernels/letter/): right on all valid input, so any
# finding against one is kvfuzz handing it input SPEC refuses. Each at both scales.
for set in tests/fixtures/kernels/letter/[a-z]*.py; do
  for scale in small production; do
    "$PY" -m fuzz run --backend "$BACKEND" --scale "$scale" --kernels "$set" --budget-s "${KVFUZZ_LETTER_S:-60}" \
      --workers "$([ "$GPUS" -gt 0 ] && echo "$GPUS" || echo 1)" --seed "${KVFUZZ_SEED:-$(date +%Y%m%d)}" \
      --out "$OUT/letter/$(basename "$set" .py)-$scale" --summary "$OUT/letter/$(basename "$set" .py)-$scale/summary.json" \
      || status=1
  done
done
# SGLang's own allocator (docs/sglang.md), where SGLang 0.5.23 is installed or KVFUZZ_SGLANG_SITE names a
# `pip install --no-deps --target` of it: on CUDA with real forward events; its kernels' known findings are the baseline.
SGL_PATH="${KVFUZZ_SGLANG_SITE:+$KVFUZZ_SGLANG_SITE:}${PYTHONPATH:-}"
if PYTHONPATH="$SGL_PATH" "$PY" -c "import importlib.metadata as m; m.distribution('sglang')" 2> /dev/null; then
  PYTHONPATH="$SGL_PATH" "$PY" -m fuzz run --allocator kvfuzz-sglang --backend "$BACKEND" --budget-s "${KVFUZZ_SGLANG_S:-600}" \
    --workers "$([ "$GPUS" -gt 0 ] && echo $((4 * GPUS)) || nproc)" --seed "${KVFUZZ_SEED:-$(date +%Y%m%d)}" \
    --baseline fuzz/clients/sglang-baseline.json --out "$OUT/sglang-allocator" \
    --summary "$OUT/sglang-allocator/summary.json" || status=1
fi
"$PY" -m fuzz mutants --backend "$BACKEND" --budget-s "${KVFUZZ_MUTANT_S:-60}" | tee "$OUT/mutants.txt" || status=1
"$PY" -m fuzz bench --seconds "${KVFUZZ_BENCH_S:-30}" --out "$OUT/bench.json" || status=1
# The morning page (docs/morning-page.md): report.html, this night and the nights before it, whose
# lines are kept in KVFUZZ_HISTORY (JSON lines; this night's is appended).
"$PY" -m fuzz coverage "$CORPUS" --json > "$OUT/coverage.json" || status=1
"$PY" -m fuzz report "$OUT" --html "$OUT/report.html" \
  --history "${KVFUZZ_HISTORY:-$HOME/.cache/kvfuzz/history.jsonl}" || status=1
exit $status
