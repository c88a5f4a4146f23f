#!/usr/bin/env bash
# mk-plan's contract: the table and the report for a good run, the same plan.json for the same inputs, exit 2 with
# one line naming the field or path for bad input and nothing written, a previous report replaced whole.
# Usage: cli_contract.sh <mk-plan> <workdir>
set -u
tool=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../cmake/cli_testlib.sh"

cp "$(dirname "${BASH_SOURCE[0]}")/data/tiny-workload.json" "$work/tiny.json"  # a small transformer: TP in a node, DP across
tiny=("$tool" --workload "$work/tiny.json")
run=("${tiny[@]}" --cluster dgx-h200 --gpus 8:32)

# bad input: exit 2, exactly one line on stderr, and no output (report, json, temporary directories) afterwards
bad() {
  local pattern=$1
  shift 2
  expect_error "$pattern" -- "$@" --json "$work/bad.json" --report "$work/bad-report"
  if compgen -G "$work/bad*" >/dev/null || compgen -G "$work/.bad*" >/dev/null; then
    echo "FAIL: $* left $(ls -d "$work"/bad* "$work"/.bad* 2>/dev/null)"
    failures=$((failures + 1))
    rm -rf "$work"/bad* "$work"/.bad*
  else
    passes=$((passes + 1))
  fi
}

# ---- a good run: the table, the report, plan.json ----
expect 0 '^== baseline$' -- "${run[@]}" --what-if nic-bw=2x --report "$work/rep" --json "$work/a.json"
check "the report has index.html" test -s "$work/rep/index.html"
for png in step-time breakdown comm throughput what-ifs; do
  check "the report has $png.png" test -s "$work/rep/$png.png"
done
check "the report has plan.json" test -s "$work/rep/plan.json"
check "the report has run-stats.json" test -s "$work/rep/run-stats.json"
check "the report's plan.json is --json's" cmp -s "$work/a.json" "$work/rep/plan.json"
check "no temporary directory is left" bash -c "! compgen -G '$work/.rep*' >/dev/null"
check "plan.json says the fused variant is priced" grep -q '"status": "available"' "$work/a.json"
check "plan.json has a fused speedup" grep -Eq '"fused_speedup": [0-9]' "$work/a.json"
check "the page says the fused variant is priced" grep -q 'fused: available' "$work/rep/index.html"
# The committed fused records across nodes (their manifest in validation/data/fused-validation): the fused class
# carries their error,
# extrapolated to the planned cluster, and says what was not measured.
check "the priced fused variant is marked extrapolated, neither validated nor failed" \
  bash -c "grep -q \"class='ex'>fused: available, extrapolated\" '$work/rep/index.html' && ! grep -q \"fused: available, not validated\" '$work/rep/index.html' && ! grep -q \"class='bad'>fused\" '$work/rep/index.html'"
check "plan.json's fused class carries the error measured over loopback TCP, not NVLink" python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["confidence"]["classes"]["fused"]
assert c["status"] == "extrapolated" and c["error"]["n"] > 0 and c["error"]["median_abs_err_pct"] >= 0, c
assert "loopback" in c["method"] and "not measured across GPUs (NVLink)" in c["method"], c["method"]
assert c["measured_gpu"].startswith("NVIDIA H100"), c' "$work/a.json"
check "the page marks numbers that are not validated" grep -q 'not validated' "$work/rep/index.html"
check "every image of the page exists" bash -c "for f in \$(grep -o \"src='[^']*'\" '$work/rep/index.html' | cut -d\"'\" -f2); do test -s '$work/rep/'\$f || exit 1; done"
expect 0 'GPUs +layered +fused +speedup' -- "${run[@]}"
# the headline first, the table's bottleneck and memory columns, counts without exponents, in 120 columns
"${run[@]}" >"$work/table.txt" 2>/dev/null
check "the terminal says the fused prices are extrapolated, with their error" \
  grep -Eq '^fused: available, extrapolated: median \|error\| [0-9.]+ % on [1-9][0-9]* fused records' "$work/table.txt"
check "the terminal starts with the headline" grep -Eq '^headline: tiny on 32 x NVIDIA H200 .*step [0-9.]+ ms ±[0-9.]+ %' "$work/table.txt"
check "the headline calls fusing modelled, extrapolated (the fused class's status)" \
  bash -c "sed -n '/^headline:/,/^workload:/p' '$work/table.txt' | tr -s ' \n' ' ' | grep -q '(modelled, extrapolated)'"
