#!/usr/bin/env bash
# mk-validate's contract: the table and the last summary line, the gate's exit 1, and bad input (files breaking
# the measurement contract, records that cannot be regenerated, a profile missing a parameter, unwritable
# outputs) exiting 2 with one stderr line and nothing written.
# Usage: validate_cli_contract.sh <mk-validate> <mk-calibrate> <workdir>
set -u
tool=$1
calibrate=$2
work=$3
here="$(dirname "${BASH_SOURCE[0]}")"
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$here/../../cmake/cli_testlib.sh"

# Small measurement files: three mkernel collectives and two records mk-validate ignores; variants that break
# one thing each.
/usr/bin/python3 - "$work" <<'PY'
import copy, json, sys
work = sys.argv[1]
def coll(op, algo, total, count, t):
    return {"op": op, "impl": "mkernel", "algo": algo, "dtype": "float32", "ranks": 2, "bytes": total,
            "count": count, "redop": "sum", "chunks": 1, "channels": 1, "inplace": False, "iters": 40,
            "stat": "median", "time_us": t}
good = {"schema": "mkernel.measurement.v1", "system": {"gpu": "NVIDIA H200", "gpus": 2, "link": "NV18"},
        "run": {"date": "2026-11-29", "commit": "c0ffee00", "command": "mk-bench allreduce"},
        "records": [coll("allreduce", "auto:one-shot", 1024, 256, 18.0),
                    coll("allreduce", "ring", 1048576, 262144, 40.0),
                    coll("allgather", "direct", 65536, 8192, 21.0),
                    {"op": "allreduce", "impl": "nccl", "algo": "", "dtype": "float32", "ranks": 2, "bytes": 1024,
                     "iters": 40, "stat": "median", "time_us": 17.0},
                    {"op": "enqueue-to-first-step", "impl": "mkernel", "algo": "ring", "dtype": "float32",
                     "ranks": 2, "bytes": 8, "iters": 200, "stat": "median", "time_us": 16.0}]}
def write(name, doc):
    json.dump(doc, open(f"{work}/{name}", "w"), indent=1)
write("good.json", good)
def variant(name, edit):
    d = copy.deepcopy(good)
    edit(d)
    write(name, d)
variant("badalgo.json", lambda d: d["records"][1].update(algo="butterfly"))
variant("badcount.json", lambda d: d["records"][2].update(count=4096))
variant("nochunks.json", lambda d: d["records"][0].pop("chunks"))
variant("negative.json", lambda d: d["records"][0].update(time_us=-1))
variant("a100.json", lambda d: d["system"].update(gpu="Tesla V100", gpus=8))
variant("h100.json", lambda d: d["system"].update(gpu="NVIDIA H100", gpus=8))
variant("onlynccl.json", lambda d: d.update(records=[d["records"][3]]))
profile = {"schema": "mkernel.profile.v1", "source": "contract test",
           "provenance": {"tool": "mk-calibrate --out p.json", "measurements": [f"{work}/good.json (run commit c0ffee00)"]},
           "nvlink": {"alphaUs": 1.0, "bwGBs": 360.0}, "network": {"alphaUs": 3.5, "bwGBs": 50.0},
           "local": {"alphaUs": 0.5, "bwGBs": 2000.0}, "reduceGBs": 1200.0, "flagUs": 1.0, "dispatchUs": 12.0,
           "proxyUs": 2.5, "gemmTflops": 700.0}
json.dump(profile, open(f"{work}/circular.json", "w"))
profile["provenance"]["measurements"] = [f"{work}/calib.json (run commit c0ffee00)"]
json.dump(profile, open(f"{work}/p.json", "w"))
del profile["gemmTflops"]
json.dump(profile, open(f"{work}/nogemm.json", "w"))
PY
good="$work/good.json"
p="$work/p.json"
summary='validation: n=[0-9]+ median_abs_err_pct=[0-9]+\.[0-9]{2} p90_abs_err_pct=[0-9]+\.[0-9]{2} max_abs_err_pct=[0-9]+\.[0-9]{2}'

