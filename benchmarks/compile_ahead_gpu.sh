#!/usr/bin/env bash
# Compiling before the clock on a GPU (fuzz/engine/production/ahead.py), on and off
# side by side; logs and JSON go to $OUT (default benchmarks/results/gpu-run). Parts, in this order
# (the first matter most, so a device call cut short keeps them):
#   indep:     benchmarks/scale_gpu.py --seconds 10 --warmup 8 on indep.py, read-heavy and default mix,
#              each phase in a fresh process with a fresh, empty TRITON_CACHE_DIR: --compile-ahead off, then on
#   campaign:  kvfuzz run --backend cuda --scale production --kernels indep.py --budget-s 30 --workers 1,
#              --compile-ahead off then on, each with a fresh --cache-dir (its summary: compiles, compile_s,
#              loads, ops, compile_ahead)
#   kvkernels: as indep, for kvkernels
#   report:    the table of all of them (benchmarks/compile_ahead_report.py -> $OUT/compile-ahead.json)
# and two parts not in the default: follow (the campaign with --compile-ahead follow: later sequences
# compiled while the worker runs) and growth (distinct specializations per scouted sequence, indep and
# kvkernels, 48 sequences: benchmarks/compile_ahead_growth.py; no compile).
# Usage: bash benchmarks/compile_ahead_gpu.sh [PART...]   (default: indep campaign kvkernels report, about
# 8-9 minutes; then e.g. "follow growth report" in a second call)
# Knobs: SECONDS_PER (10), WARMUP (8), AHEAD_SEQ (96: timed sequences scouted), BUDGET (30).
set -u
PARTS=${*:-indep campaign kvkernels report}
OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
unset TRITON_INTERPRET
PY=${PY:-python3}
FOREIGN=tests/fixtures/kernels/foreign
step() { echo; echo "== $*  ($(date -u +%T))"; }
SECONDS_PER=${SECONDS_PER:-10}
WARMUP=${WARMUP:-8}
AHEAD_SEQ=${AHEAD_SEQ:-96}
BUDGET=${BUDGET:-30}
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
scale_pair() {  # SET: both phases of one set, compile-ahead off then on, each cold
  for phase in throughput mixed; do
    for ca in off on; do
      cache=$(mktemp -d /tmp/kvfuzz-ca-cache-XXXXXX)
      step "scale_gpu $1/$phase, compile-ahead $ca"
      timeout 170 $PY benchmarks/scale_gpu.py --only "$1/$phase" --compile-ahead $ca --ahead-sequences "$AHEAD_SEQ" \
        --cache-dir "$cache" --seconds "$SECONDS_PER" --warmup "$WARMUP" --no-variants \
        --out "$OUT/scale-$1-$phase-$ca.json" 2>&1 | grep -vi warn | tail -6 | cut -c1-900
      rm -rf "$cache"
    done
  done
}
campaign_runs() {  # MODE...: the one-worker indep campaign, each with a fresh cache
  for ca in "$@"; do
    cache=$(mktemp -d /tmp/kvfuzz-ca-cache-XXXXXX)
    step "kvfuzz run indep.py, production, 1 worker, ${BUDGET} s, compile-ahead $ca"
    start=$(date +%s)
    timeout $((BUDGET + 200)) $PY -m fuzz run --backend cuda --scale production --kernels "$FOREIGN/indep.py" \
      --workers 1 --budget-s "$BUDGET" --compile-ahead "$ca" --cache-dir "$cache" --out "/tmp/kvfuzz-ca-out-$ca" \
      --summary "$OUT/campaign-indep-$ca.json" --progress-s 10 2>&1 | grep -vi warn | tail -6 | cut -c1-700
    echo "process wall: $(( $(date +%s) - start )) s"
    rm -rf "$cache" "/tmp/kvfuzz-ca-out-$ca"
  done
}
{
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import os, torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0), "cpus", os.cpu_count())'
  git log -1 --format=%h 2>/dev/null || true
  if want indep; then scale_pair indep; fi
  if want campaign; then campaign_runs off on; fi
  if want kvkernels; then scale_pair kvkernels; fi
  if want follow; then campaign_runs follow; fi
  if want growth; then
    for set in "$FOREIGN/indep.py" kvkernels; do
      step "specializations per scouted sequence: $set"
      timeout 150 $PY benchmarks/compile_ahead_growth.py --kernels "$set" --sequences 48 \
        --out "$OUT/growth-$(basename "$set" .py).json" 2>&1 | grep -vi warn | awk 'NR % 8 == 0' | tail -8
    done
  fi
  if want report; then
    step "table"
    $PY benchmarks/compile_ahead_report.py "$OUT"
  fi
} 2>&1 | tee "$OUT/session-compile-ahead-$(echo $PARTS | tr ' ' '-').log"
