#!/usr/bin/env bash
# mk-sim's contract: results, exit codes (0 ok, 2 bad input), one clear error line on stderr, and no output
# file left behind on failure.  Usage: cli_contract.sh <mk-sim> <workdir> [<mk-schedule>]
set -u
tool=$1
work=$2
schedtool=${3:-}
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../cmake/cli_testlib.sh"

# bad input: exit 2, exactly one line on stderr, and none of the output files exist afterwards
bad() {
  local pattern=$1
  shift 2
  expect_error "$pattern" -- "$@" --json "$work/bad.json" --trace "$work/bad-trace.json"
  if compgen -G "$work/bad*" >/dev/null; then
    echo "FAIL: $* left $(ls "$work"/bad*)"
    failures=$((failures + 1))
    rm -f "$work"/bad*
  else
    passes=$((passes + 1))
  fi
}

# ---- results ----
expect 0 '^profile: uncalibrated \(datasheet defaults\)$' -- "$tool" --op allreduce --algo ring --cluster dgx-h100 --bytes 1MiB
expect 0 '^predicted: [0-9.]+ (us|ms)  algbw [0-9.]+ GB/s  busbw [0-9.]+ GB/s' -- "$tool" --algo one-shot --cluster h200x2 --bytes 1G --dtype bfloat16
expect 0 'closed form: .*predicted / closed form = 1\.000' -- "$tool" --algo two-shot --cluster dgx-h200 --bytes 64M
expect 0 '  1\. n0\.nvl[0-9]_(UP|DOWN) ' -- "$tool" --algo ring --cluster dgx-h100 --bytes 1M
expect 0 '  1\. n[01]\.(nic|pcie)[0-9]_(UP|DOWN) ' -- "$tool" --algo ring --cluster dgx-h100 --nodes 2 --bytes 16M
expect 0 '^mode: fast' -- "$tool" --algo hierarchical --cluster dgx-h100 --nodes 2 --bytes 16M --fast
expect 0 'rounded down' -- "$tool" --cluster dgx-h100 --bytes 1048573
expect 0 '^ +8 +2 +float32 ' -- "$tool" --algo ring --cluster h200x2 --sweep 8:64K:4
expect 0 '--sweep' -- "$tool" --help
expect 0 '--fast' -- "$tool" --help
expect 0 '--inter' -- "$tool" --help
expect 0 '^inter-node: rhd$' -- "$tool" --algo hierarchical --cluster dgx-h100 --nodes 4 --bytes 16M --inter rhd
expect 0 '^inter-node: (ring|rhd) \(auto: the lower closed form\)$' -- "$tool" --algo hierarchical --cluster dgx-h100 --nodes 4 --bytes 16M
expect 0 'closed form: .*predicted / closed form = 1\.000' -- "$tool" --algo hierarchical --cluster dgx-h100 --nodes 8 --bytes 64M --inter rhd --chunks 4
expect 0 'closed form: .*predicted / closed form = 1\.000' -- "$tool" --algo hierarchical --cluster dgx-h100 --nodes 10 --bytes 64M --inter bruck-half
bad 'bruck-half' -- "$tool" --algo hierarchical --cluster dgx-h100 --nodes 4 --bytes 16M --inter bruck-third

# ---- what bounds it, in words (mk/cost/bottleneck.hpp), and why a reference line is absent or equal ----
expect 0 '^bound: network-bound: n[01]\.nic[0-7]_(UP|DOWN) is [0-9]+\.[0-9] % busy; PCIe [0-9]+\.[0-9] %' -- "$tool" --algo ring --cluster dgx-h100 --nodes 2 --bytes 256M
expect 0 '^bound: NVLink-bound: n0\.nvl[0-7]_(UP|DOWN) is [0-9]+\.[0-9] % busy$' -- "$tool" --algo ring --cluster dgx-h100 --bytes 256M
expect 0 '^bound: latency-bound: no link is half busy; the busiest, n0\.nvl0-1_(UP|DOWN), is [0-9]\.[0-9] %' -- "$tool" --algo one-shot --cluster h200x2 --bytes 64K
expect 0 '^note: predicted, closed form and uncontended agree: no link is shared' -- "$tool" --algo one-shot --cluster h200x2 --bytes 64K
expect 0 '^size: 256 MiB \(268435456 B\) = 67108864 element' -- "$tool" --algo ring --cluster h200x2 --bytes 256M
expect 0 '^bound at 64 KiB \(65536 B\): latency-bound' -- "$tool" --algo one-shot --cluster h200x2 -b 1K -e 64K -f 8
# one decimal convention in the sweep table: the closed form with two decimals, as the simulated time
expect 0 '^ +65536 +16384 +float32 +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]{2}( |$)' -- "$tool" --algo one-shot --cluster h200x2 --sweep 1K:64K:8
# nccl-tests' -b/-e/-f are --sweep; one size and a range together are refused
expect 0 '^ +8 +2 +float32 ' -- "$tool" --algo ring --cluster h200x2 -b 8 -e 64K -f 4
bad '--bytes gives one size and --sweep' -- "$tool" --bytes 1M --sweep 8:1G:2
bad 'bad -b/-e/-f' -- "$tool" -b 1G -e 1K

