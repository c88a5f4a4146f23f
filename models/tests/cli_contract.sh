#!/usr/bin/env bash
# mk-schedule's contract: results, exit codes (0 ok, 1 verify failed, 2 bad input), one clear error line,
# and no output file left behind on failure.  Usage: cli_contract.sh <mk-schedule> <workdir>
set -u
tool=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../cmake/cli_testlib.sh"

expect 0 '^verify: OK' -- "$tool" --op allreduce --algo ring --ranks 8 --bytes 1048573 --dtype float32 --verify
expect 0 '^verify: OK' -- "$tool" --op allreduce --algo hierarchical --cluster dgx-h100 --nodes 4 --bytes 1MiB --verify
expect 0 '^verify: OK' -- "$tool" --op allreduce --algo ring --ranks 5 --bytes 1021 --dtype bfloat16 --inputs integers --verify
expect 0 'rounded down' -- "$tool" --ranks 8 --bytes 1048573
expect 0 'closed form' -- "$tool" --op allgather --algo ring --ranks 4 --bytes 64K
# what bounds it, from the uncontended timeline, and the size in human units next to the raw bytes
expect 0 '^  bound      network-bound: rank [0-9]+ network out is [0-9]+\.[0-9] % busy; NVLink [0-9]+\.[0-9] %' -- "$tool" --cluster dgx-h100 --nodes 2 --bytes 64M
expect 0 '^  bound      latency-bound: no link is half busy' -- "$tool" --op allreduce --algo one-shot --cluster h200x2 --bytes 1K
expect 0 '^  timeline   [0-9.]+ (us|ms) uncontended \(= the closed form' -- "$tool" --cluster dgx-h100 --nodes 2 --bytes 64M
expect 0 '^  size       64 MiB \(67108864 B\) = 16777216 float32' -- "$tool" --cluster dgx-h100 --bytes 64M
# one schedule per run: a range is refused and names mk-sim; -b equal to -e is one size
expect 2 'mk-schedule makes one schedule per run.*mk-sim --sweep' -- "$tool" --sweep 8:64:2
expect 0 '^  size       64 KiB \(65536 B\)' -- "$tool" -b 64K -e 64K -d bfloat16
expect 0 '--op' -- "$tool" --help
# --profile prices the closed form with a profile file (the committed calibrated one) instead of the datasheet
profile="$(dirname "${BASH_SOURCE[0]}")/../../validation/data/profiles/h200x2-calibrated.json"
expect 0 'profile    calibrated on h200x2' -- "$tool" --op allreduce --algo two-shot --cluster h200x2 --bytes 64MiB --chunks 2 --profile "$profile"
expect 0 'profile    uncalibrated' -- "$tool" --op allreduce --algo two-shot --cluster h200x2 --bytes 64MiB --chunks 2

# --algo nccl: NCCL's own choice (docs/algorithms-nccl.md): its p2p for all-to-all, its channels across nodes
expect 0 '^verify: OK' -- "$tool" --op alltoall --algo nccl --cluster dgx-h100 --nodes 2 --bytes 64K --verify
expect 0 'channels 8 by size' -- "$tool" --op allreduce --algo nccl --cluster dgx-h100 --nodes 2 --bytes 64MiB
expect 2 '--protocol ll128 does not apply to nccl-p2p' -- "$tool" --op alltoall --algo nccl-p2p --protocol ll128 --ranks 4 --bytes 1K
one_line_error "$tool" --op alltoall --algo nccl-p2p --protocol ll128 --ranks 4 --bytes 1K