expect 0 'validation: n=<N> median_abs_err_pct' -- "$tool" --help
expect 0 'SIMULATOR' -- "$tool" --help
expect 0 'validation: n=3 ' -- "$tool" --profile "$p" "$good"
"$tool" --profile "$p" "$good" >"$work/out.txt" 2>"$work/err.txt"
check "the last stdout line is the summary line" grep -Eq "^$summary\$" <(tail -1 "$work/out.txt")
check "exactly one summary line" test "$(grep -c '^validation:' "$work/out.txt")" -eq 1
check "the table has its header" grep -Eq '^op +algo +bytes .*measured\(us\) +sim\(us\) +closed\(us\) +sim err% +cf err%' "$work/out.txt"
check "the table has the auto row" grep -Eq '^allreduce +auto:one-shot +1024 ' "$work/out.txt"
check "the profile source is printed" grep -q "profile: $p (contract test)" "$work/out.txt"
check "the fitted-from files are printed" grep -q 'fitted from .*calib.json (run commit c0ffee00)' "$work/out.txt"
check "ignored records are counted" grep -q '3 validated, 2 ignored' "$work/out.txt"
check "a good run prints nothing on stderr" test ! -s "$work/err.txt"
expect 0 'cluster h200x2 \(from the files' -- "$tool" --profile "$p" "$good"
expect 0 'validation: n=1 ' -- "$tool" --profile "$p" --op allgather "$good"
expect 0 'validation: n=2 ' -- "$tool" --profile "$p" --op allreduce "$good"
expect 0 'validation: n=1 ' -- "$tool" --profile "$p" --algo one-shot "$good"
expect 0 'validation: n=2 ' -- "$tool" --profile "$p" --algo ring,direct "$good"
expect 0 'validation: n=3 ' -- "$tool" --datasheet "$good"
expect 0 'datasheet defaults' -- "$tool" --datasheet "$good"
expect 0 'validation: n=3 ' -- "$tool" --profile "$p" -j 1 "$good"
# The prediction cache: a second run takes every prediction from it, and prints the same table.
cache="$work/cache"
expect 0 '3 distinct predictions for 3 records, 0 of them from the cache .*/cache/predictions-' -- \
  "$tool" --profile "$p" --cache "$cache" "$good"
"$tool" --profile "$p" --cache none "$good" >"$work/fresh.txt" 2>&1
"$tool" --profile "$p" --cache "$cache" "$good" >"$work/cached.txt" 2>&1
check "a second run takes every prediction from the cache" grep -q '3 of them from the cache' "$work/cached.txt"
check "--cache none simulates every prediction" grep -q '0 of them from the cache (off)' "$work/fresh.txt"
check "the cached run prints the same table and summary" \
  diff <(grep -v 'from the cache' "$work/fresh.txt") <(grep -v 'from the cache' "$work/cached.txt")
expect 0 'validation: n=3 ' -- "$tool" --profile "$p" --cluster h200x2 "$work/a100.json"
expect 0 'wrote .*/v.json' -- "$tool" --profile "$p" --json "$work/v.json" "$good"
check "--json has the schema" grep -q '"schema": "mkernel.validation.v1"' "$work/v.json"
check "--json has the gated statistic" grep -q '"gated": "sim.median_abs_err_pct"' "$work/v.json"
# --max-memory: each prediction gets its share; a record above it is bad input, refused before it runs
expect 2 'above --max-memory' -- "$tool" --profile "$p" --max-memory 1K --json "$work/x.json" "$good"
check "a refused run wrote no --json" test ! -e "$work/x.json"
expect 2 'max-memory' -- "$tool" --profile "$p" --max-memory lots "$good"

# The gate: exit 1, the reason on stderr, the summary still the last stdout line.
expect 1 "$summary" -- "$tool" --profile "$p" --max-median-err 0 "$good"
"$tool" --profile "$p" --max-median-err 0 "$good" >"$work/out.txt" 2>"$work/err.txt"
check "gate failure: the summary is still the last line" grep -Eq "^$summary\$" <(tail -1 "$work/out.txt")
check "gate failure: one stderr line" test "$(wc -l <"$work/err.txt")" -eq 1
check "gate failure: says why" grep -q 'exceeds --max-median-err 0' "$work/err.txt"
expect 0 "$summary" -- "$tool" --profile "$p" --max-median-err 100 "$good"
# The gate on the largest error: the same contract, its own reason.
"$tool" --profile "$p" --max-max-err 0 "$good" >"$work/out.txt" 2>"$work/err.txt"
check "max gate failure: exit 1" test $? -eq 1
check "max gate failure: the summary is still the last line" grep -Eq "^$summary\$" <(tail -1 "$work/out.txt")
check "max gate failure: says why" grep -q 'largest absolute error .* exceeds --max-max-err 0' "$work/err.txt"
expect 0 "$summary" -- "$tool" --profile "$p" --max-max-err 100 --max-median-err 100 "$good"

