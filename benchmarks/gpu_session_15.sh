#!/usr/bin/env bash
# The GPU session of 2026-12-03 (s15, one H200), one device call per part; logs and JSON to $OUT.
# a: CUDA tests on the tree with the deferred collector; value features' collection cost, the
#    three modes in one process, every order in turn per sequence (bare, collected at each launch as
#    s14 did, deferred to the op's end as the guided track now does on CUDA), four runs.
set -u
PART=${1:-a}
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment, cuda_tests, collection_cost
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