# --algo auto: the engine's choice (mk/algorithms/policy.hpp), printed, and the schedule of what it chose
expect 0 '^  auto       (one-shot|two-shot|ring|hierarchical) \(the lowest closed form\), chunks [0-9]+ by size, channels 1 by size$' -- "$tool" --op allreduce --algo auto --cluster h200x2 --bytes 64MiB --profile "$profile"
expect 0 'chunks 3 as given' -- "$tool" --op allreduce --algo auto --cluster h200x2 --bytes 64MiB --chunks 3
expect 0 '^  options    redop sum, chunks 3, channels 1 by size$' -- "$tool" --op allreduce --algo auto --cluster h200x2 --bytes 64MiB --chunks 3
expect 0 '^  options    redop sum, chunks 8 by size, channels 1 by size$' -- "$tool" --op allgather --algo ring --cluster h200x2 --bytes 256MiB
expect 0 '^  options    redop sum, chunks 1 by size, channels 2$' -- "$tool" --op allgather --algo ring --cluster h200x2 --bytes 64K --channels 2
expect 0 '^verify: OK' -- "$tool" --op reducescatter --algo auto --cluster dgx-h100 --nodes 2 --bytes 1MiB --verify
for size in 8 64MiB; do
  auto_out=$("$tool" --op allreduce --algo auto --cluster h200x2 --bytes $size --profile "$profile" 2>&1)
  chosen=$(sed -nE 's/^  auto       ([a-z-]+) \(the lowest closed form\), chunks ([0-9]+) by size, channels ([0-9]+) by size$/\1 \2 \3/p' <<<"$auto_out")
  read -r algo chunks channels <<<"$chosen"
  concrete_out=$("$tool" --op allreduce --algo "${algo:-none}" --chunks "${chunks:-1}" --channels "${channels:-1}" --cluster h200x2 --bytes $size --profile "$profile" 2>&1)
  check "auto at $size chose '$chosen' and costs what it costs" \
    test -n "$chosen" -a "$(grep '^  cost ' <<<"$auto_out")" == "$(grep '^  cost ' <<<"$concrete_out")"
done

# files: written only on success, readable back, packed form written
expect 0 'wrote' -- "$tool" --op allreduce --algo one-shot --ranks 4 --bytes 4K --json "$work/ar.json" --packed "$work/ar.bin"
check "output files written" test -s "$work/ar.json" -a -s "$work/ar.bin"
expect 0 'validate   OK$' -- "$tool" --schedule "$work/ar.json"
# an output never replaces a non-regular file nor one of the command's own inputs
mkfifo "$work/fifo"
expect 2 "^mk-schedule: error: .*--packed $work/fifo: is a FIFO" -- "$tool" --bytes 4K --packed "$work/fifo"
check "the FIFO is still a FIFO" test -p "$work/fifo"
cp "$work/ar.json" "$work/ar-copy.json"
expect 2 "^mk-schedule: error: .*--json $work/ar.json: is also an input" -- \
  "$tool" --schedule "$work/ar.json" --json "$work/ar.json"
check "the input schedule is unchanged" cmp -s "$work/ar.json" "$work/ar-copy.json"
# two outputs on one path, spelled differently: refused before any work, naming both, the target left alone
echo old >"$work/same.out"
expect 2 "^mk-schedule: error: invalid-argument: --json $work/same.out and --packed $work/\./same.out: both name the same path" -- \
  "$tool" --bytes 4K --json "$work/same.out" --packed "$work/./same.out"
one_line_error "$tool" --bytes 4K --json "$work/same.out" --packed "$work/same.out"
check "a refused --json/--packed pair left its target alone" test "$(cat "$work/same.out")" = old
# an output that is a symbolic link: written through it, the link kept and its target replaced
mkdir -p "$work/store" && echo old >"$work/store/linked.json" && ln -sfn store/linked.json "$work/linked.json"
expect 0 'wrote' -- "$tool" --bytes 4K --json "$work/linked.json"
check "the link is kept" test -L "$work/linked.json"
check "its target is replaced" grep -q '"schema"' "$work/store/linked.json"

# the race check runs up to 200 k steps; above, the output says plainly that it did not, never a bare "OK"
expect 0 'generate   [0-9.]+ ms, validate OK$' -- "$tool" --op allreduce --algo ring --cluster dgx-h100 --bytes 64M
expect 0 'validate OK \(race check skipped: 230408 steps > 200000\)$' -- \
  "$tool" --op allreduce --algo ring --cluster dgx-h100 --chunks 600 --bytes 64M --json "$work/big.json"