# ---- --algo auto: the engine's choice (mk/algorithms/policy.hpp), printed, predicting what it chose ----
expect 0 '^auto: (one-shot|two-shot|ring|hierarchical) \(the lowest closed form\), chunks [0-9]+ by size, channels 1 by size$' -- "$tool" --algo auto --cluster h200x2 --bytes 64MiB
expect 0 '^mk-sim: allreduce (one-shot|two-shot) on .*, chunks 3, channels 1 by size$' -- "$tool" --algo auto --cluster h200x2 --bytes 64MiB --chunks 3
expect 0 'chunks 3 as given, channels 1 by size$' -- "$tool" --algo auto --cluster h200x2 --bytes 64MiB --chunks 3
expect 0 '^auto: direct ' -- "$tool" --op alltoall --algo auto --cluster dgx-h100 --bytes 1M
# chunks and channels left out follow the engine's rule for every algorithm (defaultGenOptions), per size
expect 0 '^mk-sim: allreduce ring on .*, chunks 8 by size, channels 1 by size$' -- "$tool" --algo ring --cluster h200x2 --bytes 256MiB
expect 0 '^mk-sim: allreduce ring on .*, chunks 1 by size, channels 1 by size$' -- "$tool" --algo ring --cluster h200x2 --bytes 64K
expect 0 '^ +268435456 .* ring +8 +1$' -- "$tool" --algo ring --cluster h200x2 --sweep 256:256M:16
expect 0 '^ +268435456 .* ring +2 +1$' -- "$tool" --algo ring --cluster h200x2 --sweep 256:256M:16 --chunks 2
expect 0 '^ +size\(B\) .*closed\(us\) +algo +chunks +channels$' -- "$tool" --algo auto --cluster h200x2 --sweep 8:1G:64
calibrated="$(dirname "${BASH_SOURCE[0]}")/../../validation/data/profiles/h200x2-calibrated.json"
# auto predicts exactly what the concrete algorithm it names predicts with the chunks and channels it names
for args in "--cluster h200x2 --bytes 64MiB" "--cluster h200x2 --bytes 8 --profile $calibrated" \
  "--cluster h200x2 --bytes 64MiB --profile $calibrated" "--cluster dgx-h100 --nodes 4 --bytes 256MiB" \
  "--op reducescatter --cluster dgx-h100 --nodes 2 --bytes 4M"; do
  # shellcheck disable=SC2086
  auto_out=$("$tool" --algo auto $args 2>&1)
  chosen=$(sed -nE 's/^auto: ([a-z-]+) \(the lowest closed form\), chunks ([0-9]+) by size, channels ([0-9]+) by size$/\1 \2 \3/p' <<<"$auto_out")
  read -r algo chunks channels <<<"$chosen"
  # shellcheck disable=SC2086
  concrete_out=$("$tool" --algo "${algo:-none}" --chunks "${chunks:-1}" --channels "${channels:-1}" $args 2>&1)
  check "auto ($args) chose '$chosen' and predicts what it predicts" \
    test -n "$chosen" -a "$(grep '^predicted:' <<<"$auto_out")" == "$(grep '^predicted:' <<<"$concrete_out")"