# Bad input: exit 2, one line, nothing written.
expect 2 'exactly one of --profile' -- "$tool" --json "$work/x.json" "$good"
expect 2 'exactly one of --profile' -- "$tool" --profile "$p" --datasheet --json "$work/x.json" "$good"
expect 2 'missing field gemmTflops' -- "$tool" --profile "$work/nogemm.json" --json "$work/x.json" "$good"
expect 2 'io-error.*no/such/profile.json' -- "$tool" --profile "$work/no/such/profile.json" "$good"
head -c 300 "$good" >"$work/truncated.json"
expect 2 'parse-error.*truncated.json' -- "$tool" --profile "$p" --json "$work/x.json" "$work/truncated.json"
expect 2 'negative.json.*records\[0\].time_us' -- "$tool" --profile "$p" "$work/negative.json"
expect 2 'badalgo.json: records\[1\].*unknown algorithm .butterfly.' -- "$tool" --profile "$p" --json "$work/x.json" "$work/badalgo.json"
expect 0 'skipped: .*badalgo.json: records\[1\]' -- "$tool" --profile "$p" --skip-bad "$work/badalgo.json"
expect 0 'validation: n=2 ' -- "$tool" --profile "$p" --skip-bad "$work/badalgo.json"
expect 2 'badcount.json: records\[2\].*count 4096' -- "$tool" --profile "$p" "$work/badcount.json"
expect 2 "nochunks.json: records\[0\].*missing field 'chunks'" -- "$tool" --profile "$p" "$work/nochunks.json"
expect 2 'a100.json.*matches no single cluster preset.*--cluster' -- "$tool" --profile "$p" "$work/a100.json"
expect 2 'different systems' -- "$tool" --profile "$p" "$good" "$work/h100.json"
expect 2 'unknown.*dgx-a1|dgx-a1' -- "$tool" --profile "$p" --cluster dgx-a1 "$good"
expect 2 "unknown op 'allreduse'" -- "$tool" --profile "$p" --op allreduse "$good"
expect 2 'no record to validate' -- "$tool" --profile "$p" "$work/onlynccl.json"
expect 2 'no record to validate' -- "$tool" --profile "$p" --algo two-shot "$good"
expect 2 'circular' -- "$tool" --profile "$work/circular.json" --json "$work/x.json" "$good"
expect 0 'validation: n=1 ' -- "$tool" --profile "$work/circular.json" --cluster h200x2 "$work/a100.json" --op allgather
expect 2 'io-error.*no/such/file.json' -- "$tool" --profile "$p" /no/such/file.json
# one file twice would count its records twice in the medians; an empty file name is not "no file"
expect 2 "^mk-validate: error: .*'$good' and '$(dirname "$good")/./$(basename "$good")' are the same measurement file" -- \
  "$tool" --profile "$p" "$good" "$(dirname "$good")/./$(basename "$good")"
expect 2 '^mk-validate: error: files: must not be empty' -- "$tool" --profile "$p" "$good" ''
expect 2 'io-error.*directory' -- "$tool" --profile "$p" --json "$work/no/such/dir/x.json" "$good"
expect 2 'io-error.*does not exist' -- "$tool" --profile "$p" --report "$work/no/such/dir/rep" "$good"
touch "$work/afile"
expect 2 'not a directory' -- "$tool" --profile "$p" --report "$work/afile" "$good"
expect 2 'needs --trace-record' -- "$tool" --profile "$p" --report "$work/rep" --measured-trace "$good" "$good"
expect 2 'give --report' -- "$tool" --profile "$p" --trace-record allreduce:ring:1MiB "$good"
expect 2 'expected OP:ALGO:BYTES' -- "$tool" --profile "$p" --report "$work/rep" --trace-record allreduce-ring "$good"
expect 2 'no validated record has that op' -- "$tool" --profile "$p" --report "$work/rep" --trace-record allreduce:ring:2MiB "$good"
expect 2 'needs --measured-trace' -- "$tool" --profile "$p" --report "$work/rep" --measured-op 3 "$good"
expect 2 'is not an executable' -- "$tool" --profile "$p" --report "$work/rep" --python "$work/no-python" "$good"
expect 2 'report script .* not found' -- "$tool" --profile "$p" --report "$work/rep" --report-script "$work/none.py" "$good"
printf 'import sys\nprint("boom: the script failed")\nsys.exit(1)\n' >"$work/failing.py"
expect 2 'failed with exit 1: boom: the script failed' -- "$tool" --profile "$p" --report "$work/rep" --json "$work/x.json" \
  --report-script "$work/failing.py" "$good"
