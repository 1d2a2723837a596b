#!/usr/bin/env bash
# The GPU session of 2026-12-01 (third session; one H200, torch 2.11, Triton 3.6): each PART fits
# one device call; logs and JSON go to $OUT.
#   letter: issue 22: the letter-of-SPEC kernel sets (tests/fixtures/kernels/letter/), kvkernels
#           and indep at production scale for 60 s each, two campaigns at a time; then the share of
#           far ops that ran while a finding (int32_offset) is being confirmed, 1 and 8 workers
#   faults: issue 23: pytest -m cuda, then benchmarks/faults_gpu.py (an out-of-bounds free and a
#           device assert, 10 campaigns each)
set -u
PART=${1:-letter}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step, campaign
LETTER=tests/fixtures/kernels/letter
export TRITON_CACHE_DIR=/tmp/kvfuzz-triton-cache
summarize() {  # NAME...: the fields the issues ask for, from each campaign's summary
  for n in "$@"; do
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], {k: d.get(k) for k in ('ops', 'failures', 'stopped_by', 'far_ops', 'not_applicable', 'elapsed_s', 'compiles')})" "$OUT/$n.json" "$n" 2>&1 | cut -c1-600
  done
}
{
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
  git log -1 --format=%h 2>/dev/null || true
  if [ "$PART" = letter ]; then
    step "letter-of-SPEC sets, kvkernels and indep at production scale, 60 s each, two at a time"
    sets="$LETTER/letter_all.py $LETTER/clamp_max_tokens.py $LETTER/refuse_short_out.py $LETTER/drop_overlong_rows.py $LETTER/int32_bounded.py $LETTER/narrow_width.py kvkernels $FOREIGN/indep.py"
    set -- $sets
    while [ $# -gt 0 ]; do
      a=$1; b=${2:-}; shift; [ $# -gt 0 ] && shift
      campaign "prod-$(basename "$a" .py)" 60 --scale production --kernels "$a" > "$OUT/.a.log" 2>&1 &
      if [ -n "$b" ]; then campaign "prod-$(basename "$b" .py)" 60 --scale production --kernels "$b" > "$OUT/.b.log" 2>&1; fi
      wait; cat "$OUT/.a.log" "$OUT/.b.log" 2>/dev/null; rm -f "$OUT/.a.log" "$OUT/.b.log"
    done
    for s in $sets; do summarize "prod-$(basename "$s" .py)"; done
    step "far ops that ran while a finding is confirmed: int32_offset, 1 worker then 8 (40 s each)"
    campaign far-share-1w 40 --scale production --kernels $FOREIGN/int32_offset.py --workers 1
    campaign far-share-8w 40 --scale production --kernels $FOREIGN/int32_offset.py --workers 8
    summarize far-share-1w far-share-8w
  fi
  if [ "$PART" = faults ]; then
    step "faults_gpu.py: an out-of-bounds free and a device assert, 10 campaigns each, 5 side by side"
    timeout 290 $PY benchmarks/faults_gpu.py --campaigns 10 --parallel 5 --budget-s 30 --out /tmp/faults 2>&1 | tail -20
    cp /tmp/faults/faults-gpu.json "$OUT/" 2>/dev/null
    step "pytest -m cuda (the 20-campaign illegal-address test 5 side by side)"
    KVFUZZ_FAULT_PARALLEL=5 timeout 270 $PY -m pytest -q -p no:cacheprovider -n 8 -m cuda tests 2>&1 | tail -15
  fi
  if [ "$PART" = faults2 ]; then  # what the faults part's limits cut: the device assert, and pytest -m cuda
    step "faults_gpu.py: a device assert, 10 campaigns side by side"
    timeout 170 $PY benchmarks/faults_gpu.py --sets device_assert.py --campaigns 10 --parallel 10 --budget-s 30 --out /tmp/faults 2>&1 | tail -5
    cp /tmp/faults/faults-gpu.json "$OUT/faults-gpu-device-assert.json" 2>/dev/null
    step "pytest -m 'cuda and not slow'"
    timeout 200 $PY -m pytest -q -p no:cacheprovider -n 8 -m "cuda and not slow" tests 2>&1 | grep -v Warning | tail -8
  fi
} 2>&1 | tee "$OUT/session-$PART.log"
