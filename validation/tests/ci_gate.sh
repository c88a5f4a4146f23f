#!/usr/bin/env bash
# The validation gate (label validation; docs/validation.md).
#
#   ci_gate.sh --committed <mk-calibrate> <mk-validate> <workdir>
#       The profile is fitted by mk-calibrate on the committed calibration file(s)
#       (validation/data/measured/*-calibration.json) and judged by mk-validate on every other committed
#       measurement file, with --max-median-err from validation/data/validation-threshold.txt and --max-max-err
#       from validation/data/validation-max-threshold.txt. Exit status is mk-validate's (1: the median or the
#       largest error is above its threshold).
#   ci_gate.sh --nccl <mk-calibrate> <mk-validate> <workdir>
#       The same profile and files, judged on their impl "nccl" records (the layered baseline's line, predicted
#       with the nccl-* family) against validation/data/validation-nccl-threshold.txt.
#   ci_gate.sh --internode <mk-calibrate> <mk-validate> <workdir>
#       The same judgement across nodes: the committed 2 x H200 profile, with proxyUs and the network fitted on
#       measured/internode/*-calibrate-network.json, judged on the 2-node all-reduce runs there
#       (*-internode-allreduce-2n.json: two rank processes on one H200 under MPS, loopback TCP; the 4-process
#       runs oversubscribe that host's CPU and are reported, not gated: docs/results.md) against the first
#       number of validation/data/validation-internode-threshold.txt.
#   ci_gate.sh --fused-internode <mk-calibrate> <mk-validate> <workdir>
#       The fused operators across nodes: mk-validate --fused-nodes fused-validation/h100-mps-loopback-2x1.json, the
#       fused line (SimGrid replay of gemm-rs / ag-gemm / gemm-ar) on the files it gates (*-2x1-*.json in
#       measured/internode/fused-nodes),
#       the H100 datasheet profile with proxyUs and the network fitted on the same session's
#       *-calibrate-network.json there, against validation-fused-internode-threshold.txt (mk-calibrate unused).
#   ci_gate.sh --synthetic <mk-calibrate> <mk-validate> <workdir>
#       The same chain on synthetic data, so that it is tested before real calibration data exists:
#       calib-* records timed by a known profile -> mk-calibrate -> mk-validate on collectives timed by the
#       closed form of that profile (the simulator must then agree within noise), a biased file that must fail
#       the gate, a circular profile that must be refused, and the HTML report with a measured trace.
set -u
mode=$1
calibrate=$2
validate=$3
work=$4
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="$here/../data"
rm -rf "$work" && mkdir -p "$work"

