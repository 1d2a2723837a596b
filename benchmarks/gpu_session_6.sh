#!/usr/bin/env bash
# The GPU session of 2026-12-03 (one H200): each PART fits one device call; logs and JSON to $OUT.
#   first:   seconds to the first case over the mutant catalogue, cold then warm cache, with the
#            fork server as the default start method and a torch-free parent (benchmarks/first_case.py;
#            each row keeps the summary's timeline); the host profile of kvkernels read-heavy
#            (cProfile of scale_gpu.py, with nvidia-smi utilization beside it)
#   again:   the first-case catalogue again (after the standby executor and the engine preload),
#            then the fork server's and the CUDA tests
#   final:   the first-case catalogue with the campaign's standby child (cold, warm), and the
#            torch-free parent's and the fork server's tests under this Triton
#   check:   the fork server's tests and pytest -m "cuda and not slow" under this Triton; small
#            shapes with 1 and 8 workers
set -u
PART=${1:-first}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step, campaign, util, environment
first_case() {  # first_case N LIMIT NOTE: the mutant catalogue, cold then warm, as $OUT/first-case-cuda-N.*
  step "first case over the mutant catalogue, cold then warm (benchmarks/first_case.py)"
  timeout "$2" $PY benchmarks/first_case.py --backend cuda --scale small --cold --warm --budget-s 20 \
    --note "one H200, nothing else running; $3" --out /tmp/fc > "$OUT/first-case-cuda-$1.log" 2>&1
  echo "exit $?"
  tail -8 /tmp/fc/first_case.md 2>/dev/null || tail -5 "$OUT/first-case-cuda-$1.log"
  cp /tmp/fc/first_case.json "$OUT/first-case-cuda-$1.json" 2>/dev/null; cp /tmp/fc/first_case.md "$OUT/first-case-cuda-$1.md" 2>/dev/null
}
{
  environment
  if [ "$PART" = again ]; then
    first_case 2 330 "fork server default, torch-free parent, standby executor, engine preloaded"
    step "fork server tests under this Triton"
    timeout 100 $PY -m pytest -q -p no:cacheprovider -n 4 tests/fuzz/test_zygote.py tests/fuzz/test_lazy_torch.py 2>&1 | tail -3
    step "pytest -m 'cuda and not slow'"
    timeout 150 $PY -m pytest -q -p no:cacheprovider -n 8 -m "cuda and not slow" tests 2>&1 | grep -v Warning | tail -8
  fi
  if [ "$PART" = final ]; then
    step "torch-free parent and fork server tests under this Triton"
    timeout 100 $PY -m pytest -q -p no:cacheprovider -n 4 -rf tests/fuzz/test_lazy_torch.py tests/fuzz/test_zygote.py \
      tests/fuzz/test_supervision.py -k "lazy or zygote or standby or prestarted" 2>&1 | grep -E "passed|failed|FAILED|Error" | head -8
    first_case 3 420 "fork server default, torch-free parent, standby children"
  fi
  if [ "$PART" = first ]; then
    step "kvkernels read-heavy under cProfile (scale_gpu, compile-ahead on)"
    cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
    smi=$(util readheavy)
    timeout 150 $PY -m cProfile -o "$OUT/readheavy.prof" benchmarks/scale_gpu.py --only kvkernels/throughput \
      --compile-ahead on --ahead-sequences 96 --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants \
      --out "$OUT/scale-kvkernels-throughput.json" 2>&1 | grep -vi warn | tail -3 | cut -c1-700
    kill "$smi" 2>/dev/null
    echo "GPU utilization % (0.5 s samples): $(tr '\n' ' ' < /tmp/util-readheavy.txt | cut -c1-600)"
    first_case 1 380 "fork server default, torch-free parent"
  fi
  if [ "$PART" = check ]; then
    step "fork server tests under this Triton"
    timeout 150 $PY -m pytest -q -p no:cacheprovider -n 4 tests/fuzz/test_zygote.py tests/fuzz/test_lazy_torch.py 2>&1 | tail -3
    step "pytest -m 'cuda and not slow'"
    timeout 200 $PY -m pytest -q -p no:cacheprovider -n 8 -m "cuda and not slow" tests 2>&1 | grep -v Warning | tail -8
    export TRITON_CACHE_DIR=/tmp/kvfuzz-cache-small
    small_shapes 15 1 8
  fi
} 2>&1 | tee "$OUT/session-$PART.log"