expect 0 'validate   OK \(race check skipped: 230408 steps > 200000\)$' -- "$tool" --schedule "$work/big.json"
rm -f "$work/big.json"

# bad input: exit 2, one line, no file
expect 2 "unknown --op 'allsum'" -- "$tool" --op allsum --json "$work/x.json"
expect 2 "unknown algorithm 'star'" -- "$tool" --algo star --json "$work/x.json"
expect 2 "unknown --dtype 'int7'" -- "$tool" --dtype int7 --json "$work/x.json"
expect 2 "--dtype 'int32' is an integer type" -- "$tool" --dtype int32 --json "$work/x.json"
expect 2 "unknown --redop" -- "$tool" --redop prod
expect 2 "unknown cluster 'dgx-a1'" -- "$tool" --cluster dgx-a1 --json "$work/x.json"
expect 2 "ranks must be >= 1" -- "$tool" --ranks 0
expect 2 "ranks" -- "$tool" --ranks -3
expect 2 "negative" -- "$tool" --bytes -5
expect 2 "bad size 'lots'" -- "$tool" --bytes lots
expect 2 "does not fit" -- "$tool" --cluster dgx-h100 --nodes 1 --ranks 9
expect 2 "less than one" -- "$tool" --op allgather --ranks 8 --bytes 8
expect 2 "chunks" -- "$tool" --chunks 0
expect 2 "root" -- "$tool" --op broadcast --algo direct --ranks 4 --root 4
one_line_error "$tool" --op allsum
one_line_error "$tool" --cluster nope
check "a failed run left $work/x.json" test ! -e "$work/x.json"

