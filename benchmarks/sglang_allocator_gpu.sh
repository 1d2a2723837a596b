#!/usr/bin/env bash
# SGLang's allocator on one GPU (--allocator kvfuzz-sglang --backend cuda): real CUDA events
# recorded on a forward stream, SGLang's compiled kernels. One device call, about 8 minutes:
#   a) the shipped allocator, BUDGET seconds on WORKERS workers, SPEC's hostile probes judged
#      against the kernel adapter's baseline (summary: $OUT/clean.json, shapes met: $OUT/shapes.json);
#   b) meanwhile the planted bugs, three groups in parallel, each mutant --max-sequences KILL_SEQ
#      --stop-on-first, its case replayed on the mutant and on the shipped file ($OUT/kills-*.json).
# SGLang's files come from the tree: EXTRA_PYTHONPATH names a directory holding sglang/ and its
# dist-info (the wheel is cp311; files are loaded by path, nothing is pip-installed there).
# Tried on a CPU first with BACKEND=torch.
set -u
BACKEND=${BACKEND:-cuda}
BUDGET=${BUDGET:-300}
WORKERS=${WORKERS:-4}
KILL_SEQ=${KILL_SEQ:-30}
source benchmarks/gpu_common.sh
[ "$BACKEND" = cuda ] && environment
CLEAN=${CLEAN:-1}  # 0: the kill table alone
step "clean: --allocator kvfuzz-sglang --backend $BACKEND --budget-s $BUDGET --workers $WORKERS (CLEAN=$CLEAN)"
[ "$CLEAN" = 1 ] && (timeout $((BUDGET + 150)) $PY -m fuzz run --allocator kvfuzz-sglang --backend "$BACKEND" --budget-s "$BUDGET" \
   --workers "$WORKERS" --baseline fuzz/clients/sglang-baseline.json --out /tmp/sgl-alloc-clean \
   --summary "$OUT/clean.json" --progress-s 1000 > /tmp/sgl-alloc-clean.log 2>&1; echo "clean exit $?" >> /tmp/sgl-alloc-clean.log) &
clean=$!  # (unset when CLEAN=0)
groups=$($PY -c "from fuzz.clients.sglang_mutants import MUTANTS as M; n=list(M); print(' '.join(','.join(n[i::3]) for i in range(3)))")
i=0; pids=()
for g in $groups; do
  i=$((i + 1))
  timeout $((BUDGET + 150)) $PY benchmarks/sglang_allocator.py --backend "$BACKEND" --max-sequences "$KILL_SEQ" \
    --clean-sequences 0 --mutants "$g" --json "$OUT/kills-$i.json" > "/tmp/sgl-kills-$i.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"; [ "$CLEAN" = 1 ] && wait "$clean"
step "results"
grep -E "^(FAIL|case:|kvfuzz run|clean exit)" /tmp/sgl-alloc-clean.log | cut -c1-600
[ "$CLEAN" = 1 ] && $PY -c "
import json, sys
from benchmarks.sglang_allocator import shapes_met
s = json.load(open('$OUT/clean.json'))
json.dump(shapes_met(s['sequences']), open('$OUT/shapes.json', 'w'), indent=1)
print('ops', s['ops'], 'sequences', s['sequences'], 'failures', [(f['signature'], f.get('known')) for f in s['failures']])
print('by_kind', s['by_kind'])
"
for i in 1 2 3; do tail -n 20 "/tmp/sgl-kills-$i.log" | cut -c1-400; done