done
"$tool" --algo auto --cluster h200x2 --bytes 64MiB --json "$work/auto.json" >/dev/null 2>&1
check "auto's JSON names what it chose" grep -Eq '"algo": "auto:(one-shot|two-shot|ring|hierarchical)"' "$work/auto.json"
"$tool" --algo auto --cluster h200x2 --sweep 8:1G:64 --json "$work/auto-sweep.json" >/dev/null 2>&1
check "auto's sweep JSON names the choice of every size" test "$(grep -c '"algo": "' "$work/auto-sweep.json")" -eq 6

# ---- files ----
expect 0 'wrote .*p\.json' -- "$tool" --algo hierarchical --cluster dgx-h100 --nodes 2 --bytes 4M --json "$work/p.json" --trace "$work/t.json"
check "prediction json has the schema" grep -q '"schema": "mkernel.prediction.v1"' "$work/p.json"
check "prediction json has time_us" grep -q '"time_us": ' "$work/p.json"
check "prediction json has busiest_links" grep -q '"busiest_links"' "$work/p.json"
check "trace has complete events" grep -q '"ph":"X"' "$work/t.json"
check "trace names ranks" grep -q '"process_name"' "$work/t.json"
# two outputs on one path: refused before any simulation, naming both options, the target left as it was
echo old >"$work/w.json"
expect 2 "^mk-sim: error: invalid-argument: --json $work/w.json and --trace $work/w.json: both name the same path" -- \
  "$tool" --algo ring --cluster h200x2 --bytes 4K --json "$work/w.json" --trace "$work/w.json"
check "a refused --json/--trace pair left its target alone" test "$(cat "$work/w.json")" = old
expect 0 'wrote' -- "$tool" --algo ring --cluster h200x2 --sweep 1K:1M:32 --json "$work/sweep.json"
check "sweep json has results" grep -q '"results"' "$work/sweep.json"
check "no temporary files left" bash -c "! compgen -G '$work/*.tmp*' >/dev/null"

# ---- determinism: the same run twice gives the same JSON (apart from wall time and memory) ----
"$tool" --algo hierarchical --cluster dgx-h100 --nodes 2 --bytes 3M --json "$work/d1.json" >/dev/null 2>&1
"$tool" --algo hierarchical --cluster dgx-h100 --nodes 2 --bytes 3M --json "$work/d2.json" >/dev/null 2>&1
check "two runs give identical predictions" diff <(grep -Ev '"(wall_s|peak_rss_mib)"' "$work/d1.json") \
  <(grep -Ev '"(wall_s|peak_rss_mib)"' "$work/d2.json")

# ---- profiles ----
cat >"$work/profile.json" <<'EOF'
{ "schema": "mkernel.profile.v1", "source": "contract test profile",
  "nvlink": {"alphaUs": 1, "bwGBs": 300}, "network": {"alphaUs": 3, "bwGBs": 40},
  "local": {"alphaUs": 0.5, "bwGBs": 1500}, "reduceGBs": 1000, "flagUs": 0.7, "dispatchUs": 2,
  "proxyUs": 2.5, "gemmTflops": 700 }
EOF
expect 0 "^profile: .*profile\.json \(contract test profile\)" -- "$tool" --cluster dgx-h100 --profile "$work/profile.json"
sed 's/"flagUs": 0.7/"flagUs": -0.7/' "$work/profile.json" >"$work/negative.json"
sed 's/"reduceGBs": 1000, //' "$work/profile.json" >"$work/missing.json"
# transports: a bad efficiency curve or zero messages in flight
sed 's/"proxyUs": 2.5,/"proxyUs": 2.5, "transport": {"kind": "tcp", "overheadUs": 0, "latencyUs": 0, "inFlight": 8, "efficiency": [{"bytes": 64, "fraction": 0.9}, {"bytes": 4096, "fraction": 0.5}]},/' \
  "$work/profile.json" >"$work/falling.json"
sed 's/"proxyUs": 2.5,/"proxyUs": 2.5, "transport": {"kind": "tcp", "overheadUs": 0, "latencyUs": 0, "inFlight": 0, "efficiency": []},/' \
  "$work/profile.json" >"$work/inflight.json"
