# Shared by the GPU session scripts (source it first): the environment of a device call (results
# under $OUT, the repository on PYTHONPATH, compiled launches), and helpers.
OUT=${OUT:-benchmarks/results/gpu-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
unset TRITON_INTERPRET
PY=${PY:-python3}
FOREIGN=tests/fixtures/kernels/foreign
# campaign NAME BUDGET EXTRA...: a campaign on CUDA (its summary: $OUT/NAME.json), then each of
# its cases replayed; prints the run line, every case with its rate and history note, and each
# replay's exit code.
step() { echo; echo "== $*  ($(date -u +%T))"; }
campaign() {
  local name=$1 budget=$2; shift 2
  local out=/tmp/v-$name-$RANDOM
  timeout $((budget + 200)) $PY -m fuzz run --backend cuda --budget-s "$budget" --out "$out" \
    --summary "$OUT/$name.json" --progress-s 1000 "$@" > "$out.log" 2>&1
  local rc=$?
  echo "-- $name: exit $rc"
  grep -E "^(FAIL|case:|kvfuzz run)" "$out.log" | cut -c1-500
  grep -A12 -m1 "internal harness error" "$out.log" | tail -8 | cut -c1-300
  for c in "$out"/*.json; do
    [ -f "$c" ] || continue
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); s=d['signature']; print('   case', s['op']+'/'+s['oracle']+'/'+s['field'], 'reproduced', d.get('reproduced'), 'flaky', d.get('flaky'), 'lengths', d.get('lengths'), 'history', (d.get('history') or {}).get('note'))" "$c"
    timeout 200 $PY -m fuzz replay "$c" --op-timeout 20 > "$out.replay" 2>&1
    echo "   replay exit $? $(head -c 300 "$out.replay" | head -1)"
  done
}
util() {  # util NAME: sample GPU utilization every 0.5 s into /tmp/util-NAME.txt until killed
  nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 > "/tmp/util-$1.txt" 2>/dev/null &
  echo $!
}
environment() {  # the GPU, the versions, the cores and the tree of this device call
  step environment
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))'
  nproc; git log --oneline -1 2>/dev/null
}
small_shapes() {  # small_shapes SECONDS W...: a 10 s 8-worker warm-up of the cache, then a campaign of
  # SECONDS with each worker count W (summary $OUT/small-W.json) and the GPU utilization during it
  local s=$1; shift
  timeout 60 $PY -m fuzz run --backend cuda --budget-s 10 --workers 8 --out /tmp/warm --progress-s 1000 > /dev/null 2>&1
  for w in "$@"; do
    step "small shapes, $w workers, $s s"
    local smi; smi=$(util small-$w)
    timeout $((s + 70)) $PY -m fuzz run --backend cuda --budget-s "$s" --workers $w --out /tmp/small-$w \
      --summary "$OUT/small-$w.json" --progress-s 1000 2>&1 | grep -E "^kvfuzz run" | cut -c1-500
    kill "$smi" 2>/dev/null
    echo "GPU utilization % (0.5 s samples): $(tr '\n' ' ' < /tmp/util-small-$w.txt | cut -c1-400)"
  done
}
collection_cost() {  # collection_cost ROUNDS FILE [NOTE]: value features' collection cost on CUDA, in the
  # tree of the current directory (guided_vs_blind --parts overhead --ops 1500, modes alternating per sequence)
  timeout 200 $PY -m benchmarks.guided_vs_blind --backend cuda --parts overhead --ops 1500 --rounds "$1" \
    --note "one H200, nothing else running${3:+; $3}" --out "$2" 2>&1 | grep -vi warn | tail -4 | cut -c1-500
}
cuda_tests() {  # cuda_tests WHY: pytest -m "cuda and not slow" on 8 workers, its result lines
  step "pytest -m 'cuda and not slow' ($1)"
  timeout 240 $PY -m pytest -q -p no:cacheprovider -n 8 -rf -m "cuda and not slow" tests 2>&1 | grep -E "passed|failed|FAILED" | head -12
}
syncs_small() {  # syncs_small WHY TOP: the small track's synchronizing CUDA calls by call site ($OUT/syncs-small.json)
  step "small track: synchronizing CUDA calls by call site ($1)"
  timeout 120 $PY benchmarks/profile_gpu.py syncs --track small --seconds 8 --warmup 4 --top "$2" \
    --out "$OUT/syncs-small.json" 2>&1 | grep -v -i "warn\|USDT" | tail -$(( $2 + 2 )) | cut -c1-300
}
first_case_cuda() {  # first_case_cuda TIMEOUT: the first case over the mutant catalogue, cold then warm
  # (first_case.py, one JSON row per campaign as it comes: $OUT/first-case-cuda.log; the table: $OUT/fc)
  step "first case over the mutant catalogue, cold then warm (first_case.py; rows as they come)"
  timeout "$1" $PY benchmarks/first_case.py --backend cuda --scale small --cold --warm --budget-s 20 \
    --note "one H200, nothing else running; fork daemon (default): cold = no daemon, warm = one left running" \
    --out "$OUT/fc" > "$OUT/first-case-cuda.log" 2>&1
  echo "exit $?"
  tail -14 "$OUT/fc/first_case.md" 2>/dev/null || tail -5 "$OUT/first-case-cuda.log"
}
