#!/usr/bin/env bash
# mk-plan --shard auto under Open MPI (4 ranks on this machine), then mk-plan merge: the merged plan.json and table
# are the single process's; bad shards exit 2 with one line naming the file. Exit 77 (skipped) without mpirun.
# Usage: shard_mpi.sh <mk-plan> <workdir>
set -u
tool=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../../../cmake/cli_testlib.sh"
command -v mpirun >/dev/null || { echo "mpirun not found: skipped"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
plan=(--workload "$here/data/tiny-workload.json" --cluster dgx-h200 --gpus 8:32 --what-if nic-bw=2x --measured none
      --cache none)
"$tool" "${plan[@]}" --json "$work/single.json" >"$work/single.txt" 2>/dev/null
root=() && [[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
# Each rank takes its shard from OMPI_COMM_WORLD_RANK / _SIZE and writes its own file.
mpirun -n 4 "${root[@]}" --oversubscribe bash -c \
  'exec "$0" "$@" --shard auto -q --json "'"$work"'/shard-$OMPI_COMM_WORLD_RANK.json"' "$tool" "${plan[@]}" \
  >/dev/null 2>"$work/mpi.err"
check "mpirun wrote 4 shards" test -s "$work/shard-3.json" -a -s "$work/shard-0.json"
check "a shard has its section" grep -q '"inputs_digest"' "$work/shard-1.json"
"$tool" merge "$work"/shard-{0,1,2,3}.json --json "$work/merged.json" >"$work/merged.txt" 2>/dev/null
check "merged plan.json is the single process's" cmp -s "$work/single.json" "$work/merged.json"
check "merged table is the single process's" \
  diff <(sed '/^wrote/,$d' "$work/single.txt") <(sed '/^wrote/,$d' "$work/merged.txt")
check "the merge simulated nothing" grep -q '0.0 s (' "$work/merged.txt"

# Bad input: exit 2, one line naming the option or the file, nothing written.
expect 2 'shard index must be in 0..3' -- "$tool" "${plan[@]}" --shard 4/4 --json "$work/x.json"
expect 2 'shard-2.json.*given twice' -- "$tool" merge "$work"/shard-{0,1,2,2,3}.json --json "$work/x.json"
expect 2 'shard 3/4 is missing' -- "$tool" merge "$work"/shard-{0,1,2}.json --json "$work/x.json"
expect 2 'single.json: a whole plan' -- "$tool" merge "$work/single.json" --json "$work/x.json"
"$tool" "${plan[@]}" --token-budget 2T --shard 1/4 -q --json "$work/other-1.json" >/dev/null 2>&1
expect 2 'other-1.json: planned from other inputs' -- "$tool" merge "$work"/shard-0.json "$work/other-1.json" \
  "$work"/shard-{2,3}.json --json "$work/x.json"
one_line_error "$tool" merge "$work"/shard-{0,1,2}.json --json "$work/x.json"
check "nothing written on bad input" test ! -e "$work/x.json"
cli_summary
