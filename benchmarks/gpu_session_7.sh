#!/usr/bin/env bash
# The GPU session of 2026-12-02 (s7, one H200): each PART fits one device call; logs and JSON to $OUT.
#   check:  the fork daemon's, the fork server's, the torch-free parent's and the closed-form
#           preflight's tests under this Python and Triton; pytest -m "cuda and not slow";
#           scale_gpu.py's four throughput phases (kvkernels and indep, read-heavy and default
#           mix) with the closed-form preflight; small shapes with 1 and 8 workers
#   more:   the guided track's collection cost on CUDA (value features only); the first case on a
#           cold Triton cache with the fork daemon an earlier command left (a cold cache alone)
#   first:  seconds to the first case over the mutant catalogue: cold (empty Triton cache, no
#           fork daemon) and warm (the cache filled, the daemon an earlier command left)
set -u
PART=${1:-check}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step, campaign, util, environment
{
  environment
  if [ "$PART" = check ]; then
    step "daemon, fork server, torch-free parent, preflight tests under this Triton"
    timeout 200 $PY -m pytest -q -p no:cacheprovider -n 8 -rf tests/fuzz/test_zygote_daemon.py tests/fuzz/test_zygote.py \
      tests/fuzz/test_lazy_torch.py tests/fuzz/test_preflight.py 2>&1 | grep -E "passed|failed|FAILED|Error" | head -12
    step "pytest -m 'cuda and not slow'"
    timeout 200 $PY -m pytest -q -p no:cacheprovider -n 8 -rf -m "cuda and not slow" tests 2>&1 | grep -E "passed|failed|FAILED" | head -12
    step "throughput: kvkernels and indep, read-heavy and default mix (scale_gpu, compile-ahead on)"
    cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
    smi=$(util scale)
    timeout 240 $PY benchmarks/scale_gpu.py --only kvkernels/throughput,kvkernels/mixed,indep/throughput,indep/mixed \
      --compile-ahead on --ahead-sequences 96 --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants \
      --out "$OUT/scale-throughput.json" 2>&1 | grep -vi warn | tail -6 | cut -c1-900
    kill "$smi" 2>/dev/null
    echo "GPU utilization % (0.5 s samples): $(tr '\n' ' ' < /tmp/util-scale.txt | cut -c1-900)"
    export TRITON_CACHE_DIR=/tmp/kvfuzz-cache-small
    small_shapes 15 1 8
  fi
  if [ "$PART" = more ]; then
    step "guided collection cost on CUDA, value features only (guided_vs_blind --parts overhead)"
    timeout 200 $PY benchmarks/guided_vs_blind.py --backend cuda --parts overhead --ops 3000 \
      --note "one H200, nothing else running" --out "$OUT/guided-overhead-cuda.json" 2>&1 | grep -v -i warn | tail -4
    [ "${2:-}" = overhead-only ] && exit 0
    step "first case, cold Triton cache, the fork daemon already running (first_case.py --cold-daemon shared)"
    timeout 300 $PY benchmarks/first_case.py --backend cuda --scale small --cold --cold-daemon shared --budget-s 20 \
      --note "one H200, nothing else running; cold Triton cache, fork daemon left by an earlier command" \
      --out /tmp/fc2 > "$OUT/first-case-cuda-cold-shared.log" 2>&1
    echo "exit $?"
    tail -5 /tmp/fc2/first_case.md 2>/dev/null || tail -5 "$OUT/first-case-cuda-cold-shared.log"
    cp /tmp/fc2/first_case.json "$OUT/first_case-cold-shared.json" 2>/dev/null
    cp /tmp/fc2/first_case.md "$OUT/first_case-cold-shared.md" 2>/dev/null
  fi
  if [ "$PART" = first ]; then
    step "what the parent of a CUDA campaign imports (-X importtime, parent only)"
    timeout 60 $PY -X importtime -m fuzz run --backend cuda --budget-s 3 --out /tmp/it --progress-s 1000 2> /tmp/it.txt | cut -c1-300
    grep -E "\| (torch|triton|numpy)$" /tmp/it.txt || echo "no torch, triton or numpy in the parent"
    timeout 60 $PY -m pytest -q -p no:cacheprovider tests/fuzz/test_lazy_torch.py 2>&1 | tail -1
    step "first case over the mutant catalogue, cold then warm (benchmarks/first_case.py, fork daemon)"
    timeout 540 $PY benchmarks/first_case.py --backend cuda --scale small --cold --warm --budget-s 20 \
      --note "one H200, nothing else running; fork daemon (default): cold = no daemon, warm = one left running" \
      --out /tmp/fc > "$OUT/first-case-cuda.log" 2>&1
    echo "exit $?"
    tail -8 /tmp/fc/first_case.md 2>/dev/null || tail -5 "$OUT/first-case-cuda.log"
    cp /tmp/fc/first_case.json /tmp/fc/first_case.md "$OUT/" 2>/dev/null
  fi
} 2>&1 | tee "$OUT/session-$PART.log"
