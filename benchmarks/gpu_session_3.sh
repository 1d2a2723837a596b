#!/usr/bin/env bash
# The GPU sessions of 2026-12-01 (second session; one H200, torch 2.11, Triton 3.6): each PART
# fits one device call; logs and JSON go to $OUT.
#   profile: where the time goes after a warm-up: production op kinds (ours: default and
#            read-heavy mixes; indep: default), the small-shape tier under cProfile, and
#            small-shape campaigns with 1 and 8 workers on a warm --cache-dir
#   final:   the issue-16 figures side by side: benchmarks/scale_gpu.py, small shapes with
#            8 workers, a warm-cache production campaign's compile time
set -u
PART=${1:-profile}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step, campaign
LOG="$OUT/session-$PART.log"
CACHE=/tmp/kvfuzz-triton-cache
export TRITON_CACHE_DIR=$CACHE
small_campaign() {  # WORKERS CHECK_EVERY SECONDS NAME
  timeout $(($3 + 120)) $PY -m fuzz run --backend cuda --workers "$1" --check-every "$2" --budget-s "$3" --seed 11 \
    --cache-dir $CACHE --out /tmp/tp-$4 --progress-s 1000 --reproduce 0 --summary "$OUT/$4.json" 2>&1 \
    | grep "kvfuzz run" | cut -c1-400
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], {k: d.get(k) for k in ('ops', 'ops_per_s', 'steady_ops_per_s', 'compile_s', 'elapsed_s', 'workers_n')})" "$OUT/$4.json" "$4"
}
{
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
  nproc
  if [ "$PART" = profile ]; then
    step "production op kinds after 12 warm-up sequences (ours default 20 s, read-heavy 15 s; indep default 20 s)"
    timeout 200 $PY benchmarks/profile_kinds.py --seconds 20 --out "$OUT/kinds-kvkernels-default.json" 2>&1 | tail -22
    timeout 150 $PY benchmarks/profile_kinds.py --seconds 15 --mix read-heavy --check-every 8 --out "$OUT/kinds-kvkernels-read-heavy.json" 2>&1 | tail -12
    timeout 200 $PY benchmarks/profile_kinds.py --seconds 20 --kernels $FOREIGN/indep.py --out "$OUT/kinds-indep-default.json" 2>&1 | tail -22
    step "small shapes under cProfile after the warm-up sequences and 10 s (15 s)"
    timeout 120 $PY benchmarks/profile_tier.py --backend cuda --seconds 15 --warmup-s 10 --top 40 2>&1 | head -70
    step "small shapes: 1 worker, then 8 (warm cache, 25 s each)"
    small_campaign 1 1 25 small-1w
    small_campaign 8 1 25 small-8w
  fi
} 2>&1 | tee "$LOG"
if [ "$PART" = profile2 ]; then
  {
    step "does a far op's memory pool give its memory back alone?"
    $PY benchmarks/mempool_probe.py
    step "production op kinds, default mix, after 12 warm-up sequences (20 s), far memory in its own pool"
    timeout 200 $PY benchmarks/profile_kinds.py --seconds 20 --out "$OUT/kinds-kvkernels-default.json" 2>&1 | tail -22
    step "the default mix under cProfile (20 s after 12 warm-up sequences)"
    timeout 200 $PY benchmarks/profile_scale.py --mix default --warmup 12 --seconds 20 --top 45 2>&1 | head -75
  } 2>&1 | tee "$OUT/session-profile2.log"
fi
if [ "$PART" = final-a ]; then
  {
    step "pytest -m cuda (every change of this session)"
    timeout 260 $PY -m pytest -q -p no:cacheprovider -n 8 -m cuda tests 2>&1 | tail -12
    step "int32 row offsets past 2^31 (15 s) with far memory in its own pool"
    campaign int32_offset 15 --scale production --kernels $FOREIGN/int32_offset.py
    step "indep at production scale, 20 s, the size palette off, then on (the same warm cache)"
    campaign indep_palette_off 20 --scale production --kernels $FOREIGN/indep.py --palette off --reproduce 0
    campaign indep_palette_on 20 --scale production --kernels $FOREIGN/indep.py --palette on --reproduce 0
    for n in indep_palette_off indep_palette_on; do
      $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], {k: d.get(k) for k in ('ops', 'elements_per_s', 'compile_s', 'compiles', 'elapsed_s')})" "$OUT/$n.json" $n
    done
  } 2>&1 | tee "$OUT/session-final-a.log"
fi
if [ "$PART" = final-b ]; then
  {
    step "production elements/s, kvkernels and indep, 15 s per phase after 8 warm-up sequences"
    timeout 300 $PY benchmarks/scale_gpu.py --seconds 15 --find-seconds 20 --warmup 8 --out "$OUT/scale-gpu.json" 2>&1 | tail -14
    step "small shapes, 8 workers, fully checked (a 15 s run warms the cache, then 30 s)"
    small_campaign 8 1 15 small-8w-warming
    small_campaign 8 1 30 small-8w
    step "a production campaign of our kernels, 15 s, on the warm cache"
    campaign production_warm 15 --scale production --cache-dir $CACHE --reproduce 0
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print('production_warm', {k: d.get(k) for k in ('ops', 'elements_per_s', 'compile_s', 'compiles', 'elapsed_s', 'steady_ops_per_s')})" "$OUT/production_warm.json"
  } 2>&1 | tee "$OUT/session-final-b.log"
fi
if [ "$PART" = final-c ]; then
  {
    step "after aligned layouts and the production warm-up: scale_gpu (15 s per phase, 8 warm-up sequences)"
    timeout 300 $PY benchmarks/scale_gpu.py --seconds 15 --find-seconds 20 --warmup 8 --out "$OUT/scale-gpu-aligned.json" 2>&1 | tail -14
    step "a production campaign of our kernels, 15 s, twice on one --cache-dir (the second is the warm one)"
    for run in cold warm; do
      campaign production_aligned_$run 15 --scale production --cache-dir $CACHE-c --reproduce 0
      $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], {k: d.get(k) for k in ('ops', 'elements_per_s', 'compile_s', 'compiles', 'elapsed_s', 'steady_ops_per_s')})" "$OUT/production_aligned_$run.json" $run
    done
  } 2>&1 | tee "$OUT/session-final-c.log"
fi
