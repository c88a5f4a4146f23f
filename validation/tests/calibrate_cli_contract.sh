#!/usr/bin/env bash
# mk-calibrate's contract: a good run writes a profile with provenance; bad input exits 2 with one stderr
# line and leaves no output file.  Usage: calibrate_cli_contract.sh <mk-calibrate> <workdir>
set -u
tool=$1
work=$2
here="$(dirname "${BASH_SOURCE[0]}")"
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$here/../../cmake/cli_testlib.sh"
collective="$here/../data/measured/archive/2026-11-29-h200x2-allreduce.json"

# Synthetic micro-benchmark files: nvlink alpha 1.7 us, 370 GB/s; reduce 1300 GB/s; flag 0.65 us; one
# file with a single network point (too few for a fit).
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def rec(op, b, t, **extra):
    r = {"op": op, "impl": "mkernel", "dtype": "uint8", "ranks": 2, "bytes": b, "time_us": t,
         "iters": 100, "stat": "median"}
    r.update(extra)
    return r
def write(name, records):
    json.dump({"schema": "mkernel.measurement.v1", "system": {"gpu": "NVIDIA H200", "gpus": 2},
               "run": {"date": "2026-11-29", "commit": "feedc0de", "command": "mk-bench calibrate"},
               "records": records}, open(f"{work}/{name}", "w"), indent=1)
sizes = [(8 << k) + k % 5 for k in range(27)]
write("calib.json", [rec("calib-put-nvlink", b, 1.7 + b / 370e3) for b in sizes] +
                    [rec("calib-reduce", b, 0.9 + b / 1300e3) for b in sizes] +
                    [rec("calib-flag", 8, t) for t in (0.61, 0.65, 0.66)])
write("few.json", [rec("calib-put-network", 65537, 9.0)])
PY

expect 0 'mk-calibrate' -- "$tool" --help
expect 0 '^Usage: mk-calibrate ' -- "$tool" --help
expect 0 'nvlink.bwGBs +370 ' -- "$tool" --cluster h200x2 --out "$work/p.json" "$work/calib.json"
check "profile written" test -s "$work/p.json"
expect 0 'default \(not measured\)' -- "$tool" --cluster h200x2 --out "$work/p.json" "$work/calib.json"
check "profile has the schema" grep -q '"mkernel.profile.v1"' "$work/p.json"
check "profile names its input and its run commit" grep -q 'calib.json (run commit feedc0de)' "$work/p.json"
check "profile records the command line" grep -q '"mk-calibrate --cluster h200x2 --out' "$work/p.json"
check "profile lists what was not measured" grep -q 'default (not measured): network.alphaUs' "$work/p.json"
# collective records next to the micro-benchmarks are counted and ignored
expect 0 '[0-9]+ other records ignored' -- "$tool" --out "$work/p2.json" "$work/calib.json" "$collective"
expect 0 'wrote' -- "$tool" --out "$work/p3.json" --summary "$work/fit.txt" "$work/calib.json"
check "summary written" grep -q 'nvlink.alphaUs' "$work/fit.txt"
# two outputs on one path: refused before any work, naming both options, the existing target left as it was
echo old >"$work/same.txt"
expect 2 "^mk-calibrate: error: invalid-argument: --out $work/same.txt and --summary $work/same.txt: both name the same path" -- \
  "$tool" --out "$work/same.txt" --summary "$work/same.txt" "$work/calib.json"
check "a refused --out/--summary pair left its target alone" test "$(cat "$work/same.txt")" = old
# the cluster defaults to the preset the files ran on (their system block: 2 x NVIDIA H200)
expect 0 'calibrated on h200x2 ' -- "$tool" --out "$work/p5.json" "$work/calib.json"
# --report changed meaning (an HTML folder in every tool): the old text-file use is refused, naming --summary
expect 2 '^mk-calibrate: error: --report .*--summary FILE' -- "$tool" --out "$work/x.json" --report "$work/fit.txt" "$work/calib.json"

