#!/usr/bin/env bash
# The GPU session of 2026-12-03 (s13, one H200): each PART fits one device call; logs and JSON to $OUT.
#   a: pytest -m "cuda and not slow"; where the collection cost of value features goes on CUDA
#      (profile_collect) and what it is (guided_vs_blind --parts overhead); indep's default mix
#      (scale_gpu) once a size candidate's tag is built only when drawn
#   c: CUDA tests; the collection cost attributed (profile_collect --attribute: the hook's own seconds
#      and the garbage collector's, per mode)
#   b: the collection cost in 6 rounds a run (ABBA) once the hook memoizes a launch's features under
#      one key; indep's default mix: where the device's and the host's time go (profile_gpu), and
#      its figure again
set -u
PART=${1:-a}
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment, cuda_tests, collection_cost
{
  environment
  [ "$PART" = a ] && cuda_tests "the budget module split; lazy size tags"
  if [ "$PART" = c ]; then
    cuda_tests "one memo entry per launch key"
    for r in 1 2; do
      step "the collection cost attributed, run $r (profile_collect --attribute --rounds 4)"
      timeout 200 $PY benchmarks/profile_collect.py --backend cuda --seqs 15 --attribute --rounds 4 --out "$OUT/attribute-$r.json" 2>&1 | grep -vi warn | tail -2 | cut -c1-700
    done
    exit 0
  fi
  if [ "$PART" = a ]; then
    step "the collection cost's profile on CUDA (profile_collect)"
    timeout 200 $PY benchmarks/profile_collect.py --backend cuda --seqs 15 --out "$OUT/profile-collect.json" 2>&1 | grep -vi warn | tail -26 | cut -c1-300
  fi
  rounds=2; [ "$PART" = b ] && rounds=6
  for r in 1 2; do
    step "value features' collection cost on CUDA, run $r (guided_vs_blind --parts overhead --ops 1500 --rounds $rounds)"
    collection_cost $rounds "$OUT/overhead-$r.json"
  done
  if [ "$PART" = b ]; then
    for part in kernels host; do
      step "indep default mix: $part (profile_gpu)"
      timeout 200 $PY benchmarks/profile_gpu.py $part --set indep --mix default --seconds 6 --top 22 \
        --out "$OUT/profile-indep-default-$part.json" 2>&1 | grep -vi "warn\|USDT" | tail -34 | cut -c1-260
    done
  fi
  step "indep default mix (scale_gpu)"
  cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
  timeout 240 $PY benchmarks/scale_gpu.py --only indep/mixed --compile-ahead on --ahead-sequences 160 \
    --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants --out "$OUT/scale-indep.json" 2>&1 | grep -vi warn | tail -4 | cut -c1-900
} 2>&1 | tee "$OUT/session-$PART.log"
