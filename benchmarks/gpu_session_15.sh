#!/usr/bin/env bash
# The GPU session of 2026-12-03 (s15, one H200), one device call per part; logs and JSON to $OUT.
# a: CUDA tests on the tree with the deferred collector; value features' collection cost, the
#    three modes in one process, every order in turn per sequence (bare, collected at each launch as
#    s14 did, deferred to the op's end as the guided track now does on CUDA), four runs.
# b: the host-ops merge (draws, checks and the graph op's step inputs made cheaper on the host), A/B on
#    throughput: indep's default mix in the tree before it (10e6e12, sent as the untracked
#    benchmarks/old-10e6e12.tar: the device's .git lags) and this tree, alternating, twice each;
#    kvkernels' read-heavy phase in this tree once. Each run its own fresh Triton cache.
set -u
PART=${1:-a}
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment, cuda_tests, collection_cost
scale() {  # scale PHASE AHEAD FILE: scale_gpu.py's PHASE after a compile-ahead of AHEAD sequences into a fresh cache
  local cache; cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
  timeout 200 $PY benchmarks/scale_gpu.py --only "$1" --compile-ahead on --ahead-sequences "$2" \
    --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants --out "$3" 2>&1 | grep -vi warn | tail -3 | cut -c1-900
}
if [ "$PART" = b ]; then
  {
    environment
    old=/tmp/kvfuzz-10e6e12
    mkdir -p $old && tar -xf benchmarks/old-10e6e12.tar -C $old && echo "the tree of 10e6e12 in $old"
    for r in 1 2; do
      for tree in old new; do
        step "indep default mix, $tree tree, run $r (scale_gpu --only indep/mixed --ahead-sequences 160)"
        dir=.; [ $tree = old ] && dir=$old
        (cd $dir && scale indep/mixed 160 "$OUT/b-scale-indep-$tree-$r.json")  # PYTHONPATH is .
      done
    done
    step "kvkernels read-heavy, new tree (scale_gpu --only kvkernels/throughput --ahead-sequences 96)"
    scale kvkernels/throughput 96 "$OUT/b-scale-kvkernels-new.json"
  } 2>&1 | tee "$OUT/session-b.log"
  exit 0
fi
if [ "$PART" = a ]; then
  {
    environment
    cuda_tests "the deferred collector"
    for r in 1 2 3 4; do
      step "collection cost, run $r (guided_vs_blind --parts overhead --ops 1500 --rounds 5: bare, collected, deferred)"
      collection_cost 5 "$OUT/a-overhead-$r.json" "modes bare, collected, deferred"
    done
  } 2>&1 | tee "$OUT/session-a.log"
fi
