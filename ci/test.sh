#!/usr/bin/env bash
# Pre-merge job: set up, then the whole test suite (spec, kernels on the interpreter
# tier, allocator, fuzz engine, no-sync checks, regression corpus) and the static
# no-host-sync check of our allocator.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash ci/setup.sh)
# --dist worksteal: an idle worker takes queued tests from a busy one, so the long campaign
# tests do not queue behind each other on one worker while the other has run dry.
"$PY" -m pytest -n "${KVFUZZ_TEST_WORKERS:-2}" --dist worksteal "$@"
"$PY" -m fuzz check-sync