sed 's/"proxyUs": 2.5,/"proxyUs": 2.5, "transport": {"kind": "tcp", "overheadUs": 0, "latencyUs": 0, "inFlight": 8, "efficiency": [{"bytes": 64, "fraction": 1.5}]},/' \
  "$work/profile.json" >"$work/fraction.json"
# NIC lists: a NIC naming a GPU that does not exist, a GPU without NIC on several nodes
nic_topology() {
  cat <<JSON
{"schema": "mkernel.topology.v1", "name": "nic-test", "nodes": 2,
 "node": {"gpu": "NVIDIA H100", "gpus": 2, "sms": 132, "bf16Tflops": 989, "hbmGBs": 3350,
   "nvlink": {"bwGBs": 450, "latencyUs": 0.65, "switched": true}, "pcie": {"bwGBs": 64, "latencyUs": 1.0},
   "nics": [$1]},
 "fabric": {"kind": "rail-leaf-spine", "nodesPerLeaf": 32, "oversubscription": 1, "switchLatencyUs": 0.5}}
JSON
}
nic_topology '{"bwGBs": 50, "latencyUs": 2.5, "gpus": [0, 1]}' >"$work/nics-ok.json"
nic_topology '{"bwGBs": 50, "latencyUs": 2.5, "gpus": [0, 2]}' >"$work/nics-ghost.json"
nic_topology '{"bwGBs": 50, "latencyUs": 2.5, "gpus": [0]}' >"$work/nics-orphan.json"
nic_topology '{"bwGBs": 50, "latencyUs": 2.5, "gpus": [0, 1], "transport": "carrier-pigeon"}' >"$work/nics-kind.json"
expect 0 "^predicted: " -- "$tool" --cluster "$work/nics-ok.json" --algo hierarchical --bytes 1M

# ---- schedules ----
if [[ -n $schedtool ]]; then
  "$schedtool" --op allreduce --algo ring --cluster dgx-h100 --ranks 8 --bytes 64K --json "$work/s8.json" >/dev/null
  expect 0 'predicted:' -- "$tool" --schedule "$work/s8.json"
  expect 0 '^closed form: none \(a loaded --schedule has no generator parameters to price\)$' -- "$tool" --schedule "$work/s8.json"
  bad "places more than 2 ranks on node 0" -- "$tool" --schedule "$work/s8.json" --cluster h200x2
fi
# runtime extents: priced at their expected values, or at a routing given with --extents
cat >"$work/ext.json" <<'JSON'
{"schema": "mkernel.schedule.v1", "nRanks": 2, "nodeOf": [0, 0], "nFlags": 1,
 "buffers": [{"name": "x", "dtype": "float32", "kind": "input", "count": 4194304},
             {"name": "recv", "dtype": "float32", "kind": "scratch", "count": 4194304}],
 "extents": [{"name": "rows", "bound": 4, "expected": 1}],
 "ranks": [{"lanes": [{"role": "intra", "steps": [{"kind": "put", "count": 4194304, "extent": "rows",
                        "dst": [1, "recv", 0], "a": [0, "x", 0], "signal": true, "flag": [1, 0], "value": 1}]}]},
           {"lanes": [{"role": "intra", "steps": [{"kind": "wait", "flag": [1, 0], "value": 1}]}]}]}
JSON
echo '{"schema": "mkernel.extents.v1", "values": {"rows": [4, 0]}}' >"$work/full.json"
echo '{"schema": "mkernel.extents.v1", "values": {"rows": [5, 0]}}' >"$work/over.json"
expect 0 '^extents: 1, priced at their expected values' -- "$tool" --schedule "$work/ext.json" --cluster h200x2
expect 0 '^extents: 1, priced at .*full\.json$' -- "$tool" --schedule "$work/ext.json" --cluster h200x2 --extents "$work/full.json"
us_of() { "$tool" "$@" | sed -n 's/^predicted: \([0-9.]*\) us.*/\1/p'; }
quarter=$(us_of --schedule "$work/ext.json" --cluster h200x2)
full=$(us_of --schedule "$work/ext.json" --cluster h200x2 --extents "$work/full.json")
check "the full routing moves 4x the expected bytes: slower" awk -v a="$quarter" -v b="$full" 'BEGIN { exit !(a > 0 && b > 3 * a) }'
bad "over\.json: values\.rows\[0\]" -- "$tool" --schedule "$work/ext.json" --cluster h200x2 --extents "$work/over.json"
bad "--extents gives the runtime extents of a loaded --schedule" -- "$tool" --cluster h200x2 --extents "$work/full.json"
echo '{"schema": "mkernel.schedule.v1", "ranks": [' >"$work/broken.json"
bad "broken\.json" -- "$tool" --schedule "$work/broken.json"

