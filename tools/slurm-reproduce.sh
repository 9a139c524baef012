#!/usr/bin/env bash
# Example: the paper-scale sweep of every table as a Slurm array job, one shard per task,
# each on one GPU. Submit from the repository root:
#
#   sbatch --array=0-15 tools/slurm-reproduce.sh        # 16 shards
#   # when all have finished:
#   cargo xtask merge --scale paper --out results/paper-merged results/shard-*
#
# Every shard runs a disjoint, deterministic slice of the distinct runs (by spec hash), so
# shards never repeat each other's work; a shard that is re-submitted skips its finished runs
# and resumes an interrupted one from its checkpoint.
#SBATCH --job-name=fpt-reproduce
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=48:00:00
#SBATCH --output=results/slurm-%A_%a.log
set -euo pipefail
N=${SLURM_ARRAY_TASK_COUNT:?run as an array job}
I=${SLURM_ARRAY_TASK_ID:?run as an array job}
# The GPU build needs the CUDA toolkit on the node: the release fpt is built with
# `--features cuda` when FPT_CUDA=1 (see README "GPU").
cargo xtask reproduce all --scale paper --device cuda --shard "$I/$N" --out "results/shard-$I"
