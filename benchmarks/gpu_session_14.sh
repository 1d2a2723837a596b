#!/usr/bin/env bash
# The GPU session of 2026-12-03 (s14, one H200), one device call; logs and JSON to $OUT:
# CUDA tests; the hook per launch on recorded CUDA launches (guided_vs_blind --parts hook); the collection
# cost attributed inside real sequences, bare / observed (an observer that does nothing: every
# launch described) / collected (a collector alone: launches handed over light), twice; value
# features' collection cost (guided_vs_blind --parts overhead, 6 ABBA rounds), twice; indep's
# default mix (scale_gpu).
# b: once the memo keys kernels by id and a collector skips the entries it took: CUDA tests, the
#    hook per launch, the cost attributed, and the collection cost A/B against the tree of s13
#    (aa7b101, before the light path) in alternating runs, each in its own process
set -u
PART=${1:-a}
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment, cuda_tests, collection_cost
if [ "$PART" = c ]; then  # c: the final tree (the timing audit merged): CUDA tests, the collection cost twice more
  {
    environment
    cuda_tests "the final tree"
    for r in 4 5; do
      step "collection cost, new tree, run $r (guided_vs_blind --parts overhead --ops 1500 --rounds 4)"
      collection_cost 4 "$OUT/c-overhead-new-$r.json" "tree new"
    done
  } 2>&1 | tee "$OUT/session-c.log"
  exit 0
fi
if [ "$PART" = b ]; then
  {
    environment
    cuda_tests "memo keyed by id; taken entries skipped"
    step "the hook per launch on recorded CUDA launches (guided_vs_blind --parts hook)"
    timeout 150 $PY -m benchmarks.guided_vs_blind --backend cuda --parts hook --out "$OUT/b-hook.json" 2>&1 | grep -vi warn | tail -1
    step "the collection cost attributed (profile_collect --attribute --rounds 6)"
    timeout 200 $PY benchmarks/profile_collect.py --backend cuda --seqs 15 --attribute --rounds 6 --out "$OUT/b-attribute.json" 2>&1 | grep -vi warn | tail -1 | cut -c1-1200
    old=/tmp/kvfuzz-aa7b101
    mkdir -p $old && git archive aa7b101 | tar -x -C $old && cp benchmarks/guided_vs_blind.py $old/benchmarks/ \
      && echo "the tree of aa7b101 in $old, with this tree's benchmark (each round its own seeds)"
    for r in 1 2 3; do
      for tree in old new; do
        step "collection cost, $tree tree, run $r (guided_vs_blind --parts overhead --ops 1500 --rounds 4)"
        dir=.; [ $tree = old ] && dir=$old
        (cd $dir && collection_cost 4 "$OUT/b-overhead-$tree-$r.json" "tree $tree")  # PYTHONPATH is .
      done
    done
  } 2>&1 | tee "$OUT/session-b.log"
  exit 0
fi
{
  environment
  cuda_tests "the light launch path"
  step "the hook per launch on recorded CUDA launches, full and light (guided_vs_blind --parts hook)"
  timeout 150 $PY -m benchmarks.guided_vs_blind --backend cuda --parts hook --out "$OUT/hook.json" 2>&1 | grep -vi warn | tail -1
  for r in 1 2; do
    step "the collection cost attributed, run $r (profile_collect --attribute --rounds 6)"
    timeout 200 $PY benchmarks/profile_collect.py --backend cuda --seqs 15 --attribute --rounds 6 --out "$OUT/attribute-$r.json" 2>&1 | grep -vi warn | tail -1 | cut -c1-1200
  done
  for r in 1 2; do
    step "value features' collection cost on CUDA, run $r (guided_vs_blind --parts overhead --ops 1500 --rounds 6)"
    collection_cost 6 "$OUT/overhead-$r.json"
  done
  step "indep default mix (scale_gpu)"
  cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
  timeout 240 $PY benchmarks/scale_gpu.py --only indep/mixed --compile-ahead on --ahead-sequences 160 \
    --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants --out "$OUT/scale-indep.json" 2>&1 | grep -vi warn | tail -4 | cut -c1-900
} 2>&1 | tee "$OUT/session.log"