check "the table has the band, bottleneck and memory columns" grep -Eq '^ +GPUs nodes tp/pp/dp/ep +mb +step +band tokens/s +MFU scale +bound +mem/GPU' "$work/table.txt"
check "the table's rows say what bounds them and the memory per GPU" grep -Eq '^ +32 +4 +8/1/4/1 .* compute [0-9]+ % +[0-9.]+ GB ' "$work/table.txt"
check "no number of the table is in exponent form" bash -c '! grep -Eq "[0-9]e[+-][0-9]" "$0"' "$work/table.txt"
check "the baseline's table fits 120 columns" python3 -c '
import sys
lines = open(sys.argv[1], encoding="utf-8").read().split("== baseline\n")[1].splitlines()
rows = [l for l in lines[:next((i for i, l in enumerate(lines) if not l.startswith(" ")), len(lines))]]
assert len(rows) == 4 and max(map(len, rows)) <= 120, rows
' "$work/table.txt"
check "plan.json carries the headline" grep -q '"headline": "tiny on 32 x NVIDIA H200' "$work/a.json"
check "the page starts with the headline" grep -q "<p class='headline'><b>tiny on 32 x NVIDIA H200" "$work/rep/index.html"
check "the page gives each step its band" grep -Eq '[0-9] ms ±[0-9.]+ %' "$work/rep/index.html"
expect 0 'does not fit: [0-9.]+ GB of 0.5 GB per GPU' -- "${run[@]}" --gpu-memory 0.5
expect 0 'mk-plan: [0-9]+ of [0-9]+ collectives simulated' -- "${run[@]}" -q
expect 0 'llama3-405b .*layers 126, hidden 16384' -- "$tool" --list-workloads
expect 0 'huggingface.co/mistralai/Mixtral-8x22B-v0.1' -- "$tool" --list-workloads
expect 0 '--what-if' -- "$tool" --help

# ---- the kernel census: valid JSON, every stage's kernels with the contract's fields and their price ----
expect 0 "wrote $work/kernels.json" -- "${run[@]}" -q --emit-kernels "$work/kernels.json"
check "the census is JSON with the contract's fields, every kernel priced" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["schema"] == "mkernel.kernel-census.v1", d["schema"]
assert [s["gpus"] for s in d["scales"]] == [8, 16, 32]
classes = set()
for s in d["scales"]:
    assert s["unpriced"] == []
    for st in s["stages"]:
        for k in st["kernels"]:
            for f in ("class", "kernel", "pass", "dtype", "flops", "bytes", "times", "price"):
                assert f in k, (k["name"], f)
            assert k["price"]["us_per_launch"] > 0 and k["price"]["source"] in ("kernel-model", "kernel-model: extrapolated", "gemm-model", "roofline: unmeasured")
            classes.add(k["class"])
want = {"gemm", "attention", "norm", "activation", "rotary", "residual", "loss", "embedding", "optimizer", "grad-norm"}
assert want <= classes, want - classes
' "$work/kernels.json"
expect 0 'kernels: [0-9]+ kernel models fitted on [0-9]+ kernel records' -- "${run[@]}"
expect 2 "--emit-kernels $work/no/k.json: directory '$work/no' does not exist" -- \
  "${run[@]}" --emit-kernels "$work/no/k.json"
expect 2 "--json $work/a.json and --emit-kernels $work/a.json" -- \
  "${run[@]}" --emit-kernels "$work/a.json" --json "$work/a.json"

# ---- the same inputs give the same plan.json; a previous report is replaced ----
expect 0 'report: ' -- "${run[@]}" --what-if nic-bw=2x --report "$work/rep" --json "$work/b.json"
check "the same inputs give the same plan.json" cmp -s "$work/a.json" "$work/b.json"
# The validation's predictions: kept in --cache between runs, each run simulated afresh with --cache none; the
# plan is the same either way. On one small committed file (4 records) and no fused records, so that the uncached
# runs stay cheap.
mkdir -p "$work/measured"
cp "$(dirname "${BASH_SOURCE[0]}")/../../data/measured/2026-11-30-h200x2-5400cad-allreduce-w128.json" "$work/measured/"
small=("${run[@]}" -q --measured "$work/measured" --fused-validation none)
expect 0 'validation: [1-9][0-9]* distinct predictions, 0 of them from the cache' -- \
  "${small[@]}" --cache "$work/cache" --json "$work/c1.json"
