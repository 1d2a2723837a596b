#!/usr/bin/env bash
# The GPU session of 2026-12-01 (one H200, torch 2.11, Triton 3.6): each PART fits one
# device call (10 minutes); logs and JSON go to $OUT.
#   part 1: environment; the CUDA-marked tests; the verdict fixtures (late hang, exit on
#           the Nth call, SIGKILL, one call in three, noisy, slow) as campaigns on CUDA with
#           default flags, each case replayed; production-only bugs of sets with literal
#           block sizes, and a free whose programs race for their output slots
#   part 2: physical limits: the CUDA-marked tests again (merged branches), the int32-offset
#           read table past 2^31 elements, our kernels and indep at production scale, packed
#           out capacity, hostile probes at production scale, compile errors at one
#           specialization, SGLang's kernels through the adapter (EXTRA_PYTHONPATH=.sgl/site)
#   part 3: speed: production elements/s, small-shape campaigns with 4 and 8 workers,
#           compile time cold and with a warm --cache-dir
set -u
PART=${1:-1}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step, campaign
LOG="$OUT/session-$PART.log"
{
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0), "gpus", torch.cuda.device_count())'
  if [ "$PART" = 1 ]; then
    step "pytest -m cuda"
    timeout 240 $PY -m pytest -q -p no:cacheprovider -n 8 -m cuda tests 2>&1 | tail -30
    step "verdict fixtures on CUDA, default flags (in parallel, 30 s each)"
    now=$(date +%s)
    (KVFUZZ_FIXTURE_HANG_AFTER=$((now + 20)) campaign hang_late 30 --kernels $FOREIGN/hang_late.py > /tmp/v1.txt) &
    (KVFUZZ_FIXTURE_EXIT_AT=300 campaign exit_nth 30 --kernels $FOREIGN/exit_nth.py > /tmp/v2.txt) &
    (campaign sigkill 30 --kernels $FOREIGN/sigkill.py > /tmp/v3.txt) &
    (campaign flaky 30 --kernels $FOREIGN/flaky.py > /tmp/v4.txt) &
    (campaign noisy 30 --kernels $FOREIGN/noisy.py > /tmp/v5.txt) &
    (KVFUZZ_FIXTURE_SLOW_S=0.4 campaign slow 30 --kernels $FOREIGN/slow.py > /tmp/v6.txt) &
    wait
    cat /tmp/v1.txt /tmp/v2.txt /tmp/v3.txt /tmp/v4.txt /tmp/v5.txt /tmp/v6.txt
    step "production scale on CUDA: literal block sizes, program-order races (15 s each)"
    (campaign literal_blocks 15 --scale production --kernels $FOREIGN/literal_blocks.py > /tmp/p1.txt) &
    (campaign literal_blocks_stride2 15 --scale production --kernels $FOREIGN/literal_blocks_stride2.py > /tmp/p2.txt) &
    (campaign literal_blocks_legacy_stride 15 --scale production --kernels $FOREIGN/literal_blocks_legacy_stride.py > /tmp/p3.txt) &
    (campaign order_dependent 15 --scale production --kernels $FOREIGN/order_dependent.py > /tmp/p4.txt) &
    (campaign order_raw 15 --scale production --kernels $FOREIGN/order_raw.py > /tmp/p5.txt) &
    (campaign kvkernels_production 15 --scale production > /tmp/p6.txt) &
    wait
    cat /tmp/p1.txt /tmp/p2.txt /tmp/p3.txt /tmp/p4.txt /tmp/p5.txt /tmp/p6.txt
  elif [ "$PART" = 2 ]; then
    step "pytest -m cuda (with the merged branches)"
    timeout 200 $PY -m pytest -q -p no:cacheprovider -n 8 -m cuda tests 2>&1 | tail -15
    step "int32 row offsets past 2^31 elements (15 s each; 1 and 4 workers); our kernels and indep at production scale"
    campaign int32_offset_w1 15 --scale production --kernels $FOREIGN/int32_offset.py
    campaign int32_offset_w4 15 --scale production --workers 4 --kernels $FOREIGN/int32_offset.py
    (campaign kvkernels_production 30 --scale production > /tmp/q1.txt) &
    (campaign indep_production 30 --scale production --kernels $FOREIGN/indep.py > /tmp/q2.txt) &
    (campaign packed_capacity 20 --scale production --kernels tests/fuzz/fixtures/kernels/asserts_out_capacity.py > /tmp/q3.txt) &
    (campaign trusting_production 20 --scale production --kernels $FOREIGN/trusting.py > /tmp/q4.txt) &
    wait
    cat /tmp/q1.txt /tmp/q2.txt /tmp/q3.txt /tmp/q4.txt
    step "a kernel that does not compile at one specialization: as a crash case (20 s), and the compile track (60 s)"
    (campaign compile_fails_at_1 20 --kernels $FOREIGN/compile_fails_at_1.py > /tmp/c1.txt) &
    (campaign compile_track 60 --scale compile --kernels $FOREIGN/compile_fails_at_1.py > /tmp/c2.txt) &
    (campaign compile_track_kvkernels 60 --scale compile > /tmp/c3.txt) &
    wait
    cat /tmp/c1.txt /tmp/c2.txt /tmp/c3.txt
    step "SGLang's kernels through the adapter (CUDA wrappers), hostile spec, 20 s each scale"
    (campaign sglang_small 20 --kernels kvfuzz-sglang > /tmp/s1.txt) &
    (campaign sglang_production 20 --kernels kvfuzz-sglang --scale production > /tmp/s2.txt) &
    wait
    cat /tmp/s1.txt /tmp/s2.txt
  fi
  if [ "$PART" = 3 ]; then
    step "again after the fix: int32 row offsets past 2^31 (15 s, 1 and 4 workers), hostile probes on trusting.py"
    campaign int32_offset_w1 15 --scale production --kernels $FOREIGN/int32_offset.py
    campaign int32_offset_w4 15 --scale production --workers 4 --kernels $FOREIGN/int32_offset.py
    campaign trusting_production 20 --scale production --kernels $FOREIGN/trusting.py
    step "throughput: production elements/s (benchmarks/scale_gpu.py --seconds 15)"
    timeout 200 $PY benchmarks/scale_gpu.py --seconds 15 --find-seconds 20 --out "$OUT/scale-gpu.json" 2>&1 | tail -14
    step "throughput: small shapes, 8 and 4 workers, fully checked and --check-every 16 (30 s each)"
    for spec in "1 8" "16 8" "1 4"; do
      set -- $spec
      timeout 120 $PY -m fuzz run --backend cuda --check-every "$1" --workers "$2" --budget-s 30 --seed 11 \
        --out /tmp/tp --progress-s 1000 --reproduce 0 --summary "$OUT/throughput-$1-$2.json" 2>&1 | grep "kvfuzz run" | cut -c1-400
    done
    step "compile time: a production campaign cold, then with the warm --cache-dir (15 s each)"
    for run in cold warm; do
      timeout 100 $PY -m fuzz run --backend cuda --scale production --budget-s 15 --cache-dir /tmp/triton-cache \
        --out /tmp/cc --progress-s 1000 --summary "/tmp/compile-$run.json" 2>&1 | grep "kvfuzz run" | cut -c1-400
      $PY -c "import json; d=json.load(open('/tmp/compile-$run.json')); print('$run', 'compile_s', d['compile_s'], 'elapsed_s', d['elapsed_s'], 'elements/s', d['elements_per_s'])"
    done
  fi
} 2>&1 | tee "$LOG"
