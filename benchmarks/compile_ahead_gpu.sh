#!/usr/bin/env bash
# Issue 25 item 1 on a GPU: compiling before the clock (fuzz/engine/production/ahead.py), on and off
# side by side; logs and JSON go to $OUT (default benchmarks/results/gpu-run). Parts, in this order
# (the first matter most, so a device call cut short keeps them):
#   indep:    benchmarks/scale_gpu.py --seconds 10 --warmup 8 on indep.py, read-heavy and default mix,
#             each phase in a fresh process with a fresh, empty TRITON_CACHE_DIR: --compile-ahead off, then on
#   campaign: kvfuzz run --backend cuda --scale production --kernels indep.py --budget-s 30 --workers 1,
#             --compile-ahead off then on, each with a fresh --cache-dir (its summary: compiles, compile_s,
#             loads, ops, compile_ahead)
#   kvkernels: as indep, for kvkernels
# then a table of all of them (benchmarks/compile_ahead_report.py -> $OUT/compile-ahead.json).
# Usage: bash benchmarks/compile_ahead_gpu.sh [all|indep|campaign|kvkernels|report]   (all: about 8 minutes)
# Knobs: SECONDS_PER (10), WARMUP (8), AHEAD_SEQ (96: timed sequences scouted), BUDGET (30).
set -u
PART=${1:-all}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step
SECONDS_PER=${SECONDS_PER:-10}
WARMUP=${WARMUP:-8}
AHEAD_SEQ=${AHEAD_SEQ:-96}
BUDGET=${BUDGET:-30}
want() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
scale_pair() {  # SET: both phases of one set, compile-ahead off then on, each cold
  for phase in throughput mixed; do
    for ca in off on; do
      cache=$(mktemp -d /tmp/kvfuzz-ca-cache-XXXXXX)
      step "scale_gpu $1/$phase, compile-ahead $ca"
      timeout 170 $PY benchmarks/scale_gpu.py --only "$1/$phase" --compile-ahead $ca --ahead-sequences "$AHEAD_SEQ" \
        --cache-dir "$cache" --seconds "$SECONDS_PER" --warmup "$WARMUP" --no-variants \
        --out "$OUT/scale-$1-$phase-$ca.json" 2>&1 | grep -vi warn | tail -4 | cut -c1-700
      rm -rf "$cache"
    done
  done
}
{
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import os, torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0), "cpus", os.cpu_count())'
  git log -1 --format=%h 2>/dev/null || true
  if want indep; then scale_pair indep; fi
  if want campaign; then
    for ca in off on; do
      cache=$(mktemp -d /tmp/kvfuzz-ca-cache-XXXXXX)
      step "kvfuzz run indep.py, production, 1 worker, ${BUDGET} s, compile-ahead $ca"
      start=$(date +%s)
      timeout $((BUDGET + 200)) $PY -m fuzz run --backend cuda --scale production --kernels "$FOREIGN/indep.py" \
        --workers 1 --budget-s "$BUDGET" --compile-ahead $ca --cache-dir "$cache" --out "/tmp/kvfuzz-ca-out-$ca" \
        --summary "$OUT/campaign-indep-$ca.json" --progress-s 10 2>&1 | grep -vi warn | tail -6 | cut -c1-700
      echo "process wall: $(( $(date +%s) - start )) s"
      rm -rf "$cache" "/tmp/kvfuzz-ca-out-$ca"
    done
  fi
  if want kvkernels; then scale_pair kvkernels; fi
  step "table"
  $PY benchmarks/compile_ahead_report.py "$OUT"
} 2>&1 | tee "$OUT/session-compile-ahead-$PART.log"