# fused operators: planned, generated, verified; bad shapes, splits and dtypes refused before anything runs
expect 0 '^verify: OK' -- "$tool" --op gemm-rs --ranks 4 --m 301 --n 264 --k 520 --tile-rows 64 --verify
expect 0 '^verify: OK' -- "$tool" --op ag-gemm --cluster dgx-h100 --nodes 2 --ranks 6 --m 203 --n 136 --k 72 --dtype float16 --layout-b col --verify --inputs integers
expect 0 '^verify: OK' -- "$tool" --op gemm-ar --cluster dgx-h100 --nodes 2 --ranks 4 --m 77 --n 64 --k 96 --order own-last --comm-ctas 6 --verify
expect 0 '^  split      128 CTAs \(132 SMs less the engine.s 4\): compute [0-9]+, communication [0-9]+ \(the lowest closed form\); [0-9] compute lanes? \(the lowest closed form\)$' -- "$tool" --op gemm-rs --cluster h200x2 --m 8192 --n 8192 --k 4096
expect 0 '^  busy       tensor .*: bound (tensor|nvlink|network|memory)$' -- "$tool" --op gemm-ar --cluster h200x2 --m 8192 --n 8192 --k 4096
expect 0 'unfused    GEMM alone .* \+ reducescatter' -- "$tool" --op gemm-rs --cluster h200x2 --m 4096 --n 4096 --k 2048
expect 0 'compute 100, communication 20 \(as given\)' -- "$tool" --op gemm-rs --cluster h200x2 --m 4096 --n 4096 --k 2048 --ctas 120 --comm-ctas 20
expect 0 '; 2 compute lanes \(the lowest closed form\)$' -- "$tool" --op ag-gemm --cluster dgx-h100 --ranks 8 --m 8192 --n 8192 --k 4096
expect 0 '^verify: OK' -- "$tool" --op gemm-rs --ranks 3 --m 95 --n 40 --k 48 --tile-rows 9 --compute-lanes 3 --comm-ctas 4 --verify
expect 2 'leaves a compute lane without CTAs: 2 compute CTAs for 3 compute lanes' -- "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 64 --ctas 8 --comm-ctas 6 --compute-lanes 3
expect 0 'wrote' -- "$tool" --op gemm-ar --ranks 2 --m 64 --n 64 --k 64 --json "$work/gemm-ar.json"
expect 0 'validate   OK' -- "$tool" --schedule "$work/gemm-ar.json"
expect 2 'gemm-rs: K = 1001 is not a multiple of 8' -- "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 1001 --json "$work/x.json"
expect 2 'gemm-ar: N = 100 is not a multiple of 8' -- "$tool" --op gemm-ar --ranks 2 --m 64 --n 100 --k 64 --json "$work/x.json"
expect 2 'K = 24 is split over the ranks in units of 8 .* at least 8 x ranks = 32' -- "$tool" --op gemm-rs --ranks 4 --m 64 --n 64 --k 24
# moe-dispatch-gemm, moe-ffn and ring-attention: generated, verified on the CPU executor, their options refused elsewhere
expect 0 '^verify: OK' -- "$tool" --op moe-dispatch-gemm --ranks 3 --experts 2 --topk 3 --tokens 12 --hidden 16 --out-cols 8 --verify
ffn=(--op moe-ffn --experts 2 --topk 3 --tokens 11 --hidden 16 --ffn 8)
expect 0 '^verify: OK' -- "$tool" "${ffn[@]}" --ranks 3 --verify
ffn2=(--op moe-ffn --cluster dgx-h100 --nodes 2 --experts 1 --topk 2 --tokens 7 --hidden 16 --ffn 8)
expect 0 '^verify: OK' -- "$tool" "${ffn2[@]}" --combine per-block --verify
expect 0 '^verify: OK' -- "$tool" "${ffn2[@]}" --combine node-sum --verify
expect 0 'moe-ffn node-dedup on' -- "$tool" "${ffn2[@]}" --combine per-block
expect 0 'moe-ffn node-dedup-combine on' -- "$tool" "${ffn2[@]}" --combine node-sum
expect 2 '--combine auto across nodes is chosen by the SimGrid replay, which mk-schedule does not run' -- "$tool" "${ffn2[@]}"
expect 2 "unknown --combine 'sum' \\(expected auto, per-block, node-sum\\)" -- "$tool" "${ffn2[@]}" --combine sum
expect 2 '--combine applies to moe-ffn, not to moe-dispatch-gemm' -- "$tool" --op moe-dispatch-gemm --ranks 3 --experts 2 --topk 3 --tokens 12 --hidden 16 --out-cols 8 --combine node-sum
expect 0 'moe-ffn direct on' -- "$tool" "${ffn[@]}" --ranks 2 --combine node-sum
expect 2 'moe-ffn: ffn 12 is not a multiple of 8' -- "$tool" --op moe-ffn --ranks 2 --experts 2 --topk 3 --tokens 11 --hidden 16 --ffn 12
expect 2 'moe-ffn: capacity 12 is larger than tokens 11' -- "$tool" "${ffn[@]}" --ranks 2 --capacity 12
expect 2 'moe-ffn: topk 3 is larger than the experts in total, 2' -- "$tool" "${ffn[@]}" --ranks 1
expect 2 '--ffn is required for moe-ffn' -- "$tool" --op moe-ffn --ranks 2 --experts 2 --topk 3 --tokens 11 --hidden 16
expect 2 '--out-cols applies to moe-dispatch-gemm, not to moe-ffn' -- "$tool" "${ffn[@]}" --ranks 2 --out-cols 8
expect 2 '--ffn applies to moe-ffn, not to moe-dispatch-gemm' -- "$tool" --op moe-dispatch-gemm --ranks 3 --experts 2 --topk 3 --tokens 12 --hidden 16 --out-cols 8 --ffn 8
expect 2 '--bytes does not apply to moe-ffn: it is sized by --experts, --topk, --tokens, --hidden, --ffn' -- "$tool" "${ffn[@]}" --ranks 2 --bytes 1K
expect 0 '^verify: OK' -- "$tool" --op ring-attention --ranks 3 --seq 36 --heads 4 --kv-heads 2 --head-dim 8 --causal --verify
expect 0 '^verify: OK' -- "$tool" --op ring-attention --backward --ranks 3 --seq 36 --heads 4 --kv-heads 2 --head-dim 8 --causal --verify
expect 0 '^  bound      compute-bound: rank [0-9] lane [0-9]+ \(compute\)' -- "$tool" --op ring-attention --cluster h200x2 --seq 4096 --heads 8 --kv-heads 1 --head-dim 128
expect 2 '--seq applies to ring-attention, not to allreduce' -- "$tool" --op allreduce --seq 8
expect 2 '--bytes does not apply to moe-dispatch-gemm' -- "$tool" --op moe-dispatch-gemm --experts 1 --topk 1 --tokens 8 --hidden 8 --out-cols 8 --bytes 1K
expect 2 'ag-gemm: M = 3 cannot give each of the 4 ranks' -- "$tool" --op ag-gemm --ranks 4 --m 3 --n 64 --k 64
expect 2 'dtype float32 is not supported' -- "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 64 --dtype float32 --json "$work/x.json"
expect 2 'leaves the compute lane without CTAs' -- "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 64 --ctas 16 --comm-ctas 16
expect 2 'leaves a communication lane without CTAs: commCtas 1 .* \(send over NVLink, reduce\)' -- "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 64 --comm-ctas 1
expect 2 'ctas 200 exceeds the GPU.s 132 SMs' -- "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 64 --ctas 200
expect 2 '--m is required for gemm-rs' -- "$tool" --op gemm-rs --ranks 2 --n 64 --k 64
expect 2 '--bytes does not apply to gemm-ar' -- "$tool" --op gemm-ar --ranks 2 --m 64 --n 64 --k 64 --bytes 1MiB
expect 2 '--m applies to the fused ops' -- "$tool" --op allreduce --ranks 2 --m 64
expect 2 'comm-ctas must be >= 1' -- "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 64 --comm-ctas 0
expect 2 'order' -- "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 64 --order random
one_line_error "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 1001
one_line_error "$tool" --op gemm-rs --ranks 2 --m 64 --n 64 --k 64 --comm-ctas 1
check "a refused fused op left $work/x.json" test ! -e "$work/x.json"