# ---- fused operators: the plan, the prediction, what bounds it, and the unfused baseline ----
fused=(--cluster h200x2 --m 4096 --n 4096 --k 2048)
expect 0 '^predicted: [0-9.]+ (us|ms)  [0-9.]+ TFLOP/s per GPU$' -- "$tool" --op gemm-rs "${fused[@]}"
expect 0 '^split: 128 CTAs \(132 SMs less the engine.s 4\): compute [0-9]+, communication [0-9]+ \(the lowest closed form\); [0-9] compute lanes? \(the lowest closed form\)$' -- "$tool" --op gemm-ar "${fused[@]}"
expect 0 '^busy: tensor .*: bound (tensor|nvlink|network|memory)$' -- "$tool" --op ag-gemm "${fused[@]}"
expect 0 '^unfused: GEMM alone .* \+ allreduce .*speedup [0-9.]+x' -- "$tool" --op gemm-ar "${fused[@]}"
# two GPUs: nothing contends, so the replay is the closed form
expect 0 'closed form: .*predicted / closed form = 1\.000' -- "$tool" --op gemm-ar "${fused[@]}" --order interleaved --comm-ctas 16
expect 0 '^profile: sms, ctaGBs from the datasheet' -- "$tool" --op gemm-rs "${fused[@]}" --profile "$work/profile.json"
expect 0 '  1\. n[01]\.(nic|pcie)[0-9]_(UP|DOWN) ' -- "$tool" --op gemm-rs --cluster dgx-h100 --nodes 2 --m 4096 --n 1024 --k 1024
expect 0 'wrote' -- "$tool" --op gemm-rs "${fused[@]}" --json "$work/fused.json" --trace "$work/fused-trace.json"
check "fused json has the split and the baseline" grep -q '"speedup_vs_unfused"' "$work/fused.json"
check "fused json has the compute lanes" grep -q '"compute_lanes": 1' "$work/fused.json"
check "fused trace has gemm steps" grep -q '"name":"gemm"' "$work/fused-trace.json"
bad "--sweep sizes a collective" -- "$tool" --op gemm-rs "${fused[@]}" --sweep 8:1K:2
bad "gemm-rs: K = 1001 is not a multiple of 8" -- "$tool" --op gemm-rs --cluster h200x2 --m 64 --n 64 --k 1001
bad "leaves the compute lane without CTAs" -- "$tool" --op gemm-ar "${fused[@]}" --ctas 8 --comm-ctas 8
bad "dtype float32 is not supported" -- "$tool" --op ag-gemm "${fused[@]}" --dtype float32
bad "--m applies to the fused ops" -- "$tool" --op allreduce --m 64