expect 0 'validation: ([0-9]+) distinct predictions, \1 of them from the cache' -- \
  "${small[@]}" --cache "$work/cache" --json "$work/c2.json"
expect 0 ', 0 of them from the cache' -- "${small[@]}" --cache none --json "$work/c3.json"
check "a plan from the cache is the plan simulated afresh" cmp -s "$work/c2.json" "$work/c3.json"
check "the cached and the fresh plan agree with the first" cmp -s "$work/c1.json" "$work/c3.json"
check "without fused records across nodes the fused class has no error and says where it was validated" python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["confidence"]["classes"]["fused"]
assert c["status"] == "not available" and c["error"] is None, c
assert "validated only where the network is the slow part" in c["method"], c["method"]' "$work/c1.json"
check "a replaced report is complete" test -s "$work/rep/index.html"
check "no old report is left next to it" bash -c "! compgen -G '$work/.rep*' >/dev/null"
# --json inside the --report folder: refused before any simulation, naming both, the previous report left whole
echo old >"$work/rep/copy.json"
expect 2 "^mk-plan: error: invalid-argument: --json $work/rep/copy.json and --report $work/rep: the first lies inside" -- \
  "${run[@]}" --report "$work/rep" --json "$work/rep/copy.json"
check "a refused --report/--json pair left --json's target alone" test "$(cat "$work/rep/copy.json")" = old
check "a refused --report/--json pair left the report alone" cmp -s "$work/b.json" "$work/rep/plan.json"

# ---- infeasible GPU counts are rows with their reason, not errors ----
expect 0 '32  not feasible: training.globalBatch 2 is not a multiple of dp x microBatch = 4 at 32 GPUs' -- \
  "${tiny[@]}" --cluster dgx-h200 --global-batch 2 --gpus 8,32

# ---- bad input ----
printf '{"schema": "mkernel.workload.v1", "model": {' >"$work/broken.json"
printf '{"tpp": 4}' >"$work/layout-typo.json"
printf '{"preset": "dgx-h200", "nodes": 2}' >"$work/two-nodes.json"
mkdir -p "$work/foreign" && touch "$work/foreign/precious.txt"
bad "unknown workload 'gpt5': not a preset \(gpt3-175b, .*llama3-8b" -- "$tool" --workload gpt5
printf '{"preset": "deepseek-v3", "model": {"mla": {"kvLoraRank": 0}}}' >"$work/mla-zero.json"
bad "mla-zero.json: model.mla.kvLoraRank must be > 0" -- "$tool" --workload "$work/mla-zero.json"
printf '{"preset": "llama3.1-8b", "model": {"activation": "relu"}}' >"$work/relu.json"
bad "model.activation must be \"swiglu\", \"geglu\", \"gelu\" or \"squared-relu\" \(got \"relu\"\)" -- \
  "$tool" --workload "$work/relu.json"
bad "broken.json: workload: not valid JSON" -- "$tool" --workload "$work/broken.json"
bad "layout.tp 3 does not divide model.heads 16" -- "${run[@]}" --tp 3
bad "layout-typo.json: unknown field layout.tpp" -- "${run[@]}" --layout "$work/layout-typo.json"
bad "unknown field layout.tpp|layout.tpp" -- "${run[@]}" --layout "$work/layout-typo.json"
bad "no such file|cannot open" -- "${run[@]}" --layout "$work/none.json"
bad "unknown cluster 'dgx-b300'" -- "${tiny[@]}" --gpus 8 --cluster dgx-b300
sed 's/"globalBatch": 64}/"globalBatch": 64, "dtype": "fp8"}/' "$work/tiny.json" >"$work/tiny-fp8.json"
bad "training.dtype: fp8 needs a GPU with FP8 tensor cores \(Hopper or newer\); NVIDIA A100 has none" -- \
  "$tool" --workload "$work/tiny-fp8.json" --gpus 8 --cluster a100-8x200
bad "--gpus 32: cluster '.*two-nodes.json' has 16 GPUs" -- "${tiny[@]}" --gpus 8:32 --cluster "$work/two-nodes.json"
bad "--gpus '64:8': MIN is larger than MAX" -- "${tiny[@]}" --gpus 64:8
bad "--what-if 'colour=red': unknown key 'colour'" -- "${run[@]}" --what-if colour=red
bad "--what-if 'nvlink-domain=2048': node.gpus must be in \[1, 1024\]" -- "${run[@]}" --what-if nvlink-domain=2048
# values whose time would not be finite, and sizes whose product would wrap: refused up front, nothing written
bad "--what-if 'stragglers=0.5:1e300': stragglers slowdown must be in \[1, 100\]" -- \
  "${run[@]}" --what-if stragglers=0.5:1e300