check "a failed report left no directory" test ! -e "$work/rep"
check "a failed report left no temporary directory" test -z "$(ls -A "$work" | grep -E '^\.rep\.')"
# --json inside the --report folder: refused before any simulation, naming both options, nothing written
expect 2 "^mk-validate: error: invalid-argument: --json $work/rep/x.json and --report $work/rep: the first lies inside" -- \
  "$tool" --profile "$p" --report "$work/rep" --json "$work/rep/x.json" "$good"
check "a refused --report/--json pair left no folder" test ! -e "$work/rep"
expect 2 '--jobs must be >= 1' -- "$tool" --profile "$p" -j 0 "$good"
# A threshold that could switch a gate off (NaN compares false, inf and huge values pass anything) is bad input:
# exit 2, one line naming the flag and the rule, and nothing written.
for flag in --max-median-err --max-max-err --max-median-err-nccl; do
  for v in nan NaN -1 inf -inf 1e308 1000 100.5 abc 5x ''; do
    expect 2 "^mk-validate: error: $flag: must be a finite number in \\[0, 100\\]" -- \
      "$tool" --profile "$p" "$flag" "$v" --json "$work/x.json" "$good"
    one_line_error "$tool" --profile "$p" "$flag" "$v" "$good"
  done
done
check "a rejected threshold wrote $work/x.json" test ! -e "$work/x.json"
expect 2 'files' -- "$tool" --profile "$p"
one_line_error "$tool" --profile "$work/nogemm.json" "$good"
one_line_error "$tool" --profile "$p" "$work/truncated.json"
one_line_error "$tool" --profile "$p" "$work/badalgo.json"
one_line_error "$tool" --profile "$p" "$work/a100.json"
one_line_error "$tool" --profile "$work/circular.json" "$good"
one_line_error "$tool" --profile "$p" --report "$work/rep" --report-script "$work/failing.py" "$good"
check "a failed run left $work/x.json" test ! -e "$work/x.json"

# Fused records (mk-bench gemm-rs | ag-gemm | gemm-ar): their own line, their own gate; the collectives' line keeps
# its place as the last line. Timed by the model itself (the first run's predictions written back as the times).
/usr/bin/python3 - "$work" <<'PY'
import copy, json, sys
work = sys.argv[1]
def fused(op, order):
    return {"op": op, "impl": "mkernel", "algo": "fused " + order, "dtype": "bfloat16", "ranks": 2, "bytes": 131072,
            "m": 256, "n": 256, "k": 256, "sms": 32, "tile_rows": 128, "order": order, "ctas": 16,
            "compute_ctas": 12, "comm_ctas": 4, "compute_lanes": 1, "layout_b": "row", "shared_gpu": False,
            "iters": 20, "stat": "median", "time_us": 100.0}
good = json.load(open(f"{work}/good.json"))
good["records"] += [fused("gemm-rs", "own-last"), fused("ag-gemm", "own-first"),
                    {"op": "gemm-rs", "impl": "cublas+mkernel", "algo": "cublaslt then reducescatter direct",
                     "dtype": "bfloat16", "ranks": 2, "bytes": 131072, "m": 256, "n": 256, "k": 256, "sms": 32,
                     "iters": 20, "stat": "median", "time_us": 50.0}]
json.dump(good, open(f"{work}/fused.json", "w"), indent=1)
bad = copy.deepcopy(good)
bad["records"][5]["k"] = 1004
json.dump(bad, open(f"{work}/fusedk.json", "w"), indent=1)
only = copy.deepcopy(good)
only["records"] = only["records"][5:]
json.dump(only, open(f"{work}/fusedonly.json", "w"), indent=1)
PY
fsummary='validation fused: n=2 median_abs_err_pct=[0-9]+\.[0-9]{2} p90_abs_err_pct=[0-9.]+ max_abs_err_pct=[0-9.]+'
"$tool" --profile "$p" --json "$work/f.json" "$work/fused.json" >"$work/out.txt" 2>&1
check "fused: the collectives' line is unchanged by fused records" grep -q '^validation: n=3 ' <(tail -1 "$work/out.txt")
check "fused: their own line" grep -Eq "^$fsummary\$" "$work/out.txt"
check "fused: a table row per record" grep -Eq '^ag-gemm +256x256x256 +2x1 +128 own-first +12/4 ' "$work/out.txt"
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
v = json.load(open(f"{work}/f.json"))
d = json.load(open(f"{work}/fused.json"))
for row in v["fused"]["rows"]:
    d["records"][row["index"]]["time_us"] = row["sim_us"]