# ---- moe-dispatch-gemm and ring-attention: generated, replayed, what bounds them ----
moe_op=(--op moe-dispatch-gemm --tokens 64 --hidden 64)
moe=("${moe_op[@]}" --cluster h200x2 --experts 2 --topk 2 --out-cols 64)
# one run, several lines checked (each mk-sim run costs CI time under ASan)
"$tool" "${moe[@]}" --json "$work/moe.json" >"$work/moe.txt" 2>&1
check "moe: predicted with the expert GEMMs' TFLOP/s" grep -Eq '^predicted: [0-9.]+ us  [0-9.]+ TFLOP/s per GPU$' "$work/moe.txt"
check "moe: the expected routing" grep -Eq '^routing: expected: 32 tokens per \(rank, expert\) = uniform 32 x imbalance 1 ' "$work/moe.txt"
check "moe: one node, nothing across nodes" grep -Eq '^bytes: across nodes 0 B, inside nodes \(NVLink\) [0-9.]+ [KM]iB' "$work/moe.txt"
check "moe json names the op" grep -q '"op": "moe-dispatch-gemm"' "$work/moe.json"
expect 0 '^routing: expected: 48 tokens .* x imbalance 1\.5 \(--extents' -- "$tool" "${moe[@]}" --imbalance 1.5
# across nodes (2 nodes x 2 GPUs): tokens cross the network, once per destination node
expect 0 '^bytes: across nodes [0-9.]+ KiB, ' -- "$tool" "${moe_op[@]}" --cluster "$work/nics-ok.json" --experts 1 --topk 2 --out-cols 64
# a given routing (every token to every block it may fill: the capacity) moves twice the expected rows: slower
routing='"to0": 64, "to1": 64, "to2": 64, "to3": 64, "from0.0": 64, "from0.1": 64, "from1.0": 64, "from1.1": 64'
echo "{\"schema\": \"mkernel.extents.v1\", \"values\": {$routing}}" >"$work/routing.json"
echo "{\"schema\": \"mkernel.extents.v1\", \"values\": {${routing/\"to0\": 64/\"to0\": 65}}}" >"$work/routing-over.json"
"$tool" "${moe[@]}" --extents "$work/routing.json" >"$work/moe-given.txt" 2>&1
check "moe: the given routing is named" grep -Eq '^routing: given: .*routing\.json$' "$work/moe-given.txt"
expected_us=$(sed -n 's/^predicted: \([0-9.]*\) us.*/\1/p' "$work/moe.txt")
given_us=$(sed -n 's/^predicted: \([0-9.]*\) us.*/\1/p' "$work/moe-given.txt")
check "moe: the full routing ($given_us us) is slower than the expected one ($expected_us us)" \
  awk -v a="$expected_us" -v b="$given_us" 'BEGIN { exit !(a > 0 && b > a) }'
bad "routing-over\.json: values\.to0" -- "$tool" "${moe[@]}" --extents "$work/routing-over.json"
bad "--experts applies to moe-dispatch-gemm and moe-ffn, not to allreduce" -- "$tool" --op allreduce --experts 2
bad "--topk is required for moe-dispatch-gemm" -- "$tool" "${moe_op[@]}" --experts 2 --out-cols 64
bad "--tokens applies to moe-dispatch-gemm and moe-ffn, not to ring-attention" -- "$tool" --op ring-attention --tokens 64
bad "moe-dispatch-gemm: outCols 12 is not a multiple of 8" -- "$tool" "${moe_op[@]}" --cluster h200x2 --experts 2 --topk 2 --out-cols 12
bad "moe-dispatch-gemm: topk 5 is larger than the experts in total, 4" -- "$tool" "${moe_op[@]}" --cluster h200x2 --experts 2 --topk 5 --out-cols 64
bad "moe-dispatch-gemm: imbalance 0\.5.* must be a finite factor >= 1" -- "$tool" "${moe[@]}" --imbalance 0.5
bad "capacity must be >= 1" -- "$tool" "${moe[@]}" --capacity 0
bad "--bytes does not apply to moe-dispatch-gemm" -- "$tool" "${moe[@]}" --bytes 1K
bad "--dtype does not apply to moe-dispatch-gemm" -- "$tool" "${moe[@]}" --dtype float16
bad "--schedule replays a saved schedule" -- "$tool" "${moe[@]}" --schedule "$work/ext.json"
attn=(--op ring-attention --cluster h200x2 --seq 4096 --heads 8 --head-dim 128)
# heavy attention blocks against one K/V block on NVLink: the compute lane bounds it, not a link
expect 0 '^bound: compute-bound: rank [01] lane [0-9]+ \(compute\) is [0-9.]+ % busy; NVLink ' -- "$tool" "${attn[@]}" --kv-heads 1 --causal
expect 0 '^split: compute lane 131 CTAs, send lane 1 \(132 SMs' -- "$tool" "${attn[@]}" --kv-heads 2 --batch 2
expect 0 '^problem: B 1 x S 4096 tokens \(2048 per rank\), 8 query / 8 key-value heads of 128, float16, no mask' -- "$tool" "${attn[@]}" --dtype float16
bad "--seq is required for ring-attention" -- "$tool" --op ring-attention --heads 8 --head-dim 128
# the backward: K/V travel with their dK/dV accumulators; its option belongs to ring-attention only
expect 0 '^pass: backward: K/V travel with float32 dK/dV accumulators' -- "$tool" "${attn[@]}" --kv-heads 2 --causal --backward
bad "--backward applies to ring-attention, not to allreduce" -- "$tool" --op allreduce --backward
# ---- moe-ffn: the dispatch, the SwiGLU expert FFN and the combine, replayed ----
ffn=(--op moe-ffn --cluster h200x2 --experts 2 --topk 2 --tokens 64 --hidden 64 --ffn 32)
"$tool" "${ffn[@]}" --json "$work/ffn.json" >"$work/ffn.txt" 2>&1
check "moe-ffn: predicted with the expert GEMMs' TFLOP/s" grep -Eq '^predicted: [0-9.]+ us  [0-9.]+ TFLOP/s per GPU$' "$work/ffn.txt"
check "moe-ffn: the problem names the FFN" grep -Eq '^problem: .*hidden 64 -> 2 x 32 \(SwiGLU\) -> 64 per expert, combined back' "$work/ffn.txt"
check "moe-ffn json names the op" grep -q '"op": "moe-ffn"' "$work/ffn.json"
ffn_us=$(sed -n 's/^predicted: \([0-9.]*\) us.*/\1/p' "$work/ffn.txt")
check "moe-ffn ($ffn_us us) takes longer than its dispatch alone ($expected_us us)" \
  awk -v a="$ffn_us" -v b="$expected_us" 'BEGIN { exit !(a > b) }'
