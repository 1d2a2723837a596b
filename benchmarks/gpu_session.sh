#!/usr/bin/env bash
# The batched GPU session: each PART fits one device call (10 minutes). Logs and JSON go
# to $OUT (the device tool brings back at most 8 files, 2 folders deep).
#   part 1: environment; a CUDA campaign and a profile of the CUDA tier's small-scale op
#           rate; the CUDA-marked tests; the read-table launch sweep; the vectorized oracle
#   part 2: small-scale CUDA throughput (1/4/8 workers), kvfuzz bench (fuzz rates and the
#           read-table grid after tuning)
#   part 3: production-scale fuzzing (elements checked/s, the planted production-only bugs,
#           graph replay)
#   part 4 (2 GPUs): workers pinned one GPU each; the crash-proofing fixtures on CUDA (1 and
#           2 workers); --sanitizer memcheck; a profile of production-scale fuzzing
#   part 5: the read-table grid with the final rules; production scale again; the segfault
#           fixture found, minimized and replayed as one CUDA fault
set -u
PART=${1:-1}
OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
unset TRITON_INTERPRET
PY=${PY:-python3}
LOG="$OUT/session-$PART.log"
FOREIGN=tests/fixtures/kernels/foreign
step() { echo; echo "== $*  ($(date -u +%T))"; }
{
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0), "gpus", torch.cuda.device_count())'
  if [ "$PART" = 1 ]; then
    step "kvfuzz run --backend cuda (small scale, 1 worker, 25 s)"
    timeout 70 $PY -m fuzz run --backend cuda --hostile all --budget-s 25 --seed 3 --out "$OUT/cases" --progress-s 5 --stats
    echo "exit $?"
    step "profile of the CUDA tier (small scale, in process)"
    timeout 60 $PY benchmarks/profile_tier.py --backend cuda --seconds 15 --top 25
    step "pytest -m cuda"
    timeout 170 $PY -m pytest -q -p no:cacheprovider -n 8 -m cuda tests 2>&1 | tail -25
    step "read-table launch sweep"
    timeout 235 $PY benchmarks/sweep_read_table.py --budget-s 200 --out "$OUT/sweep-read-table.json"
    step "vectorized oracle"
    timeout 70 $PY benchmarks/vector_oracle_gpu.py --out "$OUT/vector-oracle.json"
  elif [ "$PART" = 2 ]; then
    for spec in "16 1" "16 4" "16 8" "1 4"; do
      set -- $spec
      step "small-scale CUDA throughput: --check-every $1 --workers $2, 45 s"
      timeout 100 $PY -m fuzz run --backend cuda --check-every "$1" --workers "$2" --budget-s 45 --seed 11 \
        --out "$OUT/cases-throughput" --progress-s 15 --summary "$OUT/throughput-$1-$2.json"
      echo "exit $?"
    done
    step "kvfuzz bench (fuzz rates and the read-table grid after tuning)"
    timeout 260 $PY -m fuzz bench --seconds 30 --out "$OUT/bench-gpu.json"
  elif [ "$PART" = 3 ]; then
    step "strided loop: one or two column blocks per trip"
    timeout 120 $PY benchmarks/ab_unroll.py --out "$OUT/ab-unroll.json"
    step "production scale"
    timeout 300 $PY benchmarks/scale_gpu.py --seconds 20 --find-seconds 60 --out "$OUT/scale-gpu.json"
  elif [ "$PART" = 5 ]; then
    step "read-table grid with the final launch rules"
    timeout 120 $PY -c "import json; from fuzz.tools.bench_kernels import run_all; json.dump(run_all(print_fn=print), open('$OUT/bench-kernels-final.json', 'w'), indent=1)"
    step "production scale"
    timeout 240 $PY benchmarks/scale_gpu.py --seconds 20 --find-seconds 60 --out "$OUT/scale-gpu.json"
    step "segfault fixture on CUDA: found, minimized, replayed as one fault"
    timeout 70 $PY -m fuzz run --backend cuda --kernels "$FOREIGN/segfault.py" --budget-s 30 --op-timeout 10 \
      --out /tmp/seg --progress-s 10
    echo "exit $?"
    for c in /tmp/seg/*.json; do
      timeout 60 $PY -m fuzz replay "$c" --op-timeout 10; echo "exit $?"
      cp "$c" "$OUT/"
    done
  else  # part 4
    step "workers pinned to GPUs: 4 workers, what each process sees"
    $PY -m fuzz run --backend cuda --check-every 16 --workers 4 --budget-s 40 --out /tmp/cases-pinning \
      --progress-s 20 --summary "$OUT/pinning-summary.json" &
    sleep 30
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv
    nvidia-smi --query-gpu=index,uuid --format=csv
    wait
    step "where production-scale time goes (read-heavy, 24 and 96 ops per sequence)"
    timeout 60 $PY benchmarks/profile_scale.py --seconds 20 --ops 24 --top 25
    timeout 35 $PY benchmarks/profile_scale.py --seconds 15 --ops 96 --top 5
    for name in segfault hang raises indep; do
      for w in 1 2; do
        step "fixture $name, $w worker(s), 20 s"
        timeout 80 $PY -m fuzz run --backend cuda --kernels "$FOREIGN/$name.py" --budget-s 20 --workers "$w" \
          --op-timeout 10 --out "/tmp/fixtures/$name-$w" --progress-s 10
        echo "exit $?"
      done
      for c in "/tmp/fixtures/$name-1"/*.json; do
        [ -f "$c" ] || continue
        step "replay $c"
        timeout 60 $PY -m fuzz replay "$c" --op-timeout 10; echo "exit $?"
      done
    done
    c=$(ls /tmp/fixtures/segfault-1/*.json 2>/dev/null | head -1)
    if [ -n "$c" ]; then
      step "replay --sanitizer memcheck $c"
      timeout 110 $PY -m fuzz replay "$c" --sanitizer memcheck; echo "exit $?"
      $PY -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get('sanitizer'), indent=1))" "$c"
      cp "$c" "$OUT/sanitized-case.json"
    fi
  fi
} 2>&1 | tee "$LOG"