# --base: unmeasured parameters come from a given profile; one missing a parameter is refused
# (written in the efficiency form: fractions of the machine's datasheet rates, the machine named)
check "the profile is written in the efficiency form" grep -q '"machine": "h200x2"' "$work/p.json"
check "its NVLink rate is a fraction of the datasheet's" grep -q '"efficiency": 0\.' "$work/p.json"
sed 's/"gemmEfficiency": [0-9.e-]*/"gemmEfficiency": 0.125/' "$work/p.json" >"$work/base.json"
expect 0 'gemmTflops +92\.71' -- "$tool" --base "$work/base.json" --out "$work/p4.json" "$work/calib.json"
check "profile names its base" grep -q "defaults from $work/base.json" "$work/p4.json"
grep -v '"gemmEfficiency"' "$work/p.json" >"$work/nogemm.json"
expect 2 'missing field gemmEfficiency' -- "$tool" --base "$work/nogemm.json" --out "$work/x.json" "$work/calib.json"

# bad input: exit 2, one line, no file
head -c 200 "$work/calib.json" >"$work/truncated.json"
expect 2 'parse-error.*truncated.json' -- "$tool" --out "$work/x.json" "$work/truncated.json"
sed 's/"time_us": 1.7[0-9]*/"time_us": -1/' "$work/calib.json" >"$work/negative.json"
expect 2 'time_us' -- "$tool" --out "$work/x.json" "$work/negative.json"
expect 2 'no calibration records' -- "$tool" --out "$work/x.json" "$collective"
expect 2 'network \(calib-put-network\).*distinct sizes' -- "$tool" --out "$work/x.json" "$work/calib.json" "$work/few.json"
expect 2 "io-error.*no/such/file.json" -- "$tool" --out "$work/x.json" /no/such/file.json
expect 2 "unknown.*dgx-a1|dgx-a1" -- "$tool" --cluster dgx-a1 --out "$work/x.json" "$work/calib.json"
expect 2 "nodes must be >= 1" -- "$tool" --nodes 0 --out "$work/x.json" "$work/calib.json"
expect 2 "out" -- "$tool" "$work/calib.json"
expect 2 "io-error" -- "$tool" --out "$work/no/such/dir/x.json" "$work/calib.json"
expect 2 "io-error" -- "$tool" --out "$work/x.json" --summary "$work/no/such/dir/fit.txt" "$work/calib.json"
expect 2 "io-error" -- "$tool" --out "$work/no/such/dir/x.json" --summary "$work/fit2.txt" "$work/calib.json"
check "a failed profile write left its report behind" test ! -e "$work/fit2.txt"
# all or nothing: when the second output cannot be written (no room for a temporary next to a 250-character
# name), the first target keeps its old content and no temporary is left
echo old >"$work/fit-old.txt"
long="$work/$(printf 'c%.0s' {1..250})"
expect 2 "io-error.*cannot write" -- "$tool" --summary "$work/fit-old.txt" --out "$long" "$work/calib.json"
check "the summary target kept its old content" grep -qx old "$work/fit-old.txt"
check "no temporary left" test -z "$(find "$work" -name '*.tmp.*')"
# an output never replaces a non-regular file nor one of the command's own inputs
mkfifo "$work/fifo"
expect 2 "^mk-calibrate: error: .*--out $work/fifo: is a FIFO" -- "$tool" --out "$work/fifo" "$work/calib.json"
expect 2 "^mk-calibrate: error: .*--summary $work/fifo: is a FIFO" -- \
  "$tool" --out "$work/x.json" --summary "$work/fifo" "$work/calib.json"
expect 2 "^mk-calibrate: error: .*--out $work: is a directory" -- "$tool" --out "$work" "$work/calib.json"
check "the FIFO is still a FIFO" test -p "$work/fifo"
cp "$work/calib.json" "$work/calib-copy.json"
expect 2 "^mk-calibrate: error: .*--out $work/calib.json: is also an input" -- \
  "$tool" --out "$work/calib.json" "$work/calib.json"