sed 's/"hidden": 2048/"hidden": 4611686018427387904/' "$work/tiny.json" >"$work/huge.json"
bad "training.microBatch x training.seq x model.hidden x bytes per element = 1 x 2048 x 4611686018427387904 x 4 overflows 64 bits" -- \
  "$tool" --workload "$work/huge.json" --cluster dgx-h200 --gpus 8:32
bad "--token-budget 'lots'" -- "${run[@]}" --token-budget lots
bad "layout.ep 2 needs a mixture-of-experts model" -- "${run[@]}" --ep 2
printf '{"tp": 2, "pp": 1, "ep": 2, "etp": 8, "dp": 4}' >"$work/etp8.json"
bad "etp8.json: layout.etp 8 does not divide layout.tp x layout.cp x layout.dp / layout.ep = 4" -- \
  "$tool" --workload mixtral-8x7b --cluster dgx-h200 --gpus 8 --layout "$work/etp8.json"
bad "layout.cp 4 needs training.seq 2050 to be a multiple of 8" -- "${run[@]}" --cp 4 --seq 2050
printf '{"cp": 2, "cpCommType": "ring"}' >"$work/cp-ring.json"
bad "cp-ring.json: layout.cpCommType must be \"p2p\", \"all-gather\", \"a2a\" or \"a2a\+p2p\"" -- \
  "${run[@]}" --layout "$work/cp-ring.json"
bad "cannot open '$work/missing-profile.json'" -- "${run[@]}" --profile "$work/missing-profile.json"
bad "give at most one of --profile" -- "${run[@]}" --profile x.json --datasheet
bad "--measured $work/nowhere: no such directory" -- "${run[@]}" --measured "$work/nowhere"
bad "--pp-schedule 'zb'" -- "${run[@]}" --pp-schedule zb
bad "--sp 'maybe': expected on or off" -- "${run[@]}" --sp maybe
# outputs that cannot be written: checked before any simulation
expect 2 "--report $work/no/such/dir: parent directory '$work/no/such' does not exist" -- \
  "${run[@]}" --report "$work/no/such/dir"
expect 2 "--report $work/foreign is a non-empty directory that holds no previous mk-plan report" -- \
  "${run[@]}" --report "$work/foreign"
check "a foreign directory is left alone" test -f "$work/foreign/precious.txt"
expect 2 "--json $work/no/a.json: directory '$work/no' does not exist" -- "${run[@]}" --json "$work/no/a.json"
# the report generator failing: exit 2 with its reason, no report, no --json file
expect 2 "--report: .*plan_report.py \(run by /bin/false\) failed with exit 1" -- \
  "${run[@]}" --python /bin/false --report "$work/bad-report" --json "$work/bad.json"
check "a failed report leaves no directory" bash -c "! compgen -G '$work/bad*' >/dev/null && ! compgen -G '$work/.bad*' >/dev/null"
expect 2 'error: --jobs must be >= 1' -- "${run[@]}" -j 0
expect 2 '^mk-plan: error: --report: must not be empty' -- "${run[@]}" --report ''

# ---- clusters mean what they say (issue 33) ----
quick=("${tiny[@]}" --gpus 16 --measured none --cache none -q)
# a preset with 4 NICs per GPU plans (its baseline blamed a what-if never given), and so does more NICs per GPU
expect 0 'distinct collectives' -- "${quick[@]}" --cluster cloud-efa-32x100 --what-if nics=64
# context parallelism plans: its groups are placed and its ring simulated
expect 0 'DP exp  CP exp' -- "${tiny[@]}" --gpus 16 --measured none --cache none --cluster dgx-h200 --cp 2
# the calibrated profile's fractions go to each cluster's own links: TCP NICs and A100 nodes plan unlike DGX H100
for c in dgx-h100 cloud-tcp-8x200 a100-8x200; do "${quick[@]}" --cluster "$c" --json "$work/$c.json" >/dev/null 2>&1; done
step() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["variants"][0]["scales"][0]["layered"]["step_us"])' "$1"; }
check "cloud-tcp-8x200 plans unlike dgx-h100" test "$(step "$work/cloud-tcp-8x200.json")" != "$(step "$work/dgx-h100.json")"
check "a100-8x200 plans unlike dgx-h100" test "$(step "$work/a100-8x200.json")" != "$(step "$work/dgx-h100.json")"
# the NIC-list example of docs/transports.md plans every layout it holds (TP > 1 was 'not feasible: node.nics')
nic_list="$(dirname "${BASH_SOURCE[0]}")/data/nic-list-cluster.json"
for tp in 1 2 4 8; do
  out=$("${tiny[@]}" --cluster "$nic_list" --tp "$tp" --gpus 8:32 --measured none --cache none 2>&1)
  check "the NIC-list cluster plans tp $tp at every count" \
    bash -c '[[ $0 -eq 0 ]] && grep -q "^== baseline" <<<"$1" && ! grep -q "not feasible" <<<"$1"' "$?" "$out"
