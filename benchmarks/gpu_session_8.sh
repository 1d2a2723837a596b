#!/usr/bin/env bash
# The GPU session of 2026-12-02 (s8, one H200), one device call: where the time goes where issue 25's
# targets are missed. Logs and JSON to $OUT.
#   device kernels of production read-heavy sequences, kvkernels and indep (profile_gpu.py kernels);
#   one small-shape worker's host profile with the device time beside it (profile_gpu.py small);
#   small shapes with 1, 2, 4 and 8 workers, 20 s each, after a warm-up of the cache;
#   indep read-heavy with a compile-ahead scout that covers the whole timed window (160 sequences).
# PART kernels (the second call: the first call's kernel profiles started their clock before the
# profiler, whose start took longer than the 4 s window, and measured nothing): the two device
# profiles and the small-shape host profile only, all in session.log.
set -u
PART=${1:-all}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step, util, environment
{
  environment
  export TRITON_CACHE_DIR=/tmp/kvfuzz-cache-s8
  for set in kvkernels indep; do
    step "device kernels, $set read-heavy (profile_gpu kernels)"
    timeout 150 $PY benchmarks/profile_gpu.py kernels --set $set --seconds 4 --warmup 8 --top 20 \
      --out "$OUT/kernels-$set.json" 2>&1 | grep -v -i "warn\|USDT" | tail -24 | cut -c1-400
  done
  step "one small-shape worker, cProfile and device time (profile_gpu small)"
  timeout 120 $PY benchmarks/profile_gpu.py small --seconds 10 --warmup 4 --top 25 \
    --out "$OUT/small-profile.json" > "$OUT/small-profile.txt" 2>&1
  grep -v -i "warn\|USDT" "$OUT/small-profile.txt" | head -90 | cut -c1-220; tail -1 "$OUT/small-profile.txt" | cut -c1-600
  rm -f "$OUT/small-profile.txt"
  [ "$PART" = kernels ] && exit 0
  small_shapes 20 1 2 4 8
  step "indep read-heavy, compile-ahead over 160 sequences (scale_gpu)"
  cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
  timeout 150 $PY benchmarks/scale_gpu.py --only indep/throughput --compile-ahead on --ahead-sequences 160 \
    --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants --out "$OUT/scale-indep-160.json" 2>&1 | grep -vi warn | tail -3 | cut -c1-700
} 2>&1 | tee "$OUT/session.log"