json.dump(d, open(f"{work}/fusedtimed.json", "w"), indent=1)
d["records"][5]["time_us"] *= 1.3
d["records"][6]["time_us"] *= 1.3
json.dump(d, open(f"{work}/fusedbiased.json", "w"), indent=1)
PY
expect 0 'validation fused: n=2 median_abs_err_pct=0.00 ' -- "$tool" --profile "$p" --max-median-err-fused 1 "$work/fusedtimed.json"
"$tool" --profile "$p" --max-median-err-fused 1 "$work/fusedbiased.json" >"$work/out.txt" 2>"$work/err.txt"
check "fused gate failure: exit 1" test $? -eq 1
check "fused gate failure: says why" grep -q 'fused line.s median absolute error 23.08 % exceeds --max-median-err-fused 1' "$work/err.txt"
check "fused gate failure: the collectives' summary is still the last line" grep -Eq "^$summary\$" <(tail -1 "$work/out.txt")
expect 0 'validation fused: n=2 ' -- "$tool" --profile "$p" "$work/fusedonly.json"
expect_error "fusedk.json: records\[5\] \(gemm-rs 256 x 256 x 1004\): fields m, n, k .*K = 1004 is not a multiple of 8" -- \
  "$tool" --profile "$p" --json "$work/x.json" "$work/fusedk.json"
expect 0 'skipped fused: .*fusedk.json: records\[5\]' -- "$tool" --profile "$p" --skip-bad "$work/fusedk.json"
/usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1])); del d["records"][5]["m"]; json.dump(d, open(sys.argv[2], "w"))' "$work/fused.json" "$work/fusedm.json"
expect_error 'fusedm.json.*records\[5\].*m' -- "$tool" --profile "$p" --json "$work/x.json" "$work/fusedm.json"
expect_error 'max-median-err-fused: no fused record' -- "$tool" --profile "$p" --max-median-err-fused 5 --json "$work/x.json" "$good"
expect_error 'none was validated' -- "$tool" --profile "$p" --max-median-err 5 --json "$work/x.json" "$work/fusedonly.json"
expect_error '^mk-validate: error: --max-median-err-fused: must be a finite number in \[0, 100\]' -- \
  "$tool" --profile "$p" --max-median-err-fused nan --json "$work/x.json" "$work/fused.json"
check "a refused fused run wrote no --json" test ! -e "$work/x.json"
# --fused-nodes MANIFEST: the chain it names, ending with the fused line; a directory, a missing file, or an option
# of the collectives' chain beside it, is bad input
fn="$(dirname "${BASH_SOURCE[0]}")/../data/fused-validation/h100-mps-loopback-2x1.json"
"$tool" --fused-nodes "$fn" --cache none >"$work/fn.txt" 2>&1
check "--fused-nodes ends with the fused line" grep -Eq '^validation fused: n=[1-9][0-9]* ' <(tail -1 "$work/fn.txt")
check "--fused-nodes names the data directory" grep -q 'data .*measured/internode/fused-nodes' "$work/fn.txt"
expect_error "$work: is a directory: give a manifest file" -- "$tool" --fused-nodes "$work"
expect_error "$work/none.json: no such file" -- "$tool" --fused-nodes "$work/none.json"
expect_error 'profile does not apply' -- "$tool" --fused-nodes "$fn" --profile "$p"

# an output never replaces a non-regular file nor one of the command's own inputs
mkfifo "$work/fifo"
expect 2 "^mk-validate: error: .*--json $work/fifo: is a FIFO" -- "$tool" --profile "$p" --json "$work/fifo" "$good"
check "the FIFO is still a FIFO" test -p "$work/fifo"
cp "$good" "$work/good-copy.json"
expect 2 "^mk-validate: error: .*--json $good: is also an input" -- "$tool" --profile "$p" --json "$good" "$good"
expect 2 "^mk-validate: error: .*--json $p: is also an input" -- "$tool" --profile "$p" --json "$p" "$good"
check "the input was not overwritten" cmp -s "$good" "$work/good-copy.json"
one_line_error "$tool" --profile "$p" --json "$good" "$good"

cli_summary