done
# pipeline stages on GPUs that share a NIC: the replay's second pass must not leave SimGrid deadlocked
out=$("${quick[@]}" --cluster dgx-h200 --pp 2 --what-if nics=4 2>&1)
check "pipeline stages sharing a NIC plan without a SimGrid deadlock" \
  bash -c '[[ $0 -eq 0 ]] && grep -q "distinct collectives" <<<"$1" && ! grep -qi deadlock <<<"$1"' "$?" "$out"

# ZeRO 3 (FSDP) with pipeline stages, and selective recomputation: planned (ZeRO 3 with pp was refused)
expect 0 'distinct collectives' -- "${quick[@]}" --cluster dgx-h200 --pp 2 --zero 3 --recompute selective \
  --recompute-modules mlp,norms
bad "--recompute-modules 'attn': expected" -- "${run[@]}" --recompute selective --recompute-modules core_attn,attn
bad "--recompute-modules needs --recompute selective" -- "${run[@]}" --recompute-modules mlp

# the configs users have: a Hugging Face config.json and Megatron-LM arguments plan; an unknown key or argument is
# exit 2 naming it
printf '%s' '{"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 2048, "intermediate_size": 8192,' \
  '"num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000, "rope_theta": 10000}' >"$work/hf.json"
expect 0 'distinct collectives' -- "${quick[@]}" --cluster dgx-h200 --hf-config "$work/hf.json"
sed 's/"rope_theta"/"frobnicate"/' "$work/hf.json" >"$work/hf-bad.json"
bad "hf-bad.json: frobnicate: unknown key" -- "${run[@]}" --hf-config "$work/hf-bad.json"
margs="--num-layers 4 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 \
--global-batch-size 64 --vocab-size 32000 --bf16 --tensor-model-parallel-size 8 --sequence-parallel --lr 1e-4"
expect 0 'distinct collectives' -- "${quick[@]}" --cluster dgx-h200 --megatron-args "$margs"
bad "--megatron-args: --foo: unknown argument" -- "${run[@]}" --megatron-args "$margs --foo 1"
# a NeMo recipe (YAML) plans through the same arguments; an unknown key under model: is exit 2 naming its path
cat >"$work/recipe.yaml" <<'YAML'
trainer:
  precision: bf16
model:
  micro_batch_size: 1
  global_batch_size: 64
  tensor_model_parallel_size: 8
  sequence_parallel: True
  encoder_seq_length: 2048
  num_layers: 4
  hidden_size: 2048
  num_attention_heads: 16
  optim:
    lr: 1e-4
YAML
expect 0 'distinct collectives' -- "${quick[@]}" --cluster dgx-h200 --recipe "$work/recipe.yaml"
sed 's/^  num_layers:/  foo_bar: 1\n  num_layers:/' "$work/recipe.yaml" >"$work/recipe-bad.yaml"
bad "recipe-bad.yaml: model.foo_bar: unknown key" -- "${run[@]}" --recipe "$work/recipe-bad.yaml"

# the measured training steps: --check-steps predicts each; a step record the planner cannot price is exit 2
measured="$(dirname "${BASH_SOURCE[0]}")/../../data/measured"
expect 0 '^steps: n=[0-9]+ median_abs_err_pct=' -- "$tool" --check-steps --measured "$measured"
mkdir -p "$work/steps-bad"
printf '%s\n' '{"schema": "mkernel.measurement.v1", "system": {"gpu": "NVIDIA H100 80GB HBM3", "gpus": 1},' \
  '"run": {"date": "2026-12-06", "commit": "x", "command": "x"}, "records": [{"op": "step", "impl": "torch",' \
  '"algo": "eager", "dtype": "bfloat16", "ranks": 1, "bytes": 0, "time_us": 1000, "iters": 7, "stat": "median",' \
  '"workload": {"model": {"layers": -1}}}]}' >"$work/steps-bad/steps.json"
