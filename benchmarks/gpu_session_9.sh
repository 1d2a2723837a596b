#!/usr/bin/env bash
# The GPU session of 2026-12-02 (s9, one H200): each PART fits one device call; logs and JSON to $OUT.
#   defer:  pytest -m "cuda and not slow" (deferred checks are on by default on CUDA only); kvkernels
#           read-heavy with the checks read back every op (KVFUZZ_DEFER_CHECKS=1) and every 8 (the
#           default), and the host profile of the latter
#   indep:  where kvkernels read-heavy synchronizes, and its device kernels; indep read-heavy and default mix with a scout over the timed window; an indep production
#           campaign with --compile-ahead on and follow
#   small:  pytest -m "cuda and not slow"; where the small track synchronizes, by call site
#   oracle: kvkernels read-heavy and its device kernels, after the oracle's entry clauses became lookup marks
#   small2: pytest -m "cuda and not slow"; the small track's syncs and 1 / 8 workers after folding its reads
#   final:  pytest -m "cuda and not slow"; guided collection cost on CUDA; the first case, cold and warm
set -u
PART=${1:-defer}
. benchmarks/gpu_common.sh  # $OUT, $PY, $FOREIGN, step, campaign, util, environment, cuda_tests, syncs_small, first_case_cuda
{
  environment
  if [ "$PART" = defer ]; then
    cuda_tests "deferred checks: on by default on CUDA only"
    cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
    for d in 1 8; do
      step "kvkernels read-heavy, KVFUZZ_DEFER_CHECKS=$d (scale_gpu)"
      KVFUZZ_DEFER_CHECKS=$d timeout 150 $PY benchmarks/scale_gpu.py --only kvkernels/throughput --compile-ahead on \
        --ahead-sequences 96 --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants \
        --out "$OUT/scale-kvkernels-defer$d.json" 2>&1 | grep -vi warn | tail -2 | cut -c1-700
    done
    step "kvkernels read-heavy host profile, deferred checks (profile_gpu host)"
    TRITON_CACHE_DIR=$cache timeout 120 $PY benchmarks/profile_gpu.py host --set kvkernels --seconds 6 --warmup 8 --top 30 \
      --out "$OUT/host-kvkernels.json" > /tmp/host.txt 2>&1
    grep -v -i "warn\|USDT" /tmp/host.txt | head -110 | cut -c1-200; tail -1 /tmp/host.txt | cut -c1-500
  fi
  if [ "$PART" = indep ]; then
    step "kvkernels read-heavy: every synchronizing CUDA call by call site (profile_gpu syncs)"
    timeout 120 $PY benchmarks/profile_gpu.py syncs --set kvkernels --seconds 6 --warmup 8 --top 15 \
      --out "$OUT/syncs-kvkernels.json" 2>&1 | grep -v -i "warn\|USDT" | tail -17 | cut -c1-300
    step "kvkernels read-heavy: device kernels (profile_gpu kernels)"
    timeout 150 $PY benchmarks/profile_gpu.py kernels --set kvkernels --seconds 4 --warmup 8 --top 12 \
      --out "$OUT/kernels-kvkernels.json" 2>&1 | grep -v -i "warn\|USDT" | tail -14 | cut -c1-300
    step "indep read-heavy and default mix, scout over 160 sequences (scale_gpu)"
    cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
    timeout 240 $PY benchmarks/scale_gpu.py --only indep/throughput,indep/mixed --compile-ahead on --ahead-sequences 160 \
      --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants --out "$OUT/scale-indep.json" 2>&1 | grep -vi warn | tail -4 | cut -c1-900
    for mode in on follow; do
      step "indep production campaign, 40 s, --compile-ahead $mode"
      cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
      campaign indep-$mode 40 --scale production --kernels $FOREIGN/indep.py --compile-ahead $mode --cache-dir "$cache"
      $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('ops','ops_per_s','elements_per_s','compiles','compile_s','loads')}, (d.get('compile_ahead') or {}).get('follow'))" "$OUT/indep-$mode.json" 2>&1 | cut -c1-600
    done
  fi
  if [ "$PART" = small ]; then
    cuda_tests "compile-ahead auto now follows"
    syncs_small "profile_gpu syncs --track small" 20
  fi
  if [ "$PART" = oracle ]; then
    cache=$(mktemp -d /tmp/kvfuzz-ca-XXXXXX)
    step "kvkernels read-heavy, the oracle's entry clauses as lookup marks (scale_gpu)"
    timeout 150 $PY benchmarks/scale_gpu.py --only kvkernels/throughput --compile-ahead on \
      --ahead-sequences 96 --cache-dir "$cache" --seconds 10 --warmup 8 --no-variants \
      --out "$OUT/scale-kvkernels.json" 2>&1 | grep -vi warn | tail -2 | cut -c1-700
    step "kvkernels read-heavy: device kernels (profile_gpu kernels)"
    TRITON_CACHE_DIR=$cache timeout 150 $PY benchmarks/profile_gpu.py kernels --set kvkernels --seconds 4 --warmup 8 --top 12 \
      --out "$OUT/kernels-kvkernels.json" 2>&1 | grep -v -i "warn\|USDT" | tail -14 | cut -c1-300
  fi
  if [ "$PART" = small2 ]; then
    cuda_tests "the red zones' flag read with the state"
    syncs_small "after folding the harness's reads" 12
    export TRITON_CACHE_DIR=/tmp/kvfuzz-cache-small
    small_shapes 12 1 8
  fi
  if [ "$PART" = final ]; then
    cuda_tests "the merged confirm path and guided hook"
    step "guided collection cost on CUDA, value features only (guided_vs_blind --parts overhead)"
    timeout 120 $PY benchmarks/guided_vs_blind.py --backend cuda --parts overhead --ops 1500 \
      --note "one H200, nothing else running" --out "$OUT/guided-overhead-cuda.json" 2>&1 | grep -v -i warn | tail -4
    first_case_cuda 330
  fi
} 2>&1 | tee "$OUT/session-$PART.log"
