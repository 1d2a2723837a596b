#!/usr/bin/env bash
# The nightly's campaigns on a whole GPU host: the blind small-scale campaign, the coverage-guided
# one and the production-scale one, each as one campaign per GPU (fuzz/tools/host.py; docs/host.md)
# merged into one result. ci/nightly.sh runs it in their place where it finds more than one GPU;
# it also runs on its own. Results in KVFUZZ_OUT (default nightly-out/): cases/, guided/,
# production/ (each: the merged case files, summary.json (kvfuzz-merge/1), junit.xml, host.json
# with each GPU's figures, and each GPU's own output under gpus/), one corpus (KVFUZZ_CORPUS, the
# union of the GPUs') and coverage.txt.
# Knobs as ci/nightly.sh's: KVFUZZ_BUDGET_S, KVFUZZ_GUIDED_S, KVFUZZ_PRODUCTION_S, KVFUZZ_SEED,
# KVFUZZ_SHARD (this host's I/M of several hosts), KVFUZZ_KERNELS, KVFUZZ_BASELINE, KVFUZZ_CORPUS,
# KVFUZZ_CACHE_DIR, KVFUZZ_CHECK_EVERY, KVFUZZ_OP_TIMEOUT; and KVFUZZ_HOST_LAYOUT (shards: a
# campaign per GPU, the default; workers: one campaign over every GPU), KVFUZZ_WORKERS_PER_GPU
# (default 4; simulated, the cores over the campaigns; production: 1, as ci/nightly.sh's),
# KVFUZZ_BACKEND, KVFUZZ_MAX_SEQUENCES (the host's, each campaign: work instead of seconds),
# KVFUZZ_SIMULATE_GPUS=N (N CPU campaigns stand in for N GPUs: a dry run of the whole night),
# KVFUZZ_RUN_ARGS (more kvfuzz run options for every campaign, e.g. "--ops-per-sequence 8").
# Exit 1 if any step failed (a new failure, or a campaign that did not end cleanly).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=$(bash ci/setup.sh) || exit 2
OUT=${KVFUZZ_OUT:-nightly-out}
SEED=${KVFUZZ_SEED:-$(date +%Y%m%d)}
CORPUS=${KVFUZZ_CORPUS:-$HOME/.cache/kvfuzz/corpus}
CHECK_EVERY=${KVFUZZ_CHECK_EVERY:-$([ -z "${KVFUZZ_SIMULATE_GPUS:-}" ] && [ "${KVFUZZ_BACKEND:-cuda}" = cuda ] \
  && echo 16 || echo 1)}  # 16: the GPU throughput mode, as ci/nightly.sh's
mkdir -p "$OUT"
status=0
# KVFUZZ_RUN_ARGS is left unquoted: split into its options.
host() {
  "$PY" -m fuzz.tools.host --layout "${KVFUZZ_HOST_LAYOUT:-shards}" --shard "${KVFUZZ_SHARD:-0/1}" \
    ${KVFUZZ_BACKEND:+--backend "$KVFUZZ_BACKEND"} ${KVFUZZ_MAX_SEQUENCES:+--max-sequences "$KVFUZZ_MAX_SEQUENCES"} \
    --baseline "${KVFUZZ_BASELINE:-}" --kernels "${KVFUZZ_KERNELS:-kvkernels}" --seed "$SEED" \
    --check-every "$CHECK_EVERY" --op-timeout "${KVFUZZ_OP_TIMEOUT:-auto}" \
    ${KVFUZZ_WORKERS_PER_GPU:+--workers-per-gpu "$KVFUZZ_WORKERS_PER_GPU"} ${KVFUZZ_RUN_ARGS:-} "$@"
}
HOSTILE=${KVFUZZ_HOSTILE:-$([ -n "${KVFUZZ_KERNELS:-}" ] && echo spec || echo all)}
host --out "$OUT/cases" --hostile "$HOSTILE" \
  --budget-s "${KVFUZZ_BUDGET_S:-3600}" || status=1
host --out "$OUT/guided" --hostile "$HOSTILE" --corpus "$CORPUS" \
  --budget-s "${KVFUZZ_GUIDED_S:-1800}" || status=1
"$PY" -m fuzz coverage "$CORPUS" > "$OUT/coverage.txt" || status=1
host --out "$OUT/production" --workers-per-gpu 1 --scale production --budget-s "${KVFUZZ_PRODUCTION_S:-1800}" \
  --cache-dir "${KVFUZZ_CACHE_DIR:-$HOME/.cache/kvfuzz/triton}" || status=1
exit $status