expect 0 '^bytes: across nodes [0-9.]+ KiB, ' -- "$tool" --op moe-ffn --cluster "$work/nics-ok.json" --experts 1 --topk 2 --tokens 64 --hidden 64 --ffn 32
# across nodes the return: auto keeps the shorter replay and names both, a named one is kept
ffn2=(--op moe-ffn --cluster dgx-h100 --nodes 2 --experts 1 --topk 2 --tokens 64 --hidden 64 --ffn 32)
expect 0 '^combine: (per-block|node-sum) \(--combine auto: the shorter replay, [0-9.]+ [mu]?s against (per-block|node-sum) [0-9.]+ [mu]?s\)$' -- "$tool" "${ffn2[@]}"
expect 0 '^combine: node-sum \(--combine\)$' -- "$tool" "${ffn2[@]}" --combine node-sum
expect 0 '^combine: every block to its source \(one node' -- "$tool" "${ffn[@]}" --combine per-block
bad "unknown --combine 'sum' \\(expected auto, per-block, node-sum\\)" -- "$tool" "${ffn2[@]}" --combine sum
bad "moe-ffn: ffn 12 is not a multiple of 8" -- "$tool" --op moe-ffn --cluster h200x2 --experts 2 --topk 2 --tokens 64 --hidden 64 --ffn 12
bad "moe-ffn: capacity 65 is larger than tokens 64" -- "$tool" "${ffn[@]}" --capacity 65
bad "--ffn is required for moe-ffn" -- "$tool" --op moe-ffn --cluster h200x2 --experts 2 --topk 2 --tokens 64 --hidden 64
bad "--out-cols applies to moe-dispatch-gemm, not to moe-ffn" -- "$tool" "${ffn[@]}" --out-cols 64
bad "--ffn applies to moe-ffn, not to moe-dispatch-gemm" -- "$tool" "${moe[@]}" --ffn 32
bad "--sweep sizes a collective by --bytes; moe-ffn has one shape" -- "$tool" "${ffn[@]}" --sweep 8:1K:2
bad "--head-dim applies to ring-attention, not to moe-dispatch-gemm" -- "$tool" "${moe[@]}" --head-dim 64
bad "--causal applies to ring-attention, not to gemm-rs" -- "$tool" --op gemm-rs --causal
bad "--batch must be >= 1" -- "$tool" "${attn[@]}" --batch 0
bad "ring-attention: qHeads 8 is not a multiple of kvHeads 3" -- "$tool" "${attn[@]}" --kv-heads 3
bad "ring-attention: seq 4094 is not a multiple of 2 x ranks = 4" -- "$tool" "${attn[@]/4096/4094}" --causal
bad "--extents gives runtime extents: ring-attention has none" -- "$tool" "${attn[@]}" --extents "$work/routing.json"
bad "--hidden applies to moe-dispatch-gemm and moe-ffn, not to ag-gemm" -- "$tool" --op ag-gemm --hidden 64