expect 2 'steps.json: records\[0\]\.workload: ' -- "$tool" --check-steps --measured "$work/steps-bad"
one_line_error "$tool" --check-steps --measured "$work/steps-bad"
expect 2 'steps.json: records\[0\]\.workload: ' -- "${tiny[@]}" --gpus 8 --measured "$work/steps-bad" --cache none
# a broken manifest of --fused-validation is bad input naming the file and the field, never silently dropped; a
# directory that does not exist is refused
mkdir -p "$work/fn-bad" && echo '{"schema": "mkernel.fused-validation.v1"}' >"$work/fn-bad/m.json"
bad "fn-bad/m.json: missing field 'regime'" -- "${tiny[@]}" --gpus 8 -q --fused-validation "$work/fn-bad" --cache none
bad "--fused-validation $work/none: no such directory" -- "${tiny[@]}" --gpus 8 --fused-validation "$work/none"

# goodput under failures: a table per variant, "unknown" where an input is missing, the same plan.json twice;
# bad values of the failure keys are exit 2 naming the key
fail=(--what-if 'mtbf=gpu:50000h,restart=2min:5min:10min:3min,ckptbw=node:20' --what-if 'restart=10min')
goodput=("${tiny[@]}" --gpus 16 --measured none --cache none --cluster dgx-h200 "${fail[@]}")
expect 0 'goodput under failures' -- "${goodput[@]}" --json "$work/f1.json"
"${goodput[@]}" --json "$work/f2.json" --report "$work/frep" >"$work/f2.txt" 2>&1
check "goodput: the same inputs give the same plan.json" cmp -s "$work/f1.json" "$work/f2.json"
check "goodput: a missing checkpoint write is unknown, not a number" grep -q 'unknown: checkpoint write' "$work/f2.txt"
check "goodput: the report has its table, unknown included" \
  bash -c 'grep -q "<h2>Goodput under failures</h2>" "$0" && grep -q "unknown: checkpoint write" "$0"' \
  "$work/frep/index.html"
check "without --measured the page marks the priced fused variant not validated" \
  grep -q "class='nv'>fused: available, not validated" "$work/frep/index.html"
bad "--what-if 'mtbf=gpu:0h': mtbf must be a duration > 0" -- "${run[@]}" --what-if mtbf=gpu:0h
bad "--what-if 'restart=-1s': restart must be a duration >= 0" -- "${run[@]}" --what-if restart=-1s
bad "--what-if 'mtbf=gpu:50000y': mtbf: unknown unit 'y'" -- "${run[@]}" --what-if mtbf=gpu:50000y
bad "--what-if 'spares=-1': spares must be a whole number" -- "${run[@]}" --what-if spares=-1

# ---- the layout search: a ranked list, its CSV and plan.json's block; a space with no layout is refused ----
search=("${tiny[@]}" --gpus 8 --measured none --cache none --cluster dgx-h200 --search --search-top 1)
expect 0 'layout search: ' -- "${search[@]}" --search-csv "$work/s.csv" --json "$work/s.json"
check "search: the headline says the layout is recommended" grep -q '"headline": "tiny on 8 x NVIDIA H200 (dgx-h200): layout recommended' "$work/s.json"
check "search: the CSV ranks the layouts" grep -q '^8,1,"tp ' "$work/s.csv"
check "search: plan.json has the search block" grep -q '"ranked"' "$work/s.json"
bad "--search: no feasible layout of tiny on 8 GPUs;.* memory .[0-9]*.: the smallest needs" -- "${search[@]}" --gpu-memory 0.001
bad "--search-csv needs --search" -- "${run[@]}" --search-csv "$work/bad.csv"
bad "--search-space needs --search" -- "${run[@]}" --search-space parallelism
expect 0 "tiny on 8 x NVIDIA H200 \(dgx-h200\): layout recommended" -- "${search[@]}" --search-space parallelism
bad "--search-space: everything not in \{full,parallelism\}" -- "${search[@]}" --search-space everything

cli_summary
