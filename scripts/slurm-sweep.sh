#!/bin/bash
# One shard of a harmony-sim sweep per task of a Slurm job array (docs/sweeps.md, "Slurm"). Task I of an array of
# N tasks runs `harmony-sim sweep SWEEP --shard I/N --out OUT/shard-I`; merge the shards when all have finished.
# A task that is killed or requeued resumes where it stopped when it runs again.
#
#   jid=$(sbatch --parsable --array=0-7 scripts/slurm-sweep.sh configs/sweeps/gpt_1b_100b.yaml out/gpt)
#   sbatch --dependency=afterok:$jid --wrap "build/sim/harmony-sim merge out/gpt/merged out/gpt/shard-*"
#
# HARMONY_SIM overrides the binary (default build/sim/harmony-sim, relative to the submission folder).
#SBATCH --job-name=harmony-sweep
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
#SBATCH --requeue
#SBATCH --output=harmony-sweep-%A_%a.out
set -euo pipefail

usage="usage: sbatch --array=0-<N-1> scripts/slurm-sweep.sh SWEEP.yaml OUT_DIR"
sweep=${1:?$usage}
out=${2:?$usage}
sim=${HARMONY_SIM:-build/sim/harmony-sim}
task=${SLURM_ARRAY_TASK_ID:?not in a Slurm job array: $usage}
count=${SLURM_ARRAY_TASK_COUNT:?not in a Slurm job array: $usage}
# Shard indices count from 0 whatever the array's first index (--array=1-8 works too); the array must be a
# contiguous range without a step.
index=$((task - ${SLURM_ARRAY_TASK_MIN:-0}))

exec "$sim" sweep "$sweep" --shard "$index/$count" --out "$out/shard-$index" --threads "${SLURM_CPUS_PER_TASK:-0}"
