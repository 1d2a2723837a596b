#!/usr/bin/env bash
# One H200, session s17: issue 25's first case on today's tree (s10 measured it last, 1.8 s warm /
# 11.4 s cold; the tree has had the flaky-audit, host-ops and deferred-collector work since).
# b: the nightly's guided step on CUDA as ci/nightly.sh runs it (ci/fuzz.sh with KVFUZZ_CORPUS, 4
#    workers, --check-every 16), two nights of 40 s on one corpus, then kvfuzz coverage over it.
# Usage: OUT=$OUT bash benchmarks/gpu_session_17.sh [b]
set -u
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment, first_case_cuda
if [ "${1:-a}" = b ]; then
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
