#!/usr/bin/env bash
# One H200, session s17: issue 25's first case on today's tree (s10 measured it last, 1.8 s warm /
# 11.4 s cold; the tree has had the flaky-audit, host-ops and deferred-collector work since).
# Usage: OUT=$OUT bash benchmarks/gpu_session_17.sh
set -u
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment, first_case_cuda
{
  environment
  first_case_cuda 560
} 2>&1 | tee "$OUT/session.log"
