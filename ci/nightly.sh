#!/usr/bin/env bash
# Nightly job (GPU where present, else CPU): the test suite, a long fuzz campaign
# (sharded with KVFUZZ_SHARD=I/N across a CI matrix or a Slurm/Kubernetes array), the
# mutant catalogue (kill rate), and kvfuzz bench. Results land in KVFUZZ_OUT (default
# nightly-out/): case files, mutants.txt, bench.json. Exit 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=$(bash ci/setup.sh) || exit 2
OUT=${KVFUZZ_OUT:-nightly-out}
mkdir -p "$OUT"
status=0
"$PY" -m pytest -q -n "${KVFUZZ_TEST_WORKERS:-2}" || status=1
KVFUZZ_NO_VENV=1 KVFUZZ_OUT="$OUT/cases" KVFUZZ_BUDGET_S="${KVFUZZ_BUDGET_S:-3600}" PATH="$(dirname "$PY"):$PATH" \
  bash ci/fuzz.sh || status=1
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then BACKEND=cuda; else BACKEND=interpret; fi
"$PY" -m fuzz mutants --backend "$BACKEND" --budget-s "${KVFUZZ_MUTANT_S:-60}" | tee "$OUT/mutants.txt" || status=1
"$PY" -m fuzz bench --seconds 30 --out "$OUT/bench.json" || status=1
exit $status
