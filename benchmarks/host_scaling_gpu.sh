#!/usr/bin/env bash
# The host-scaling figures (benchmarks/host_scaling.py, docs/host.md) on a device call of a GPU host:
# nvidia-h200-x8 (1, 2, 4, 8 GPUs) or -x4 (HOST_GPUS=1,2,4). A call runs rows for at most UNTIL_S
# seconds (default 420: a device call is 10 minutes at most), then copies the table, the JSON and
# the rows done so far to $OUT/host-scaling/. To resume in the next call, put that folder back at
# RES in the working tree first (it travels with the tree; the rows found there are not run again):
#   cp -r FILES_AT/host-scaling/. benchmarks/results/host-scaling-h200x8/
# Usage: OUT=$OUT bash benchmarks/host_scaling_gpu.sh      (knobs: RES, HOST_GPUS, UNTIL_S, EXTRA)
set -u
. benchmarks/gpu_common.sh  # $OUT, $PY, PYTHONPATH, environment
RES=${RES:-benchmarks/results/host-scaling-h200x8}
environment
nvidia-smi -L
step "host scaling into $RES"
# EXTRA: more host_scaling.py options, unquoted so that they split (e.g. "--scales production").
$PY benchmarks/host_scaling.py --out "$RES" --gpus "${HOST_GPUS:-1,2,4,8}" --until-s "${UNTIL_S:-420}" \
  --cache-dir /tmp/host-scaling-triton ${EXTRA:-}
echo "exit $?"
mkdir -p "$OUT/host-scaling/rows"
cp "$RES"/host-scaling.* "$OUT/host-scaling/" 2>/dev/null
cp "$RES"/rows/*.json "$OUT/host-scaling/rows/" 2>/dev/null
ls "$OUT/host-scaling/rows"
