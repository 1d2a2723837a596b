#!/usr/bin/env bash
# The GPU benchmarks and checks, as named parts: each part fits one 10-minute device call, and
# its logs and JSON go to $OUT (default benchmarks/results/gpu-run). The figures the README and
# benchmarks/README.md quote come from these parts (each record under benchmarks/results/ says
# which). Run on a machine with a CUDA torch, from the repository root:
#
#   bash benchmarks/gpu_runs.sh PART...        e.g.  bash benchmarks/gpu_runs.sh cuda-tests first-case
#   bash benchmarks/gpu_runs.sh --list         the parts, one line each
#
# Knobs: OUT, PY (python3), EXTRA_PYTHONPATH (a site directory for the sglang part).
# Compile-ahead on/off side by side has a script of its own: benchmarks/compile_ahead_gpu.sh.
set -u

PARTS=(  # NAME|what it runs
  "environment|the GPU, the versions, the cores, the tree"
  "cuda-tests|pytest -m 'cuda and not slow' on 8 workers: the CUDA twins of the CPU tests"
  "small-shapes|small-shape campaigns on CUDA, 1, 4 and 8 workers, fully checked (ops/s), warm cache"
  "production|production elements checked/s, our kernels and indep (scale_gpu.py, 8 warm-up sequences)"
  "compile-ahead|the same phases with --compile-ahead on: kvkernels read-heavy, indep default mix"
  "first-case|seconds to the first confirmed, minimized case over the mutant catalogue, cold then warm"
  "head-start|a cold campaign of 10 sequences with the small track's head start and without it"
  "collection-cost|what collecting value features costs the guided track on CUDA (three runs)"
  "guided-kill-ops|ops to kill the third-trip fixtures, guided against blind, seeds 0-5"
  "guided-nights|the nightly's guided step twice on one corpus (ci/fuzz.sh), then kvfuzz coverage"
  "verdicts|crash-proofing fixtures on CUDA (hang, exit, SIGKILL, flaky, noisy, slow), each case replayed"
  "faults|asynchronous faults: an out-of-bounds free and a device assert, 10 campaigns each"
  "sanitizer|the segfault fixture found, minimized, then replayed under compute-sanitizer memcheck"
  "mutants|kvfuzz mutants on CUDA: every planted bug killed"
  "bench|kvfuzz bench: fuzz rates per tier and the read-table launch grid"
  "read-table|the read-table launch sweep, one or two column blocks per trip, the vectorized oracle"
  "profiles|where time goes: device kernels, synchronizing calls, a worker's set-up, the collector"
  "pinning|(2+ GPUs) workers pinned one GPU each: what each process sees"
  "sglang|SGLang's kernels through the adapter, small and production scale (EXTRA_PYTHONPATH)"
  "foreign-guidance|value features on a kernel set kvfuzz did not write (team_tables*.py): collection cost, third-trip and kv_start kills, guided against blind"
  "replay-matrix|fault fixtures of process history and chance (exit, kill, hang on the Nth call, flaky), RM_CAMPAIGNS campaigns each, RM_JOBS at once: rates, 1-minimal, replays"
  "shrink-width|fault cases shrunk SW_WIDTHS candidates at once (benchmarks/shrink_width.py): the same cases, their shrink seconds"
  "sglang-allocator|SGLang's MultiEndedAllocator on CUDA with real events: a clean campaign beside its kill table (EXTRA_PYTHONPATH)"
  "chains|our chains of pools on CUDA: every planted chain and float bug killed (kvfuzz mutants)"
)
list_parts() { for p in "${PARTS[@]}"; do printf '%-17s %s\n' "${p%%|*}" "${p#*|}"; done; }
is_part() { for p in "${PARTS[@]}"; do [ "${p%%|*}" = "$1" ] && return 0; done; return 1; }

