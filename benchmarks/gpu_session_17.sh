#!/usr/bin/env bash
# One H200, session s17: issue 25's first case on today's tree (s10 measured it last, 1.8 s warm /
# 11.4 s cold; the tree has had the flaky-audit, host-ops and deferred-collector work since).
# b: the nightly's guided step on CUDA as ci/nightly.sh runs it (ci/fuzz.sh with KVFUZZ_CORPUS, 4
#    workers, --check-every 16), two nights of 40 s on one corpus, then kvfuzz coverage over it.
# c: read tables' trips features on CUDA from the host copy of seq_lens (features.host_copy): the CUDA
#    tests, the collection cost three times, and one guided night + its coverage (trips now listed).
# Usage: OUT=$OUT bash benchmarks/gpu_session_17.sh [b|c]
set -u
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment, first_case_cuda
night() {  # night N CORPUS SECONDS: ci/fuzz.sh as ci/nightly.sh runs its guided step
  KVFUZZ_NO_VENV=1 KVFUZZ_BACKEND=cuda KVFUZZ_CORPUS=$2 KVFUZZ_BUDGET_S=$3 KVFUZZ_WORKERS=4 \
    KVFUZZ_CHECK_EVERY=16 KVFUZZ_SEED=$1 KVFUZZ_OUT="$OUT/${PART}-night$1" timeout 200 bash ci/fuzz.sh 2>&1 \
    | grep -vi warn | tail -4 | cut -c1-600
  echo "exit ${PIPESTATUS[0]}; corpus entries: $(ls $2/*.json 2>/dev/null | wc -l)"
}
PART=${1:-a}
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
    for night in 1 2; do
      step "guided night $night (ci/fuzz.sh, KVFUZZ_CORPUS=$corpus, 40 s, 4 workers, check-every 16)"
      KVFUZZ_NO_VENV=1 KVFUZZ_BACKEND=cuda KVFUZZ_CORPUS=$corpus KVFUZZ_BUDGET_S=40 KVFUZZ_WORKERS=4 \
        KVFUZZ_CHECK_EVERY=16 KVFUZZ_SEED=$night KVFUZZ_OUT="$OUT/b-night$night" timeout 200 bash ci/fuzz.sh 2>&1 \
        | grep -vi warn | tail -4 | cut -c1-600
      echo "exit ${PIPESTATUS[0]}; corpus entries: $(ls $corpus/*.json 2>/dev/null | wc -l)"
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
