#!/usr/bin/env bash
# The GPU session of 2026-12-02 (s10, one H200): each PART fits one device call; logs and JSON to $OUT.
#   a: pytest -m "cuda and not slow"; where a worker's set-up goes (profile_ready); kvkernels and
#      indep read-heavy and default mix (scale_gpu), after the packed oracle's entry clauses became
#      compares over its int64 entries
#   b: the first case over the whole mutant catalogue, cold then warm, with the fork daemon that
#      imports the engine once it has forked a child
#   d: small shapes, 1 and 8 workers, on a cache warmed by a 25 s 8-worker campaign first
#   c: b again (pytest -m "cuda and not slow" first), once the compiled-mode daemon also computes
#      Triton's key (triton_key) for its children
set -u
PART=${1:-a}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step, campaign, util, environment, cuda_tests, syncs_small, first_case_cuda
{
  environment
  if [ "$PART" = a ]; then
    cuda_tests "the packed oracle's entry clauses; the daemon's engine import"
    step "a worker's set-up, split (profile_ready)"
    timeout 150 $PY benchmarks/profile_ready.py --backend cuda --repeats 4 --out "$OUT/ready.json" 2>&1 | grep -vi warn | tail -4 | cut -c1-700
    for set in kvkernels indep; do
      step "$set read-heavy and default mix (scale_gpu)"
      cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
      ahead=96; [ $set = indep ] && ahead=160
      timeout 240 $PY benchmarks/scale_gpu.py --only $set/throughput,$set/mixed --compile-ahead on --ahead-sequences $ahead \
        --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants --out "$OUT/scale-$set.json" 2>&1 | grep -vi warn | tail -4 | cut -c1-900
    done
  fi
  if [ "$PART" = b ] || [ "$PART" = c ]; then
    [ "$PART" = c ] && cuda_tests "the compiled-mode daemon computes Triton's key"
    step "what a worker's first launch imports and spends on CUDA, in a fresh process (profile_ready --modes launch)"
    timeout 100 $PY benchmarks/profile_ready.py --backend cuda --repeats 2 --modes launch,tier \
      --out "$OUT/ready-launch.json" 2>&1 | grep -vi warn | head -60 | cut -c1-3000
    first_case_cuda 480
  fi
  if [ "$PART" = d ]; then
    export TRITON_CACHE_DIR=/tmp/kvfuzz-cache-small
    step "warming the small track's cache: 8 workers, 25 s (untimed)"
    timeout 90 $PY -m fuzz run --backend cuda --budget-s 25 --workers 8 --out /tmp/warm0 --progress-s 1000 2>&1 | grep -E "^kvfuzz run" | cut -c1-300
    small_shapes 15 1 8
  fi
} 2>&1 | tee "$OUT/session-$PART.log"
