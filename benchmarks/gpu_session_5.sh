#!/usr/bin/env bash
# The GPU session of 2026-12-02 (one H200, torch 2.11, Triton 3.6): each PART fits one device call;
# logs and JSON go to $OUT.
#   baseline: issue 25 before its changes: the mutant catalogue's time to kill on CUDA with a cold
#             then a warm Triton cache; small shapes fully checked with 1, 2, 4, 8 workers (warm
#             cache); one worker's profile (benchmarks/profile_tier.py)
#   final:    after the session's changes (fork server, compile-ahead, spare executor): the fork
#             server's tests under Triton 3.6, pytest -m "cuda and not slow", seconds to the first
#             case over the mutant catalogue cold and warm (benchmarks/first_case.py), small shapes
#             with 1 and 8 workers, kvkernels read-heavy with compile-ahead, the indep campaign with
#             --compile-ahead follow
set -u
PART=${1:-baseline}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step, campaign
{
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
  nproc
  if [ "$PART" = baseline ]; then
    export TRITON_CACHE_DIR=/tmp/kvfuzz-cache-mutants
    rm -rf "$TRITON_CACHE_DIR"
    step "mutants on CUDA, cold cache, 15 s each"
    timeout 280 $PY -m fuzz mutants --backend cuda --budget-s 15 2>&1 | tail -25
    step "mutants on CUDA, warm cache, 15 s each"
    timeout 280 $PY -m fuzz mutants --backend cuda --budget-s 15 2>&1 | tail -25
    export TRITON_CACHE_DIR=/tmp/kvfuzz-cache-small
    step "small shapes, warm-up campaign (compiles into the cache)"
    timeout 100 $PY -m fuzz run --backend cuda --budget-s 15 --workers 8 --out /tmp/warm --summary "$OUT/small-warm.json" --progress-s 1000 2>&1 | grep -E "^kvfuzz run" | cut -c1-400
    for w in 1 2 4 8; do
      step "small shapes, $w workers, 20 s"
      timeout 100 $PY -m fuzz run --backend cuda --budget-s 20 --workers $w --out /tmp/small-$w --summary "$OUT/small-$w.json" --progress-s 1000 2>&1 | grep -E "^kvfuzz run" | cut -c1-400
      $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('ops','sequences','elapsed_s','ops_per_s','compiles','compile_s','stopped_by','workers')})" "$OUT/small-$w.json" 2>&1 | cut -c1-400
    done
    step "one worker's profile (cProfile, 12 s)"
    timeout 120 $PY benchmarks/profile_tier.py --backend cuda --seconds 12 --top 30 2>&1 | tail -45
  fi
  if [ "$PART" = final ]; then
    step "fork server tests under this Triton"
    timeout 150 $PY -m pytest -q -p no:cacheprovider -n 4 tests/fuzz/test_zygote.py 2>&1 | tail -3
    step "first case over the mutant catalogue, cold then warm (benchmarks/first_case.py)"
    timeout 200 $PY benchmarks/first_case.py --backend cuda --scale small --cold --warm --budget-s 20 \
      --note "one H200, nothing else running" --out /tmp/fc > /tmp/fc.log 2>&1; echo "exit $?"
    tail -30 /tmp/fc/first_case.md 2>/dev/null || tail -20 /tmp/fc.log
    cp /tmp/fc/first_case.json "$OUT/first-case-cuda.json" 2>/dev/null; cp /tmp/fc.log "$OUT/first-case-cuda.log"
    export TRITON_CACHE_DIR=/tmp/kvfuzz-cache-small
    for w in 1 8; do
      step "small shapes, $w workers, 15 s"
      nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 > /tmp/util-$w.txt 2>/dev/null &
      smi=$!
      timeout 80 $PY -m fuzz run --backend cuda --budget-s 15 --workers $w --out /tmp/small-$w --summary /tmp/small-$w.json --progress-s 1000 2>&1 | grep -E "^kvfuzz run" | cut -c1-500
      kill $smi 2>/dev/null
      echo "GPU utilization % (0.5 s samples): $(tr '\n' ' ' < /tmp/util-$w.txt | cut -c1-400)"
      top -bn1 | head -5 | tail -3
    done
    step "one worker's profile (cProfile, 8 s)"
    timeout 60 $PY benchmarks/profile_tier.py --backend cuda --seconds 8 --top 22 2>&1 | tail -30 | cut -c1-200
    step "kvkernels read-heavy, compile-ahead on (scale_gpu)"
    cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
    timeout 120 $PY benchmarks/scale_gpu.py --only kvkernels/throughput --compile-ahead on --ahead-sequences 96 \
      --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants --out "$OUT/scale-kvkernels-throughput-on.json" 2>&1 | grep -vi warn | tail -3 | cut -c1-700
    step "pytest -m 'cuda and not slow'"
    timeout 150 $PY -m pytest -q -p no:cacheprovider -n 8 -m "cuda and not slow" tests 2>&1 | grep -v Warning | tail -8
  fi
} 2>&1 | tee "$OUT/session-$PART.log"
