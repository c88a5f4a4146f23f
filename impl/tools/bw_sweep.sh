#!/usr/bin/env bash
# Large-message tuning sweep: one mk-bench run per (size, collective, algorithm, worker CTAs, chunks, channels),
# one line each, so the per-size defaults (Engine::chooseGenOptions) can be set from measurements.
#
#   impl/tools/bw_sweep.sh <mk-bench> <out dir> [sizes, default 512M] [seconds budget, default 300]
#
# sizes: comma-separated (K/M/G suffixes). The grid comes from the environment (space-separated lists):
#   MK_SWEEP_RUNS     "op:algo ..."  (default "allreduce:two-shot reducescatter:direct allreduce:one-shot allgather:direct")
#   MK_SWEEP_WORKERS  default "64 128"     MK_SWEEP_CHUNKS default "4 8 16"     MK_SWEEP_CHANNELS default "1 2 4"
# Writes <out dir>/sweep.tsv (size op algo workers chunks channels time_us busbw_GBs) and each run's log. Runs
# past the budget are listed as "skipped"; runs without a result row as "failed".
set -u
bench=$1
R=$2
sizes=${3:-512M}
budget=${4:-300}
runs=${MK_SWEEP_RUNS:-allreduce:two-shot reducescatter:direct allreduce:one-shot allgather:direct}
mkdir -p "$R"
out=$R/sweep.tsv
{
  echo "# $(date -u +%F) bw_sweep.sh $bench $R $sizes $budget; MK_SWEEP_RUNS='$runs' MK_SWEEP_WORKERS='${MK_SWEEP_WORKERS:-64 128}'" \
    "MK_SWEEP_CHUNKS='${MK_SWEEP_CHUNKS:-4 8 16}' MK_SWEEP_CHANNELS='${MK_SWEEP_CHANNELS:-1 2 4}'; mk-bench -n 20 -w 5 --reps 3"
  printf 'size\top\talgo\tworkers\tchunks\tchannels\ttime_us\tbusbw_GBs\n'
} > "$out"
one() {  # one <size> <op> <algo> <workers> <chunks> <channels>
  local log="$R/$1-$2-$3-w$4-k$5-c$6.log"
  if (( SECONDS > budget )); then printf '%s\t%s\t%s\t%s\t%s\t%s\tskipped\tskipped\n' "$@" >> "$out"; return; fi
  timeout 60 "$bench" "$2" -b "$1" -e "$1" --algo "$3" --workers "$4" --chunks "$5" --channels "$6" \
    -n 20 -w 5 --reps 3 > "$log" 2>&1
  # The result row: size count type redop impl algo time algbw busbw #wrong.
  local row
  row=$(awk '$5 == "mkernel" {print $7 "\t" $9; exit}' "$log")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" "${row:-failed	failed}" >> "$out"
}
for size in ${sizes//,/ }; do
  for w in ${MK_SWEEP_WORKERS:-64 128}; do
    for run in $runs; do
      for k in ${MK_SWEEP_CHUNKS:-4 8 16}; do
        for c in ${MK_SWEEP_CHANNELS:-1 2 4}; do
          one "$size" "${run%%:*}" "${run#*:}" "$w" "$k" "$c"
        done
      done
    done
  done
done
cat "$out"