if [ $# -eq 0 ] || [ "$1" = --list ] || [ "$1" = --help ] || [ "$1" = -h ]; then
  echo "usage: bash benchmarks/gpu_runs.sh PART...   (logs and JSON to \$OUT)"
  list_parts
  [ $# -eq 0 ] && exit 2 || exit 0
fi
for part in "$@"; do
  if ! is_part "$part"; then
    echo "gpu_runs.sh: no part named '$part' (--list shows them)" >&2
    exit 2
  fi
done

OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
unset TRITON_INTERPRET
PY=${PY:-python3}
FOREIGN=tests/fixtures/kernels/foreign

step() { echo; echo "== $*  ($(date -u +%T))"; }
fields() {  # fields FILE KEY...: some keys of a summary JSON, on one line
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], {k: d.get(k) for k in sys.argv[2:]})" "$@"
}
campaign() {  # campaign NAME BUDGET FLAGS...: a CUDA campaign (summary $OUT/NAME.json), then each case replayed
  local name=$1 budget=$2; shift 2
  local out=/tmp/gpu-runs-$name-$RANDOM
  timeout $((budget + 200)) $PY -m fuzz run --backend cuda --budget-s "$budget" --out "$out" \
    --summary "$OUT/$name.json" --progress-s 1000 "$@" > "$out.log" 2>&1
  echo "-- $name: exit $?"
  grep -E "^(FAIL|case:|kvfuzz run)" "$out.log" | cut -c1-500
  for c in "$out"/*.json; do
    [ -f "$c" ] || continue
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); s=d['signature']; print('   case', s['op']+'/'+s['oracle']+'/'+s['field'], 'reproduced', d.get('reproduced'), 'flaky', d.get('flaky'), 'lengths', d.get('lengths'), 'history', (d.get('history') or {}).get('note'))" "$c"
    timeout 200 $PY -m fuzz replay "$c" --op-timeout 20 > "$out.replay" 2>&1
    echo "   replay exit $? $(head -1 "$out.replay" | cut -c1-300)"
  done
}
small_run() {  # small_run WORKERS CHECK_EVERY SECONDS NAME: a small-shape campaign and its rates
  timeout $(($3 + 120)) $PY -m fuzz run --backend cuda --workers "$1" --check-every "$2" --budget-s "$3" --seed 11 \
    --out "/tmp/gpu-runs-$4" --summary "$OUT/$4.json" --progress-s 1000 2>&1 | grep -E "^kvfuzz run" | cut -c1-400
  fields "$OUT/$4.json" ops ops_per_s steady_ops_per_s compile_s workers_n
}
cold_run() {  # cold_run NAME FLAGS...: kvkernels on an empty Triton cache, 10 sequences, its compile figures
  local cache=/tmp/gpu-runs-cold-cache-$1; rm -rf "$cache"
  timeout 90 $PY -m fuzz run --backend cuda --budget-s 60 --max-sequences 10 --cache-dir "$cache" --out "/tmp/gpu-runs-cold-$1" \
    --summary "$OUT/cold-$1.json" --progress-s 1000 "${@:2}" 2>&1 | grep -E "^kvfuzz run|head start" | cut -c1-400
  fields "$OUT/cold-$1.json" compiles compile_s loads load_s steady_ops_per_s timeline
}
night() {  # night SEED CORPUS SECONDS: ci/fuzz.sh as ci/nightly.sh runs its guided step on CUDA
  KVFUZZ_NO_VENV=1 KVFUZZ_BACKEND=cuda KVFUZZ_CORPUS=$2 KVFUZZ_BUDGET_S=$3 KVFUZZ_WORKERS=4 \
    KVFUZZ_CHECK_EVERY=16 KVFUZZ_SEED=$1 KVFUZZ_OUT="$OUT/night-$1" timeout 200 bash ci/fuzz.sh 2>&1 \
    | grep -vi warn | tail -4 | cut -c1-600
  echo "exit ${PIPESTATUS[0]}; corpus entries: $(ls "$2"/*.json 2>/dev/null | wc -l)"
}

run_part() {
  case $1 in
  environment)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $PY -c 'import os, sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0), "gpus", torch.cuda.device_count(), "cpus", os.cpu_count())'
    git log --oneline -1 2>/dev/null ;;
  cuda-tests)
    timeout 300 $PY -m pytest -q -p no:cacheprovider -n 8 -rf -m "cuda and not slow" tests 2>&1 | grep -E "passed|failed|FAILED" | head -12 ;;
  small-shapes)
    small_run 8 1 15 small-warming  # fills the Triton cache; its figure is not the one quoted
    for w in 1 4 8; do small_run "$w" 1 30 "small-$w"; done ;;
  production)
    timeout 300 $PY benchmarks/scale_gpu.py --seconds 15 --find-seconds 20 --warmup 8 --out "$OUT/scale-gpu.json" 2>&1 | tail -14 ;;
  compile-ahead)
    timeout 200 $PY benchmarks/scale_gpu.py --only kvkernels/throughput --compile-ahead on --ahead-sequences 96 \
      --seconds 10 --warmup 8 --out "$OUT/scale-kvkernels-read-heavy.json" 2>&1 | tail -6
    timeout 240 $PY benchmarks/scale_gpu.py --only indep/mixed --compile-ahead on --ahead-sequences 160 \
      --seconds 10 --warmup 8 --out "$OUT/scale-indep-default-mix.json" 2>&1 | tail -6 ;;
  first-case)
    timeout 560 $PY benchmarks/first_case.py --backend cuda --scale small --cold --warm --budget-s 20 \
      --note "cold = empty Triton cache and no fork daemon; warm = both left by an earlier command" \
      --out "$OUT/first-case" > "$OUT/first-case.log" 2>&1
    echo "exit $?"
    tail -20 "$OUT/first-case/first_case.md" 2>/dev/null || tail -5 "$OUT/first-case.log" ;;
  head-start)
    cold_run head-start
    cold_run no-head-start --compile-ahead off ;;
  collection-cost)
    for r in 1 2 3; do
      timeout 200 $PY -m benchmarks.guided_vs_blind --backend cuda --parts overhead --ops 1500 --rounds 5 \
        --note "one GPU, nothing else running" --out "$OUT/collection-cost-$r.json" 2>&1 | grep -vi warn | tail -4 | cut -c1-500
    done ;;
  guided-kill-ops)
    timeout 560 $PY -m benchmarks.guided_vs_blind --backend cuda --parts kill-ops --seeds 6 --max-ops 4000 \
      --out "$OUT/kill-ops.json" 2>&1 | grep -vi warn | tail -12 | cut -c1-500 ;;
  guided-nights)
    local corpus=/tmp/gpu-runs-corpus; rm -rf "$corpus"
    night 1 "$corpus" 40
    night 2 "$corpus" 40
    $PY -m fuzz coverage "$corpus" > "$OUT/coverage.txt" 2>&1
    head -20 "$OUT/coverage.txt" ;;
  verdicts)
    local now; now=$(date +%s)
    (KVFUZZ_FIXTURE_HANG_AFTER=$((now + 20)) campaign hang_late 30 --kernels $FOREIGN/hang_late.py > /tmp/gpu-runs-v1.txt) &
    (KVFUZZ_FIXTURE_EXIT_AT=300 campaign exit_nth 30 --kernels $FOREIGN/exit_nth.py > /tmp/gpu-runs-v2.txt) &
    (campaign sigkill 30 --kernels $FOREIGN/sigkill.py > /tmp/gpu-runs-v3.txt) &
    (campaign flaky 30 --kernels $FOREIGN/flaky.py > /tmp/gpu-runs-v4.txt) &
    (campaign noisy 30 --kernels $FOREIGN/noisy.py > /tmp/gpu-runs-v5.txt) &
    (KVFUZZ_FIXTURE_SLOW_S=0.4 campaign slow 30 --kernels $FOREIGN/slow.py > /tmp/gpu-runs-v6.txt) &
    wait
    cat /tmp/gpu-runs-v[1-6].txt ;;
  faults)
    timeout 560 $PY benchmarks/faults_gpu.py --campaigns 10 --parallel 5 --budget-s 30 --out /tmp/gpu-runs-faults 2>&1 | tail -20 ;;
  sanitizer)
    rm -rf /tmp/gpu-runs-seg
    timeout 90 $PY -m fuzz run --backend cuda --kernels "$FOREIGN/segfault.py" --budget-s 30 --op-timeout 10 \
      --out /tmp/gpu-runs-seg --progress-s 1000 2>&1 | grep -E "^(FAIL|kvfuzz run)" | cut -c1-400
    local c; c=$(ls /tmp/gpu-runs-seg/*.json 2>/dev/null | head -1)
    [ -n "$c" ] || { echo "no case found"; return; }
    timeout 200 $PY -m fuzz replay "$c" --sanitizer memcheck; echo "exit $?"
    cp "$c" "$OUT/sanitized-case.json"
    $PY -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get('sanitizer'), indent=1))" "$c" ;;
  mutants)
    timeout 560 $PY -m fuzz mutants --backend cuda --budget-s 20 2>&1 | tail -25 ;;
  chains)  # the chain and float mutants (docs/chains.md), 60 s each at most
    timeout 400 $PY -m fuzz mutants --backend cuda --budget-s 60 \
      --only $($PY -c "from fuzz.tools.mutants import MUTANTS as M; print(*(m.name for m in M if m.name.startswith(('chain-', 'float-'))))") 2>&1 | tail -12 ;;
  bench)
    timeout 400 $PY -m fuzz bench --seconds 30 --out "$OUT/bench-gpu.json" --plot "$OUT/bench-gpu.svg" 2>&1 | tail -20 ;;
  read-table)
    timeout 235 $PY benchmarks/sweep_read_table.py --budget-s 200 --out "$OUT/sweep-read-table.json" 2>&1 | tail -12
    timeout 120 $PY benchmarks/ab_unroll.py --out "$OUT/ab-unroll.json" 2>&1 | tail -6
    timeout 70 $PY benchmarks/vector_oracle_gpu.py --out "$OUT/vector-oracle.json" 2>&1 | tail -12 ;;
  profiles)
    timeout 150 $PY benchmarks/profile_gpu.py kernels --set kvkernels --seconds 4 --warmup 8 --top 12 2>&1 | tail -14
    timeout 120 $PY benchmarks/profile_gpu.py syncs --set kvkernels --seconds 6 --warmup 8 --top 15 2>&1 | tail -17
    timeout 150 $PY benchmarks/profile_ready.py --backend cuda --repeats 4 --out "$OUT/ready.json" 2>&1 | grep -vi warn | tail -4 | cut -c1-700
    timeout 200 $PY benchmarks/profile_collect.py --backend cuda --seqs 15 --attribute --rounds 4 --out "$OUT/attribute.json" 2>&1 | grep -vi warn | tail -2 | cut -c1-1200 ;;
  pinning)
    $PY -m fuzz run --backend cuda --check-every 16 --workers 4 --budget-s 40 --out /tmp/gpu-runs-pinning \
      --progress-s 1000 --summary "$OUT/pinning.json" &
    sleep 30
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv
    nvidia-smi --query-gpu=index,uuid --format=csv
    wait ;;
  sglang)
    campaign sglang-small 20 --kernels kvfuzz-sglang
    campaign sglang-production 20 --kernels kvfuzz-sglang --scale production ;;
  foreign-guidance)  # trips derived from the op and the launch (fuzz/engine/spec_features.py), literal blocks
    timeout 200 $PY -m benchmarks.guided_vs_blind --backend cuda --parts overhead --ops 800 --rounds 3 \
      --kernels $FOREIGN/team_tables.py --note "one GPU, nothing else running" --out "$OUT/overhead-cuda-team.json" 2>&1 \
      | grep -vi warn | tail -4 | cut -c1-500
    timeout 200 $PY -m benchmarks.guided_vs_blind --backend cuda --parts kill-ops --seeds 3 --max-ops 1500 \
      --fixtures kernels=$FOREIGN/team_tables_third_trip.py,kernels=$FOREIGN/team_tables_kv_start.py \
      --note "one GPU, nothing else running" --out "$OUT/kill-ops-cuda-team.json" 2>&1 | grep -E "median|Error" | cut -c1-300 ;;
  replay-matrix)  # RM_ONLY (default all four), seeds RM_FIRST.., each campaign a process of its own, RM_JOBS at once;
    # --op-timeout 1.5 as on the interpreter: a fresh child loads every kernel in its smoke test before op 1, so an op
    # of these sizes takes milliseconds, and every candidate that still hangs costs one op-timeout. RM_SHRINK_JOBS:
    # each campaign's --shrink-jobs (empty: kvfuzz run's default, half the cores up to 4); RM_JOBS x RM_SHRINK_JOBS
    # fresh children (each a CUDA context) shrink at once, twice that many alive with the ones started ahead;
    # RM_REPLAY_JOBS: a case's replays (20 for flaky) this many at once
    # RM_SPECS ("FIXTURE:FIRST:CAMPAIGNS ..."): instead, one replay_matrix.py per spec, all at once (each its campaigns
    # at once), their tables merged; every case they wrote comes back in replay-matrix-cases.tgz
    local rm=(timeout "${RM_TIMEOUT:-540}" $PY benchmarks/replay_matrix.py --backend cuda --replay-jobs "${RM_REPLAY_JOBS:-4}"
              --op-timeout "${RM_OP_TIMEOUT:-1.5}" ${RM_SHRINK_JOBS:+--shrink-jobs "$RM_SHRINK_JOBS"})
    if [ -n "${RM_SPECS:-}" ]; then
      local spec f first n pids=() outs=()
      for spec in $RM_SPECS; do
        IFS=: read -r f first n <<< "$spec"
        outs+=("/tmp/gpu-runs-rm-$f-$first/replay_matrix.json")
        "${rm[@]}" --only "$f" --first-seed "$first" --campaigns "$n" --jobs "$n" --out "/tmp/gpu-runs-rm-$f-$first" \
          > "/tmp/gpu-runs-rm-$f-$first.log" 2>&1 &
        pids+=($!)
      done
      wait "${pids[@]}"
      $PY benchmarks/replay_matrix.py --merge $(ls "${outs[@]}" 2>/dev/null) --out "$OUT" > /dev/null 2>&1
      tar czf "$OUT/replay-matrix-cases.tgz" -C /tmp $(cd /tmp && ls -d gpu-runs-rm-*) 2>/dev/null
      grep -hE "seed [0-9]+:" /tmp/gpu-runs-rm-*.log | head -60
      return
    fi
    "${rm[@]}" --campaigns "${RM_CAMPAIGNS:-10}" --first-seed "${RM_FIRST:-0}" \
      --only "${RM_ONLY:-exit_nth,kill_nth,hang_nth,flaky}" --jobs "${RM_JOBS:-12}" --deadline-s "${RM_DEADLINE:-300}" \
      --out /tmp/gpu-runs-rm > "$OUT/replay-matrix-runs.log" 2>&1
    echo "exit $?"; cp /tmp/gpu-runs-rm/replay_matrix.json /tmp/gpu-runs-rm/replay_matrix.md "$OUT/" 2>/dev/null
    grep -E "seed" "$OUT/replay-matrix-runs.log" | head -60 ;;
  shrink-width)  # SW_ONLY fixtures (default hang_nth) at seeds SW_SEEDS (default 1: 28 -> 9 ops, 137 candidates on an
    # H100 and on the interpreter), each campaign once per width of SW_WIDTHS (default 1,4), the widths of a seed back to
    # back; SW_ALONE=1: each fault case shrunk on its own by kvfuzz minimize instead (benchmarks/results/shrink-width-interpret/)
    timeout "${SW_TIMEOUT:-560}" $PY benchmarks/shrink_width.py --backend cuda --only "${SW_ONLY:-hang_nth}" \
      --seeds "${SW_SEEDS:-1}" --widths "${SW_WIDTHS:-1,4}" ${SW_ALONE:+--alone} --out /tmp/gpu-runs-sw \
      > "$OUT/shrink-width-runs.log" 2>&1
    echo "exit $?"; cp /tmp/gpu-runs-sw/*.json /tmp/gpu-runs-sw/*.md "$OUT/" 2>/dev/null; cat "$OUT/shrink-width-runs.log" ;;
  sglang-allocator)  # SGLANG_BUDGET s of the shipped file on SGLANG_WORKERS workers, the planted bugs meanwhile
    # in three groups, each mutant --max-sequences SGLANG_KILL_SEQ --stop-on-first, its case replayed on the
    # mutant and on the shipped file; about 8 minutes. SGLang's files are loaded by path from
    # EXTRA_PYTHONPATH (the wheel is cp311: nothing is pip-installed on the GPU machine).
    local budget=${SGLANG_BUDGET:-300} g i=0 clean pids=()
    timeout $((budget + 150)) $PY -m fuzz run --allocator kvfuzz-sglang --backend cuda --budget-s "$budget" \
      --workers "${SGLANG_WORKERS:-4}" --baseline fuzz/clients/sglang-baseline.json --out /tmp/gpu-runs-sgl-alloc \
      --summary "$OUT/sglang-allocator-clean.json" --progress-s 1000 > /tmp/gpu-runs-sgl-alloc.log 2>&1 &
    clean=$!
    for g in $($PY -c "from fuzz.clients.sglang_mutants import MUTANTS as M; n=list(M); print(*(','.join(n[k::3]) for k in range(3)))"); do
      i=$((i + 1))
      timeout $((budget + 150)) $PY benchmarks/sglang_allocator.py --backend cuda --max-sequences "${SGLANG_KILL_SEQ:-30}" \
        --clean-sequences 0 --mutants "$g" --json "$OUT/sglang-allocator-kills-$i.json" > "/tmp/gpu-runs-sgl-kills-$i.log" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}" "$clean"
    grep -E "^(FAIL|case:|kvfuzz run)" /tmp/gpu-runs-sgl-alloc.log | cut -c1-600
    $PY benchmarks/sglang_allocator.py --shapes-of "$OUT/sglang-allocator-clean.json" --json "$OUT/sglang-allocator-shapes.json"
    for i in 1 2 3; do tail -n 20 "/tmp/gpu-runs-sgl-kills-$i.log" | cut -c1-400; done ;;
  esac
}

for part in "$@"; do
  { step "$part"; run_part "$part"; } 2>&1 | tee "$OUT/$part.log"
done
