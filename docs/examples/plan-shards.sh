#!/usr/bin/env bash
# A plan split over processes (docs/planner.md, "Sharding"): each process plans every n-th (variant, GPU count)
# item, then mk-plan merge writes the plan.json, table and report one process would have. Two launchers:
#
#   mpirun (Open MPI, MPICH, Intel MPI): each rank reads its shard from the launcher (--shard auto)
#     docs/examples/plan-shards.sh mpirun 8
#   Slurm job array: one task a shard, then the merge as a job that depends on the array
#     docs/examples/plan-shards.sh slurm 8
#
# Run it where the shards can see the same files (workload, cluster, profile, measurements) and the same mk-plan.
set -euo pipefail
launcher=${1:-mpirun}
n=${2:-4}
out=${OUT:-plan-shards}
plan=(--workload llama3-70b --cluster dgx-h100 --gpus 64:8192 --what-if nic-bw=2x -j 1)
mkdir -p "$out"
case $launcher in
  mpirun)
    # Rank r writes $out/shard-r.json; -j 1: the ranks are the parallelism.
    mpirun -n "$n" bash -c 'exec mk-plan "$@" --shard auto -q --json "'"$out"'/shard-$OMPI_COMM_WORLD_RANK$PMI_RANK.json"' \
      mk-plan "${plan[@]}"
    mk-plan merge "$out"/shard-*.json --json "$out/plan.json" --report "$out/report"
    ;;
  slurm)
    # SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN of SLURM_ARRAY_TASK_COUNT is the shard.
    job=$(sbatch --parsable --array=0-$((n - 1)) --cpus-per-task=2 --output="$out/shard-%a.log" \
      --wrap="mk-plan ${plan[*]} --shard auto -q --json $out/shard-\$SLURM_ARRAY_TASK_ID.json")
    sbatch --dependency=afterok:"$job" --output="$out/merge.log" \
      --wrap="mk-plan merge $out/shard-*.json --json $out/plan.json --report $out/report"
    ;;
  *) echo "plan-shards.sh: error: launcher '$launcher': expected mpirun or slurm" >&2; exit 2 ;;
esac