expect 2 "^mk-calibrate: error: .*--summary $work/./calib.json: is also an input" -- \
  "$tool" --out "$work/x.json" --summary "$work/./calib.json" "$work/calib.json"
expect 2 "^mk-calibrate: error: .*--out $work/base.json: is also an input" -- \
  "$tool" --base "$work/base.json" --out "$work/base.json" "$work/calib.json"
check "the input was not overwritten" cmp -s "$work/calib.json" "$work/calib-copy.json"
one_line_error "$tool" --out "$work/calib.json" "$work/calib.json"
one_line_error "$tool" --out "$work/x.json" "$work/truncated.json"
one_line_error "$tool" --out "$work/x.json" "$collective"
one_line_error "$tool" --out "$work/x.json" "$work/few.json"
one_line_error "$tool" --base "$work/nogemm.json" --out "$work/x.json" "$work/calib.json"
# one file under two spellings would weigh its points twice in the fit; an empty path is not "no output"
expect 2 "^mk-calibrate: error: .*'$work/calib.json' and '$work/./calib.json' are the same measurement file" -- \
  "$tool" --out "$work/x.json" "$work/calib.json" "$work/./calib.json"
expect 2 '^mk-calibrate: error: --summary: must not be empty' -- "$tool" --out "$work/x.json" --summary '' "$work/calib.json"
check "a failed run left $work/x.json" test ! -e "$work/x.json"

# --import: nccl-tests output of 2 x dgx-h100 (made by the model at network efficiency 0.8, transport latency 7 us)
nt="$here/data/nccl-tests-allreduce-2x-dgx-h100.txt"
expect 0 'network efficiency 0\.(79|80|81)' -- "$tool" --cluster dgx-h100 --nodes 2 --import "$nt" --out "$work/imp.json"
check "the imported profile names its machine" grep -q '"machine": "dgx-h100"' "$work/imp.json"
check "the imported profile names its input" grep -q 'nccl-tests-allreduce-2x-dgx-h100.txt' "$work/imp.json"
sed '/^ *2097152 /s/ *[0-9]*$//' "$nt" >"$work/short-row.txt"
row=$(grep -n '^ *2097152 ' "$work/short-row.txt" | cut -d: -f1)
expect 2 "short-row.txt:$row: a result row has 13 columns" -- \
  "$tool" --cluster dgx-h100 --nodes 2 --import "$work/short-row.txt" --out "$work/x.json"
sed 's/^\( *1073741824 *[0-9]* *float *sum *-1 *\)[0-9.]*/\1fast/' "$nt" >"$work/nan-row.txt"
expect 2 'nan-row.txt:[0-9]+: time \(us\) must be a number' -- \
  "$tool" --cluster dgx-h100 --nodes 2 --import "$work/nan-row.txt" --out "$work/x.json"
printf 'op,bytes,busbw\nallreduce,1073741824,300\n' >"$work/nounits.csv"
expect 2 'nounits.csv:1: column "busbw" has no unit' -- \
  "$tool" --cluster dgx-h100 --nodes 2 --import "$work/nounits.csv" --out "$work/x.json"
expect 2 'reports 16 ranks.*32 GPUs' -- "$tool" --cluster dgx-h100 --nodes 4 --import "$nt" --out "$work/x.json"
/usr/bin/python3 - "$here/../plan/tests/data/nic-list-cluster.json" "$work/badnic.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["node"]["nics"][1]["gpus"] = [2, 9]
json.dump(t, open(sys.argv[2], "w"))
PY
expect 2 'node\.nics\[1\]\.gpus names GPU 9' -- "$tool" --cluster "$work/badnic.json" --import "$nt" --out "$work/x.json"
expect 2 '--import needs --cluster' -- "$tool" --import "$nt" --out "$work/x.json"
expect 2 'not both' -- "$tool" --cluster h200x2 --import "$nt" --out "$work/x.json" "$work/calib.json"
one_line_error "$tool" --cluster dgx-h100 --nodes 2 --import "$work/short-row.txt" --out "$work/x.json"
check "a failed import left $work/x.json" test ! -e "$work/x.json"

cli_summary
