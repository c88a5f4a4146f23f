#!/usr/bin/env bash
# Large-message tuning sweep: one mk-bench run per (collective, algorithm, worker CTAs, chunks, channels) at
# one size, one line each, so the per-size defaults (LocalGroup::chooseGenOptions) can be set from measurements.
#
#   impl/tools/bw_sweep.sh <mk-bench> <out dir> [size, default 512M] [seconds budget, default 300]
#
# Writes <out dir>/sweep.tsv (op algo workers chunks channels time_us busbw_GBs) and each run's log. Runs
# whose budget is gone are skipped (listed as "skipped").
set -u
bench=$1
R=$2
size=${3:-512M}
budget=${4:-300}
mkdir -p "$R"
out=$R/sweep.tsv
printf 'op\talgo\tworkers\tchunks\tchannels\ttime_us\tbusbw_GBs\n' > "$out"
one() {  # one <op> <algo> <workers> <chunks> <channels>
  local log="$R/$1-$2-w$3-k$4-c$5.log"
  if (( SECONDS > budget )); then printf '%s\t%s\t%s\t%s\t%s\tskipped\tskipped\n' "$@" >> "$out"; return; fi
  timeout 60 "$bench" "$1" -b "$size" -e "$size" --algo "$2" --workers "$3" --chunks "$4" --channels "$5" \
    -n 20 -w 5 --reps 3 > "$log" 2>&1
  # The result row: size count type redop impl algo time algbw busbw #wrong.
  local row
  row=$(awk '$5 == "mkernel" {print $7 "\t" $9; exit}' "$log")
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" "${row:-failed	failed}" >> "$out"
}
for w in 64 128; do
  for k in 4 8 16; do
    for c in 1 2 4; do
      one allreduce two-shot $w $k $c
      one reducescatter direct $w $k $c
    done
  done
  one allreduce one-shot $w 8 1
  one allreduce one-shot $w 8 2
  one allgather direct $w 8 1
done
column -t "$out"
