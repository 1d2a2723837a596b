#!/usr/bin/env bash
# One H200, session s17: issue 25's first case on today's tree (s10 measured it last, 1.8 s warm /
# 11.4 s cold; the tree has had the flaky-audit, host-ops and deferred-collector work since).
# b: the nightly's guided step on CUDA as ci/nightly.sh runs it (ci/fuzz.sh with KVFUZZ_CORPUS, 4
#    workers, --check-every 16), two nights of 40 s on one corpus, then kvfuzz coverage over it.
# c: read tables' trips features on CUDA from the host copy of seq_lens (features.host_copy): the CUDA
#    tests, the collection cost three times, and one guided night + its coverage (trips now listed).
# d: guided nights on CUDA with and without the trips features, A/B: the tree before them (2646ab5, sent
#    as the untracked benchmarks/old-trips.tar) and this one, alternating, each night 30 s on a fresh
#    corpus of its own, after a 20 s night that fills the Triton cache.
# e: the third-trip fixtures on CUDA, guided (with its trips features now) against blind: ops to kill,
#    seeds 0-5, up to 4,000 ops (guided_vs_blind --backend cuda --parts kill-ops).
# Usage: OUT=$OUT bash benchmarks/gpu_session_17.sh [b|c|d|e]
set -u
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment, first_case_cuda
night() {  # night SEED CORPUS SECONDS [LABEL]: ci/fuzz.sh as ci/nightly.sh runs its guided step
  KVFUZZ_NO_VENV=1 KVFUZZ_BACKEND=cuda KVFUZZ_CORPUS=$2 KVFUZZ_BUDGET_S=$3 KVFUZZ_WORKERS=4 \
    KVFUZZ_CHECK_EVERY=16 KVFUZZ_SEED=$1 KVFUZZ_OUT="$OUT/${PART}-night${4:-$1}" timeout 200 bash ci/fuzz.sh 2>&1 \
    | grep -vi warn | tail -4 | cut -c1-600
  echo "exit ${PIPESTATUS[0]}; corpus entries: $(ls $2/*.json 2>/dev/null | wc -l)"
}
PART=${1:-a}
if [ "$PART" = e ]; then
  {
    environment
    step "third-trip fixtures on CUDA: ops to kill, guided against blind (seeds 0-5, <= 4000 ops)"
    timeout 320 $PY -m benchmarks.guided_vs_blind --backend cuda --parts kill-ops --seeds 6 --max-ops 4000 \
      --note "one H200, nothing else running" --out "$OUT/e-kill-ops.json" 2>&1 | grep -vi warn | cut -c1-300
  } 2>&1 | tee "$OUT/session-e.log"
  exit 0
fi
if [ "$PART" = d ]; then
  {
    environment
    old=/tmp/kvfuzz-2646ab5
    mkdir -p $old && tar -xf benchmarks/old-trips.tar -C $old && echo "the tree of 2646ab5 in $old"
    step "warm-up night, this tree, 20 s"
    night 0 /tmp/kvfuzz-corpus-warm 20
    for r in 1 2; do
      for tree in old new; do
        step "guided night, $tree tree, run $r (30 s, fresh corpus)"
        if [ $tree = old ]; then (cd $old && night "$r" /tmp/kvfuzz-corpus-$tree-$r 30 "$r$tree")
        else night "$r" /tmp/kvfuzz-corpus-$tree-$r 30 "$r$tree"; fi
        $PY -m fuzz coverage /tmp/kvfuzz-corpus-$tree-$r 2>&1 | head -1
      done
    done
  } 2>&1 | tee "$OUT/session-d.log"
  exit 0
fi
if [ "$PART" = c ]; then
  {
    environment
    cuda_tests "trips features from host copies"
    for r in 1 2 3; do
      step "collection cost, run $r (guided_vs_blind --parts overhead --ops 1500 --rounds 5)"
      collection_cost 5 "$OUT/c-overhead-$r.json" "trips from host copies"
    done
    step "guided night (ci/fuzz.sh, 40 s, 4 workers, check-every 16), then kvfuzz coverage"
    night 1 /tmp/kvfuzz-nightly-corpus-c 40
    $PY -m fuzz coverage /tmp/kvfuzz-nightly-corpus-c > "$OUT/c-coverage.txt" 2>&1
    echo "exit $?"; head -24 "$OUT/c-coverage.txt" | cut -c1-300
  } 2>&1 | tee "$OUT/session-c.log"
  exit 0
fi
if [ "$PART" = b ]; then
  {
    environment
    corpus=/tmp/kvfuzz-nightly-corpus
    for n in 1 2; do
      step "guided night $n (ci/fuzz.sh, KVFUZZ_CORPUS=$corpus, 40 s, 4 workers, check-every 16)"
      night $n $corpus 40
    done
    step "kvfuzz coverage over the corpus"
    $PY -m fuzz coverage $corpus > "$OUT/b-coverage.txt" 2>&1
    echo "exit $?"; head -30 "$OUT/b-coverage.txt" | cut -c1-300
  } 2>&1 | tee "$OUT/session-b.log"
  exit 0
fi
{
  environment
  first_case_cuda 560
} 2>&1 | tee "$OUT/session.log"