# malformed schedules: truncated JSON, and one whose wait can never be satisfied
head -c 300 "$work/ar.json" >"$work/truncated.json"
expect 2 "parse-error" -- "$tool" --schedule "$work/truncated.json"
/usr/bin/python3 - "$work/ar.json" "$work/stuck.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for lane in s["ranks"][1]["lanes"]:
    for st in lane["steps"]:
        if st["kind"] == "wait":
            st["value"] = st["value"] + 5
            json.dump(s, open(sys.argv[2], "w"))
            sys.exit(0)
sys.exit("no wait step found")
PY
expect 2 "invalid-schedule: rank 1 lane" -- "$tool" --schedule "$work/stuck.json" --packed "$work/stuck.bin"
check "an invalid schedule still wrote a packed file" test ! -e "$work/stuck.bin"
expect 2 "io-error.*no/such/file.json" -- "$tool" --schedule /no/such/file.json
expect 2 "no/such/profile.json" -- "$tool" --cluster h200x2 --profile /no/such/profile.json

# issue 40's stragglers: a NUL byte after the JSON, options a schedule file makes meaningless, an empty path, a
# spaced size and a newline in a value are each one error line (exit 2), never silently accepted
{ cat "$work/ar.json"; printf '\0garbage'; } >"$work/nul.json"
expect 2 "nul.json: not valid JSON: a NUL byte at byte $(stat -c %s "$work/ar.json")" -- "$tool" --schedule "$work/nul.json"
expect 2 '^mk-schedule: error: --ranks is ignored with --schedule' -- "$tool" --schedule "$work/ar.json" --ranks 8
expect 2 '^mk-schedule: error: -b,--minbytes is ignored with --schedule' -- "$tool" --schedule "$work/ar.json" -b 64K
expect 2 '^mk-schedule: error: --json: must not be empty' -- "$tool" --bytes 4K --json ''
expect 2 "bad size '1 K B': spaces are not allowed" -- "$tool" --bytes '1 K B'
expect 2 'unknown --op .all\\nreduce.' -- "$tool" --op $'all\nreduce'
one_line_error "$tool" --op $'all\nreduce'

cli_summary