# ---- bad input: exit 2, one line, no file ----
bad "unknown cluster 'dgx-a1'" -- "$tool" --cluster dgx-a1
bad "unknown --op 'allsum'" -- "$tool" --op allsum
bad "--inter: tree not in" -- "$tool" --algo hierarchical --cluster dgx-h100 --nodes 2 --inter tree
bad "unknown algorithm 'star'" -- "$tool" --algo star
bad "unknown --dtype 'int7'" -- "$tool" --dtype int7
bad "nodes must be >= 1" -- "$tool" --nodes 0
bad "ranks must be >= 1" -- "$tool" --ranks 0
bad "does not fit the cluster" -- "$tool" --cluster dgx-h100 --nodes 1 --ranks 9
bad "nics" -- "$tool" --cluster h200x2 --nodes 2
bad "negative" -- "$tool" --bytes -5
bad "bad size 'lots'" -- "$tool" --bytes lots
bad "less than one float32 element" -- "$tool" --bytes 2
bad "chunks" -- "$tool" --chunks 0
bad "bad --sweep '8:1G'" -- "$tool" --sweep 8:1G
bad "FACTOR" -- "$tool" --sweep 8:1G:1
bad "--trace needs one size" -- "$tool" --sweep 8:1K:2
bad "flagUs must be a finite number in \[0, 1000000\] \(got number -0\.7\)" -- "$tool" --profile "$work/negative.json"
bad "missing field reduceGBs" -- "$tool" --profile "$work/missing.json"
bad "transport.efficiency\[1\].fraction must not fall below the point before" -- "$tool" --profile "$work/falling.json"
bad "transport.inFlight must be >= 1" -- "$tool" --profile "$work/inflight.json"
bad "transport.efficiency\[0\].fraction must be in \(0, 1\]" -- "$tool" --profile "$work/fraction.json"
bad "node.nics\[0\].gpus names GPU 2" -- "$tool" --cluster "$work/nics-ghost.json"
bad "node.nics: GPU 1 has no NIC" -- "$tool" --cluster "$work/nics-orphan.json"
bad "node.nics\[0\].transport must be one of" -- "$tool" --cluster "$work/nics-kind.json"
bad "no-such-profile\.json" -- "$tool" --profile "$work/no-such-profile.json"
expect 2 "directory .*no-such-dir' does not exist" -- "$tool" --json "$work/no-such-dir/p.json"
expect 2 "is a directory" -- "$tool" --trace "$work"
# an output never replaces a non-regular file (a FIFO, a link to one, a directory) nor one of the inputs
mkfifo "$work/fifo" && ln -s "$work/fifo" "$work/fifo-link"
expect 2 "^mk-sim: error: .*--json $work/fifo: is a FIFO" -- "$tool" --bytes 1K --json "$work/fifo"
expect 2 "^mk-sim: error: .*--trace $work/fifo-link: is a FIFO" -- "$tool" --bytes 1K --trace "$work/fifo-link"
check "the FIFO is still a FIFO" test -p "$work/fifo"
one_line_error "$tool" --bytes 1K --json "$work/fifo"
cp "$work/profile.json" "$work/input.json"
expect 2 "^mk-sim: error: .*--json $work/input.json: is also an input" -- \
  "$tool" --cluster h200x2 --bytes 1K --profile "$work/input.json" --json "$work/input.json"
check "the input profile is unchanged" cmp -s "$work/profile.json" "$work/input.json"
bad "--bogus" -- "$tool" --bogus
# a newline in a value is escaped in the one error line; an empty path is an error, not "no output"
bad 'unknown --op .all\\nreduce.' -- "$tool" --op $'all\nreduce'
expect 2 '^mk-sim: error: --trace: must not be empty' -- "$tool" --bytes 1K --trace ''
# Without --algo, the engine's choice ("auto", policy.hpp), not a flat ring; a lower-case b is a bit, refused.
expect 0 '^auto: hierarchical' -- "$tool" --op allreduce --cluster dgx-h100 --nodes 2 --bytes 1M
expect 2 "^mk-sim: error: .*bad size '1Gb': a lower-case b is a bit" -- "$tool" --bytes 1Gb

cli_summary
