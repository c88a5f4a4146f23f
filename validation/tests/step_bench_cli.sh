#!/usr/bin/env bash
# step_bench.py's contract without a GPU (issue 32, item 5): --help and --list need no torch; bad input exits 2
# with one stderr line and writes nothing; a good request on a machine without PyTorch or a GPU exits 3 with one
# line. The full grid has dense and MoE steps (>= 12), each with the fields the planner needs, and every model's
# workload object plans one GPU with mk-plan when its path is given; step_bench_test.py checks the pure-Python parts
# (FP8 grid and GEMMs against mk-plan's census, the --profile summary).  Usage: step_bench_cli.sh <workdir> [mk-plan]
set -u
work=$1
mkplan=${2:-}
here="$(dirname "${BASH_SOURCE[0]}")"
tool="$here/../tools/step_bench.py"
py=/usr/bin/python3
rm -rf "$work" && mkdir -p "$work/adir"
# shellcheck source=../../cmake/cli_testlib.sh
source "$here/../../cmake/cli_testlib.sh"

expect 0 'step_bench.py' -- "$py" "$tool" --help
expect 0 '^# 4 steps, predicted [0-9]+ s' -- "$py" "$tool" --list --grid quick
expect 2 'unknown grid' -- "$py" "$tool" --grid huge --out "$work/s.json"
expect 2 'is a directory' -- "$py" "$tool" --out "$work/adir"
expect 2 'does not exist' -- "$py" "$tool" --out "$work/no/such/s.json"
expect 2 'not a git commit' -- "$py" "$tool" --commit xyz --out "$work/s.json"
expect 2 'required' -- "$py" "$tool" --grid quick
expect 2 'unrecognized' -- "$py" "$tool" --bogus
expect 2 "^step_bench.py: --models: 'gpt9' is not a model of the full grid" -- "$py" "$tool" --grid full --models llama3-8b,gpt9 --out "$work/s.json"
expect 0 '^# 4 steps' -- "$py" "$tool" --list --grid full --models llama3-8b --dtype fp8
expect 2 '^step_bench.py: --profile: folder .* does not exist' -- "$py" "$tool" --out "$work/s.json" --profile "$work/no/p.json"
expect 2 '^step_bench.py: --profile: .* is a directory' -- "$py" "$tool" --out "$work/s.json" --profile "$work/adir"
expect 2 '^step_bench.py: --profile: .* is also --out' -- "$py" "$tool" --out "$work/s.json" --profile "$work/s.json"
for bad in "--grid huge --out $work/s.json" "--out $work/adir" "--commit xyz --out $work/s.json" \
  "--out $work/s.json --profile $work/adir"; do
  # shellcheck disable=SC2086
  one_line_error "$py" "$tool" $bad
done
check "no file written on bad input" test ! -e "$work/s.json"
check "no profile written on bad input" test ! -e "$work/p.json"
# No GPU here (or no PyTorch): exit 3, one line, nothing written.
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  expect 3 'PyTorch|GPU' -- "$py" "$tool" --grid quick --commit 0123456789abcdef --out "$work/s.json"
  one_line_error "$py" "$tool" --grid quick --commit 0123456789abcdef --out "$work/s.json"
  check "no file written without a GPU" test ! -e "$work/s.json"
fi
# The full grid: >= 12 steps, dense and MoE, each with its workload object; one workload file per model.
"$py" "$tool" --list --grid full >"$work/full.jsonl"
check "--list --grid full exits 0" test $? -eq 0
"$py" - "$work/full.jsonl" "$work" <<'PY'
import json, sys
bad, moe, dense, models = [], 0, 0, {}
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    r = json.loads(line)
    for k in ("model", "seq", "micro_batch", "micro_batches", "workload", "flops", "params"):
        if k not in r:
            bad.append("%s lacks %s" % (r.get("model"), k))
    w = r["workload"]
    t, m = w["training"], w["model"]
    if (t["seq"], t["microBatch"], t["globalBatch"]) != (r["seq"], r["micro_batch"], r["micro_batch"] * r["micro_batches"]):
        bad.append("workload.training differs from the step: %s" % line.strip())
    if w["layout"] != {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "sp": False, "zero": 0, "gradDtype": "float32"}:
        bad.append("layout: %s" % w["layout"])
    moe += "moe" in m
    dense += "moe" not in m
    models[r["model"]] = w
if len(models) < 2 or moe == 0 or dense == 0 or moe + dense < 12:
    bad.append("grid: %d dense, %d MoE steps of %s" % (dense, moe, sorted(models)))
for name, w in models.items():
    json.dump(w, open("%s/%s.workload.json" % (sys.argv[2], name), "w"))
for b in bad[:10]:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
check "the full grid carries dense and MoE steps with their workloads" test $? -eq 0
if [[ -n "$mkplan" ]]; then
  for w in "$work"/*.workload.json; do
    expect 0 '1/1/1/1' -- "$mkplan" --workload "$w" --cluster dgx-h100 --gpus 1 --measured none --cache none
  done
fi
# The pure-Python parts (no torch): FP8 steps, predictor, FP8 GEMMs vs the census, the profile summary.
"$py" "$here/step_bench_test.py" "$work/unit" "$mkplan"
check "step_bench_test.py: grid, FP8 GEMMs, profile summary" test $? -eq 0
cli_summary
