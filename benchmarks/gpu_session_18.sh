#!/usr/bin/env bash
# One H200, session s18: a small-track GPU worker's head start (fuzz/engine/head_start.py): its warm-up
# sequences scouted and their specializations compiled on the spare cores while it sets up, each launch
# waiting only for its own variant. Issue 25's cold first case (s17: 11.4 s cold, 1.9 s warm).
# a: the head-start tests on CUDA; one cold campaign of kvkernels (no bug, 10 sequences) with the head
#    start and one without (--compile-ahead off), each on an empty cache; then the first case over the
#    catalogue, cold then warm, with the head start.
# b: the first case over the catalogue with --compile-ahead off (the A/B, same session).
# c: pytest -m 'cuda and not slow' (every CUDA test, the head start in each small-track campaign).
# d: after Triton's key is computed once before the forks: the first case on seven mutants, cold then warm.
# Usage: OUT=$OUT bash benchmarks/gpu_session_18.sh [a|b|c|d]
set -u
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment, first_case_cuda
PART=${1:-a}
cold_run() {  # cold_run NAME FLAGS...: kvkernels on an empty cache, 10 sequences, its summary's compile lines
  local cache=/tmp/cold-cache-$1; rm -rf "$cache"
  local t0; t0=$(date +%s.%N)
  timeout 90 $PY -m fuzz run --backend cuda --budget-s 60 --max-sequences 10 --cache-dir "$cache" --out /tmp/cold-$1 \
    --summary "$OUT/$PART-cold-$1.json" --progress-s 1000 "${@:2}" 2>&1 | grep -E "^kvfuzz run|head start" | cut -c1-400
  echo "exit ${PIPESTATUS[0]}, $(python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" "$t0") s"
  $PY -c "import json,sys; s=json.load(open(sys.argv[1])); print('compiles', s['compiles'], 'compile_s', round(s['compile_s'],1), 'loads', s['loads'], 'load_s', round(s['load_s'],1), 'steady', s.get('steady_ops_per_s'), 'timeline', {k: round(v,2) for k, v in s['timeline'].items()}, 'head_start', [w.get('head_start') for w in s['workers']])" "$OUT/$PART-cold-$1.json"
}
if [ "$PART" = d ]; then  # after _triton_key: the first case on seven of the catalogue's mutants, cold then warm
  {
    environment
    step "first case, seven mutants, head start with Triton's key computed once before the forks"
    timeout 230 $PY benchmarks/first_case.py --backend cuda --scale small --cold --warm --budget-s 20 \
      --mutants free-forgets-p2v-tombstone,free-unmasked-double-free,read-table-no-negative-guard,alloc-bind-descending,translate-no-negative-guard,free-sorts-holes,grow-down-start-off-by-one \
      --note "one H200, nothing else running; head start, triton_key before the forks" --out "$OUT/d-fc" > "$OUT/d-first-case.log" 2>&1
    echo "exit $?"; tail -18 "$OUT/d-fc/first_case.md" 2>/dev/null || tail -5 "$OUT/d-first-case.log"
  } 2>&1 | tee "$OUT/session-d.log"
  exit 0
fi
if [ "$PART" = c ]; then
  { environment; cuda_tests "the head start in every small-track CUDA campaign"; } 2>&1 | tee "$OUT/session-c.log"
  exit 0
fi
if [ "$PART" = b ]; then
  {
    environment
    step "first case, --compile-ahead off (no head start)"
    timeout 560 $PY benchmarks/first_case.py --backend cuda --scale small --cold --warm --budget-s 20 \
      --run-flags "--compile-ahead off" --note "one H200, nothing else running; --compile-ahead off" \
      --out "$OUT/b-fc" > "$OUT/b-first-case.log" 2>&1
    echo "exit $?"; tail -22 "$OUT/b-fc/first_case.md" 2>/dev/null || tail -5 "$OUT/b-first-case.log"
  } 2>&1 | tee "$OUT/session-b.log"
  exit 0
fi
{
  environment
  step "pytest: head start and compile-ahead tests, and the CUDA campaign tests"
  timeout 130 $PY -m pytest -q -p no:cacheprovider -n 8 -rf -m "cuda and not slow" tests/fuzz 2>&1 | grep -E "passed|failed|FAILED" | head -12
  step "cold campaign, head start"; cold_run head
  step "cold campaign, --compile-ahead off"; cold_run off --compile-ahead off
  step "first case over the catalogue, head start"
  timeout 370 $PY benchmarks/first_case.py --backend cuda --scale small --cold --warm --budget-s 20 \
    --note "one H200, nothing else running; head start (default)" --out "$OUT/a-fc" > "$OUT/a-first-case.log" 2>&1
  echo "exit $?"; tail -22 "$OUT/a-fc/first_case.md" 2>/dev/null || tail -5 "$OUT/a-first-case.log"
} 2>&1 | tee "$OUT/session-a.log"
