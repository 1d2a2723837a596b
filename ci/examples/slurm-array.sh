#!/usr/bin/env bash
# A kvfuzz campaign as a Slurm job array: each array task fuzzes one shard on one GPU.
#
#   sbatch --array=0-7 ci/examples/slurm-array.sh     # 8 shards
#
# All tasks share one seed (the array's job id, or KVFUZZ_SEED) and --shard I/N gives
# each a disjoint part of it, so the array is one campaign however Slurm schedules it.
# Each task writes its case files to kvfuzz-out/<job id>/shard-<I>/ and exits 1 if it
# found a failure (Slurm then marks that task FAILED). Run it from the repository root
# (or set KVFUZZ_REPO) in an environment where kvfuzz and a CUDA torch are installed.
# One result for the array (one case per signature, docs/nightly.md), once every task ended:
#
#   sbatch --dependency=afterany:JOBID --wrap "python3 -m fuzz merge kvfuzz-out/JOBID --out kvfuzz-out/JOBID-merged"
#
#SBATCH --job-name=kvfuzz
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --time=01:30:00
#SBATCH --output=kvfuzz-%A_%a.log
set -euo pipefail
cd "${KVFUZZ_REPO:-${SLURM_SUBMIT_DIR:-.}}"

# --shard needs 0 <= I < N; an array may start at 1 (--array=1-8), so count from its first
# task. Give the array no step (--array=0-15:2 would number its tasks past N).
SHARD=$((SLURM_ARRAY_TASK_ID - ${SLURM_ARRAY_TASK_MIN:-0}))
OUT="${KVFUZZ_OUT:-kvfuzz-out}/${SLURM_ARRAY_JOB_ID}/shard-${SHARD}"

exec python3 -m fuzz run --backend cuda --budget-s "${KVFUZZ_BUDGET_S:-3600}" --workers 1 \
  --seed "${KVFUZZ_SEED:-${SLURM_ARRAY_JOB_ID}}" --shard "${SHARD}/${SLURM_ARRAY_TASK_COUNT}" --out "$OUT" \
  --summary "$OUT/summary.json"
