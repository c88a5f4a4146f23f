#!/usr/bin/env bash
# Every kind of trace the project writes, loaded with the rules of Perfetto's JSON importer
# (perfetto_rules.py: finite ts, dur >= 0, B/E closed, tid != 0, no partial overlap on a track, named tracks):
#   * the simulator's trace of a 32-rank ring all-reduce (mk-sim --trace; the old writer broke 1 slice in 6);
#   * the measured-vs-simulated trace of mk-validate's report, with the committed mk-bench trace of a 1 MiB
#     two-shot all-reduce (the measured steps re-written by the same writer, each GPU aligned on its first step);
#   * the committed measured trace itself was written by the old engine writer (tid = lane): the rules must
#     reject it, which shows they catch what the new writer fixed.
# Usage: perfetto_traces.sh <mk-sim> <mk-validate> <workdir>
set -u
sim=$1
validate=$2
work=$3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$here/../../cmake/cli_testlib.sh"
py=/usr/bin/python3
rules="$here/perfetto_rules.py"
data="$here/../data"

expect 0 'predicted: ' -- "$sim" --op allreduce --algo ring --cluster dgx-h100 --nodes 4 --bytes 64MiB --trace "$work/sim32.json"
check "the 32-rank simulator trace keeps every slice" "$py" "$rules" "$work/sim32.json"
check "it holds a track per rank and lane (tid from 1)" grep -q '"tid":1,' "$work/sim32.json"

files=()
for f in "$data"/measured/*-h200x2-*.json; do
  [[ $f == *-calibration.json ]] || files+=("$f")
done
measured="$data/traces/2026-11-29-h200x2-eb8af58-allreduce-two-shot-1M.json"
expect 0 'validation: n=' -- "$validate" --profile "$data/profiles/h200x2-calibrated.json" --report "$work/rep" \
  --trace-record allreduce:two-shot:1MiB --measured-trace "$measured" "${files[@]}"
side=$(ls "$work"/rep/trace-*.json 2>/dev/null | head -1)
check "the report holds a side-by-side trace" test -s "$side"
check "the side-by-side trace keeps every slice" "$py" "$rules" "$side"
check "it has measured and simulated ranks" grep -q '"measured rank 1 (node 0)"' "$side"
check "the old engine writer's trace (tid 0) is rejected" bash -c "! '$py' '$rules' '$measured' >'$work/old.txt'"
check "... naming tid 0" grep -q 'tid 0' "$work/old.txt"

cli_summary
