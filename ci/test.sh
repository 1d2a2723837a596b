#!/usr/bin/env bash
# Pre-merge job: set up, then the whole test suite (spec, kernels on the interpreter
# tier, allocator, fuzz engine, no-sync checks, regression corpus) and the static
# no-host-sync check of our allocator.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash ci/setup.sh)
# The suite's own fork daemons (fuzz/engine/zygote/daemon.py): one preload of torch and Triton
# per Triton mode serves every campaign the tests start, where each command would pay its own
# (about 2 CPU s, over a hundred commands). A private socket directory, removed at the end:
# its daemons see their socket gone and exit within seconds, leaving nothing behind the job.
KVFUZZ_ZYGOTE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/kvfuzz-ci-zygote.XXXXXX")
export KVFUZZ_ZYGOTE_DIR
trap 'rm -rf "$KVFUZZ_ZYGOTE_DIR"' EXIT
# --dist worksteal: an idle worker takes queued tests from a busy one, so the long campaign
# tests do not queue behind each other on one worker while the other has run dry.
# One worker more than the cores: a campaign test spends part of its time waiting (for an
# op-timeout, a child's start), and the extra worker runs another test meanwhile. On 2 cores
# -n 3 and -n 4 take the same time: more workers only add their own start-up, the suite being
# bound by CPU by then.
"$PY" -m pytest -n "${KVFUZZ_TEST_WORKERS:-$(( $(nproc) + 1 ))}" --dist worksteal "$@"
"$PY" -m fuzz check-sync