# A gate threshold: the first line of validation/data/<file> that is not a comment (default validation-threshold.txt).
read_threshold() {
  local t file=${1:-validation-threshold.txt}
  t=$(grep -v '^[[:space:]]*#' "$data/$file" | grep -v '^[[:space:]]*$' | head -1 | tr -d '[:space:]')
  if ! [[ $t =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
    echo "ci_gate: $data/$file: expected one number (percent) on its first non-comment line, got '$t'" >&2
    exit 2
  fi
  echo "$t"
}

# The committed calibration file(s) (calib) and every other committed measurement file (others).
committed_files() {
  shopt -s nullglob
  calib=("$data"/measured/*-calibration.json)
  others=()
  for f in "$data"/measured/*.json; do
    [[ $f == *-calibration.json ]] || others+=("$f")
  done
}

if [[ $mode == --committed ]]; then
  committed_files
  if [[ ${#calib[@]} -eq 0 || ${#others[@]} -eq 0 ]]; then
    echo "ci_gate: need committed *-calibration.json and collective files in $data/measured" >&2
    exit 2
  fi
  threshold=$(read_threshold) || exit 2
  maxThreshold=$(read_threshold validation-max-threshold.txt) || exit 2
  # The committed measurements are from the 2 x H200 machine: its preset fills what the micro-benchmarks
  # do not measure (network, proxy: unused on one node).
  "$calibrate" --cluster h200x2 --out "$work/profile.json" --summary "$work/fit.txt" "${calib[@]}" || exit $?
  start=$(date +%s)
  "$validate" --cluster h200x2 --profile "$work/profile.json" --max-median-err "$threshold" --max-max-err "$maxThreshold" \
    -j 2 --json "$work/validation.json" "${others[@]}" >"$work/validate.txt"
  rc=$?
  cat "$work/validate.txt"
  echo "ci_gate: threshold $threshold % median (validation/data/validation-threshold.txt), $maxThreshold % max" \
    "(validation/data/validation-max-threshold.txt), $(($(date +%s) - start)) s"
  last=$(tail -1 "$work/validate.txt")
  if ! [[ $last =~ ^validation:\ n=[0-9]+\ median_abs_err_pct=[0-9.]+\ p90_abs_err_pct=[0-9.]+\ max_abs_err_pct=[0-9.]+$ ]]; then
    echo "ci_gate: mk-validate's last line is not the summary line: '$last'" >&2
    exit 1
  fi
  exit $rc
fi

if [[ $mode == --nccl ]]; then
  # The layered baseline's line: the same profile as --committed, its impl "nccl" records against
  # validation-nccl-threshold.txt (--max-median-err-nccl).
  committed_files
  threshold=$(grep -v '^[[:space:]]*#' "$data/validation-nccl-threshold.txt" | grep -v '^[[:space:]]*$' | head -1 |
    tr -d '[:space:]')
  [[ $threshold =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "ci_gate: bad nccl threshold '$threshold'" >&2; exit 2; }
  # NCCL's multi-rank host path (nccl.groupGpuUs) is fitted from the reduce-scatter records' small-size plateau
  # only (calibrate_nccl.hpp): the all-reduce and all-gather records stay held out.
  python3 -c 'import json, sys
files = [json.load(open(f)) for f in sys.argv[2:]]
out = files[0]
out["records"] = [r for d in files for r in d["records"] if r.get("impl") == "nccl"]
json.dump(out, open(sys.argv[1], "w"))' "$work/nccl-reducescatter.json" "$data"/measured/*-reducescatter.json || exit 2
  "$calibrate" --cluster h200x2 --out "$work/profile.json" --summary "$work/fit.txt" "${calib[@]}" \
    "$work/nccl-reducescatter.json" || exit $?
  "$validate" --cluster h200x2 --profile "$work/profile.json" --max-median-err-nccl "$threshold" -j 2 \
    --json "$work/validation.json" "${others[@]}" >"$work/validate.txt"
  rc=$?
  grep -v '^nccl .* records\[' "$work/validate.txt"
  echo "ci_gate: nccl threshold $threshold % (validation/data/validation-nccl-threshold.txt)"
  line=$(grep '^nccl: ' "$work/validate.txt")
  if ! [[ $line =~ ^nccl:\ n=[0-9]+\ median_abs_err_pct=[0-9.]+\ p90_abs_err_pct=[0-9.]+\ max_abs_err_pct=[0-9.]+$ ]]; then
    echo "ci_gate: mk-validate printed no nccl summary line: '$line'" >&2
    exit 1
  fi
  exit $rc
fi

if [[ $mode == --internode ]]; then
  shopt -s nullglob
  calib=("$data"/measured/internode/*-calibrate-network.json)
  runs=("$data"/measured/internode/*-internode-allreduce-2n.json)
  if [[ ${#calib[@]} -eq 0 || ${#runs[@]} -eq 0 ]]; then
    echo "ci_gate: need committed internode/*-calibrate-network.json and *-internode-allreduce-2n.json" >&2
    exit 2
  fi
  threshold=$(grep -v '^[[:space:]]*#' "$data/validation-internode-threshold.txt" | grep -v '^[[:space:]]*$' | head -1 |
    tr -d '[:space:]')
  [[ $threshold =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "ci_gate: bad internode threshold '$threshold'" >&2; exit 2; }
  # --cluster names the base's preset: the loopback runs used one GPU of the node, a system no preset matches.
  "$calibrate" --cluster h200x2 --base "$data/profiles/h200x2-calibrated.json" --out "$work/profile.json" \
    --summary "$work/fit.txt" "${calib[@]}" || exit $?
  "$validate" --cluster "$data/topologies/h200-mps-loopback.json" --profile "$work/profile.json" \
    --max-median-err "$threshold" -j 2 "${runs[@]}" >"$work/validate.txt"
  rc=$?
  cat "$work/validate.txt"
  echo "ci_gate: internode threshold $threshold % (validation/data/validation-internode-threshold.txt)"
  exit $rc
fi

if [[ $mode == --fused-internode ]]; then
  # The fused operators across nodes: one session's calibrate-network and its 2 x 1 fused records (ranks sharing one
  # H100 under MPS, loopback TCP), the H100 datasheet plus the fitted network and proxy. The manifest names those
  # files, the topology and the base preset; mk-validate --fused-nodes runs the chain (the same one the planner's
  # `fused` confidence class runs).
  threshold=$(read_threshold validation-fused-internode-threshold.txt) || exit 2
  "$validate" --fused-nodes "$data/fused-validation/h100-mps-loopback-2x1.json" --max-median-err-fused "$threshold" -j 2 \
    >"$work/validate.txt"
  rc=$?
  cat "$work/validate.txt"
  echo "ci_gate: fused internode threshold $threshold % (validation/data/validation-fused-internode-threshold.txt)"
  line=$(grep '^validation fused: ' "$work/validate.txt")
  if ! [[ $line =~ ^validation\ fused:\ n=[0-9]+\ median_abs_err_pct=[0-9.]+\ p90_abs_err_pct=[0-9.]+\ max_abs_err_pct=[0-9.]+$ ]]; then
    echo "ci_gate: mk-validate printed no fused summary line: '$line'" >&2
    exit 1
  fi
  exit $rc
fi

if [[ $mode != --synthetic ]]; then
  echo "usage: ci_gate.sh --committed|--nccl|--internode|--fused-internode|--synthetic <mk-calibrate> <mk-validate> <workdir>" >&2
  exit 2
fi

# shellcheck source=../../cmake/cli_testlib.sh
source "$here/../../cmake/cli_testlib.sh"

# A known profile, the micro-benchmarks it would produce (with +-0.5 % alternating noise) and a template of
# collective records (placeholder times, filled from the closed form below), plus records mk-validate ignores.
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
known = {"schema": "mkernel.profile.v1", "source": "synthetic: the truth of ci_gate.sh",
         "nvlink": {"alphaUs": 1.3, "bwGBs": 355.0}, "network": {"alphaUs": 3.5, "bwGBs": 50.0},
         "local": {"alphaUs": 0.8, "bwGBs": 2600.0}, "reduceGBs": 1150.0, "flagUs": 0.9, "localFlagUs": 0.4, "dispatchUs": 5.0,
         "peerUserUs": 1.5, "proxyUs": 2.5, "gemmTflops": 742.0}
json.dump(known, open(f"{work}/known.json", "w"), indent=1)
def rec(op, b, t, **extra):
    r = {"op": op, "impl": "mkernel", "dtype": "uint8", "ranks": 2, "bytes": b, "time_us": t,
         "iters": 100, "stat": "median"}
    r.update(extra)
    return r
def write(name, records):
    json.dump({"schema": "mkernel.measurement.v1",
               "system": {"gpu": "NVIDIA H200", "gpus": 2, "link": "NV18"},
               "run": {"date": "2026-11-29", "commit": "5a17e71c", "command": "synthetic (ci_gate.sh)"},
               "records": records}, open(f"{work}/{name}", "w"), indent=1)
noise = lambda k: 1.0 + (0.005 if k % 2 else -0.005)
sizes = [8 << k for k in range(27)]
calib = []
for k, b in enumerate(sizes):
    calib.append(rec("calib-put-nvlink", b, (1.3 + b / 355e3) * noise(k)))
    calib.append(rec("calib-copy-local", b, (0.8 + b / 2600e3) * noise(k + 1)))
    calib.append(rec("calib-reduce", b, (0.7 + b / 1150e3) * noise(k)))
for k in range(9):
    calib.append(rec("calib-flag", 8, 0.9 * noise(k)))
    calib.append(rec("calib-flag-local", 8, 0.4 * noise(k)))
    calib.append(rec("calib-dispatch", 8, 6.5 * noise(k + 1)))           # dispatch + peerUserUs
    calib.append(rec("calib-dispatch-scratch", 8, 5.0 * noise(k + 1)))  # dispatch
write("calib.json", calib)
colls = []
for op, algos in (("allreduce", ["one-shot", "two-shot", "auto:ring"]), ("allgather", ["ring", "direct"]),
                  ("reducescatter", ["ring", "direct"])):
    for algo in algos:
        for k in range(0, 27, 4):
            total = 64 << k
            count = total // 4 if op == "allreduce" else total // 8
            chunks = 4 if total >= (1 << 20) else 1
            colls.append({"op": op, "impl": "mkernel", "algo": algo, "dtype": "float32", "ranks": 2,
                          "bytes": total, "count": count, "redop": "sum", "chunks": chunks, "channels": 1,
                          "inplace": False, "iters": 40, "stat": "median", "time_us": 1.0})
colls.append({"op": "allreduce", "impl": "nccl", "algo": "", "dtype": "float32", "ranks": 2, "bytes": 64,
              "count": 16, "iters": 40, "stat": "median", "time_us": 17.0})
colls.append(rec("enqueue-to-first-step", 8, 15.0, algo="ring"))
write("template.json", colls)
PY

expect 0 'validation: n=' -- "$validate" --profile "$work/known.json" --json "$work/truth.json" "$work/template.json"
# The collective "measurements": the closed form of the known profile, exactly; a copy 25 % slower.
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
truth = {r["index"]: r["closed_us"] for r in json.load(open(f"{work}/truth.json"))["rows"]}
doc = json.load(open(f"{work}/template.json"))
for i, r in enumerate(doc["records"]):
    if i in truth:
        r["time_us"] = truth[i]
json.dump(doc, open(f"{work}/collectives.json", "w"), indent=1)
for i in truth:
    doc["records"][i]["time_us"] *= 1.25
json.dump(doc, open(f"{work}/slow.json", "w"), indent=1)
doc["records"] += json.load(open(f"{work}/calib.json"))["records"]
json.dump(doc, open(f"{work}/mixed.json", "w"), indent=1)
PY

expect 0 'wrote' -- "$calibrate" --cluster h200x2 --out "$work/fitted.json" "$work/calib.json"
check "the fitted profile names its micro-benchmark file" grep -q 'calib.json (run commit 5a17e71c)' "$work/fitted.json"
# The chain: fitted profile -> simulator within noise of the known profile's closed form.
"$validate" --profile "$work/fitted.json" --max-median-err 2 -j 2 "$work/collectives.json" >"$work/chain.txt" 2>&1
rc=$?
check "chain: mk-validate exit 0 (got $rc)" test $rc -eq 0
last=$(tail -1 "$work/chain.txt")
echo "chain: $last"
check "chain: the last line is the summary line" grep -Eq '^validation: n=49 median_abs_err_pct=[0-9.]+ p90_abs_err_pct=[0-9.]+ max_abs_err_pct=[0-9.]+$' <<<"$last"
median=$(sed -E 's/.*median_abs_err_pct=([0-9.]+).*/\1/' <<<"$last")
max=$(sed -E 's/.*max_abs_err_pct=([0-9.]+).*/\1/' <<<"$last")
check "chain: median error $median % < 1 %" awk -v m="$median" 'BEGIN { exit !(m < 1.0) }'
check "chain: max error $max % < 3 %" awk -v m="$max" 'BEGIN { exit !(m < 3.0) }'
check "chain: the profile's provenance is printed" grep -q 'fitted from .*calib.json (run commit 5a17e71c)' "$work/chain.txt"
check "chain: the honesty statement is printed" grep -q 'micro-benchmark (calib-\*) records only' "$work/chain.txt"
check "chain: ignored records are counted" grep -q '49 validated, 2 ignored' "$work/chain.txt"

# The gate: 25 % slower measurements are 20 % off the prediction.
expect 1 'validation: n=49 median_abs_err_pct=(19|20)\.' -- "$validate" --profile "$work/fitted.json" --max-median-err 5 "$work/slow.json"
expect 1 'gate failed.*exceeds --max-median-err 5' -- "$validate" --profile "$work/fitted.json" --max-median-err 5 "$work/slow.json"
expect 0 'validation: n=49' -- "$validate" --profile "$work/fitted.json" --max-median-err 25 "$work/slow.json"
# Honesty: a profile fitted on a file whose collectives are validated is refused.
expect 0 'wrote' -- "$calibrate" --cluster h200x2 --out "$work/circular.json" "$work/mixed.json"
expect 2 'circular' -- "$validate" --profile "$work/circular.json" "$work/mixed.json"
expect 0 'validation: n=49' -- "$validate" --profile "$work/circular.json" "$work/collectives.json"

# The report.
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "SKIP: the report's PNG part: /usr/bin/python3 has no matplotlib (Debian: apt install python3-matplotlib)"
  expect 2 'matplotlib' -- "$validate" --profile "$work/fitted.json" --report "$work/rep" "$work/collectives.json"
  check "a failed report left no directory" test ! -e "$work/rep"
  cli_summary
  exit $?
fi
expect 0 'wrote .*/rep/index.html' -- "$validate" --profile "$work/fitted.json" --report "$work/rep" \
  --trace-record allreduce:two-shot:4MiB "$work/collectives.json"
check "report: index.html" test -s "$work/rep/index.html"
check "report: validation.json" test -s "$work/rep/validation.json"
for op in allreduce allgather reducescatter; do
  for kind in time error; do
    check "report: $kind-$op.png is a PNG" grep -q PNG <(head -c 8 "$work/rep/$kind-$op.png")
    check "report: index.html shows $kind-$op.png" grep -q "src=\"$kind-$op.png\"" "$work/rep/index.html"
  done
done
check "report: the trace file of the chosen record" test -s "$work/rep/trace-allreduce-two-shot-4194304.json"
check "report: index.html links the trace" grep -q 'href="trace-allreduce-two-shot-4194304.json"' "$work/rep/index.html"
check "report: says there was no measured trace" grep -q 'no measured trace given' "$work/rep/index.html"
check "report: states how the profile was obtained" grep -q 'micro-benchmark (calib-\*) records only' "$work/rep/index.html"
check "report: shows the provenance" grep -q 'calib.json (run commit 5a17e71c)' "$work/rep/index.html"
check "report: no temporary directory left" test -z "$(ls -A "$work" | grep -E '^\.rep\.')"

# A "measured" trace in mk-bench's format (pid = rank, tid = lane + 1, args {op, step, lane}) made from the
# predicted one, its steps 10 % longer; then the report puts both side by side.
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
sim = json.load(open(f"{work}/rep/trace-allreduce-two-shot-4194304.json"))
ev = [{"name": e["name"], "cat": "step", "ph": "X", "pid": e["pid"] // 2, "tid": e["tid"], "ts": 50 + 1.1 * e["ts"],
       "dur": 1.1 * e["dur"], "args": {"op": 0, "step": e["args"]["step"], "lane": e["args"]["lane"]}}
      for e in sim["traceEvents"] if e["ph"] == "X"]
json.dump({"displayTimeUnit": "ns", "otherData": {"source": "mk-bench allreduce"}, "traceEvents": ev},
          open(f"{work}/measured-trace.json", "w"))
PY
expect 0 'trace: trace-allreduce-two-shot-4194304.json \(measured: op 0' -- "$validate" --profile "$work/fitted.json" \
  --report "$work/rep" --trace-record allreduce:two-shot:4MiB --measured-trace "$work/measured-trace.json" \
  "$work/collectives.json"
check "report replaced: the trace has measured ranks" grep -q '"measured rank 0 (node 0)"' "$work/rep/trace-allreduce-two-shot-4194304.json"
check "report replaced: the trace has simulated ranks" grep -q '"simulated rank 1 (node 0)"' "$work/rep/trace-allreduce-two-shot-4194304.json"
check "report: the steps that disagree most are listed" grep -q 'disagree most' "$work/rep/index.html"
check "report: validation.json names the measured op" grep -q '"measured_op": 0' "$work/rep/validation.json"
mkdir -p "$work/foreign" && echo keep >"$work/foreign/notes.txt"
expect 2 'holds no previous mk-validate report' -- "$validate" --profile "$work/fitted.json" --report "$work/foreign" \
  "$work/collectives.json"
check "a foreign directory is left alone" test "$(ls "$work/foreign")" = notes.txt

cli_summary
