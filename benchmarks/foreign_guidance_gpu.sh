#!/usr/bin/env bash
# One H200: value features on a kernel set kvfuzz did not write (tests/fixtures/kernels/foreign/team_tables*.py,
# literal blocks, its own names), where its trips come from the op and the launch (fuzz/engine/spec_features.py).
# a: the collection cost on CUDA (guided_vs_blind --parts overhead --kernels: the same blind sequences bare, with
#    the value features collected in the hook, and deferred to the op's end as the guided track collects there);
# b: the third-trip and kv_start fixtures killed on CUDA, blind against guided, work-bounded (kill-ops).
# Usage: OUT=$OUT bash benchmarks/foreign_guidance_gpu.sh
set -u
. benchmarks/gpu_common.sh  # $OUT, $PY, step, environment
environment
step "a: collection cost, team_tables.py, CUDA"
timeout 200 $PY -m benchmarks.guided_vs_blind --backend cuda --parts overhead --ops 800 --rounds 3 \
  --kernels $FOREIGN/team_tables.py --note "one H200, nothing else running" --out "$OUT/overhead-cuda-team.json" 2>&1 \
  | grep -vi warn | tail -4 | cut -c1-500
step "b: kill-ops on CUDA, 3 seeds, at most 1500 ops"
timeout 200 $PY -m benchmarks.guided_vs_blind --backend cuda --parts kill-ops --seeds 3 --max-ops 1500 \
  --fixtures kernels=$FOREIGN/team_tables_third_trip.py,kernels=$FOREIGN/team_tables_kv_start.py \
  --note "one H200, nothing else running" --out "$OUT/kill-ops-cuda-team.json" 2>&1 | grep -E "median|Error" | cut -c1-300
