#!/usr/bin/env bash
# The benchmarks' bad-input contract without a GPU: mk-bench-cli (mk-bench's command line) refuses what mk-bench
# refuses, and mk-proxy-bench exits 2 with one line for every bad input (CLI11 once exited 105, a bad size 1).
# Usage: bench_cli_contract.sh <mk-bench-cli> <mk-proxy-bench> <workdir>
set -u
bench=$1
proxy=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../cmake/cli_testlib.sh"

expect 0 'dtype bfloat16, redop max' -- "$bench" allreduce -d bfloat16 -o max -n 1
expect 2 "^mk-bench: error: .*unknown --dtype 'int7'" -- "$bench" allreduce -d int7
expect 2 "^mk-bench: error: .*unknown --redop 'prod'" -- "$bench" allreduce -o prod
expect 2 '^mk-bench: error: .*-n/--iters must be >= 1' -- "$bench" allreduce -n 0
expect 2 "^mk-bench: error: .*unknown algorithm 'rign' for allreduce" -- "$bench" allreduce --algo one-shot,rign
expect 2 "^mk-bench: error: .*--algo 'ring,' has an empty name" -- "$bench" allreduce --algo ring,
expect 0 'algo auto,one-shot' -- "$bench" allreduce --algo auto,one-shot -n 1
expect 2 '^mk-bench: error: --json: must not be empty' -- "$bench" allreduce --json ''
expect 2 "^mk-bench: error: invalid-argument: --json $work/b.json and --trace $work/b.json: both name the same path" -- \
  "$bench" allreduce --json "$work/b.json" --trace "$work/b.json"

# issue 37: the fused operators across nodes (one process per rank) refuse, before any GPU or rendezvous, a shape that
# does not divide over the ranks, --ranks-per-node that does not divide them, a transport that is not there, and the
# options that need one process per rank given to one process; nothing is written.
key=$(printf '0%.0s' {1..64})
ranks2=(env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 MK_JOB_KEY=$key)
expect 0 'fused gemm-rs, 1 shape\(s\), 1 variant\(s\), 2 rank\(s\), one process per rank' -- \
  "${ranks2[@]}" "$bench" gemm-rs --ranks-per-node 1 --transport socket --share-gpus -m 4096 -n 4096 -k 1024
expect 2 "^mk-bench gemm-rs: error: .*--ranks-per-node 2 does not divide the job's 3 ranks" -- \
  env RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 MK_JOB_KEY=$key "$bench" gemm-rs --ranks-per-node 2
expect 2 "^mk-bench gemm-rs: error: .*-m 4097 .* does not divide over the job's 2 ranks: .*reduce-scatter" -- \
  "${ranks2[@]}" "$bench" gemm-rs --ranks-per-node 1 -m 4097 -n 4096 -k 1024 --json "$work/f.json"
expect 2 "^mk-bench ag-gemm: error: .*-m 4097 .* does not divide over the job's 2 ranks: .*all-gather" -- \
  "${ranks2[@]}" "$bench" ag-gemm --ranks-per-node 1 -m 4097 -n 4096 -k 1024
expect 0 'fused gemm-ar' -- "${ranks2[@]}" "$bench" gemm-ar --ranks-per-node 1 -m 4097 -n 4096 -k 1024
expect 2 "^mk-bench ag-gemm: error: .*shape m x n x k = 64 x 24 x 16 on 4 ranks: .*N must be at least 8 x ranks" -- \
  env RANK=0 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 MK_JOB_KEY=$key "$bench" ag-gemm -m 64 -n 24 -k 16
expect 2 '^mk-bench gemm-ar: error: .*--transport ibverbs: (no RDMA device found|this build has no ibverbs)' -- \
  "${ranks2[@]}" "$bench" gemm-ar --ranks-per-node 1 --transport ibverbs --json "$work/f.json"
expect 2 '^mk-bench gemm-rs: error: .*--ranks: this process was started as one rank' -- \
  "${ranks2[@]}" "$bench" gemm-rs --ranks 2
expect 2 '^mk-bench gemm-rs: error: .*--ranks-per-node 1: nodes are made of processes' -- "$bench" gemm-rs --ranks-per-node 1
expect 2 '^mk-bench gemm-rs: error: .*--transport socket: one process is one node' -- "$bench" gemm-rs --transport socket
expect 2 '^mk-bench gemm-rs: error: .*shape m x n x k = 4096 x 4095 x 1024 on 2 ranks' -- \
  "$bench" gemm-rs --ranks 2 -m 4096 -n 4095 -k 1024
one_line_error "${ranks2[@]}" "$bench" gemm-rs --ranks-per-node 1 -m 4097 -n 4096 -k 1024
check "a refused fused run wrote $work/f.json" test ! -e "$work/f.json"

expect 2 '^mk-proxy-bench: error: --batch: Value 0 not in range' -- "$proxy" --batch 0 --json "$work/p.json"
expect 2 "^mk-proxy-bench: error: .*--min-bytes: bad size '-1': negative" -- "$proxy" --min-bytes -1 --json "$work/p.json"
expect 2 '^mk-proxy-bench: error: .*--json .*no/such/dir' -- "$proxy" --json "$work/no/such/dir/p.json"
expect 2 '^mk-proxy-bench: error: --json: must not be empty' -- "$proxy" --json ''
one_line_error "$proxy" --max-bytes '1 K'
# issue 40: a size whose loop wrapped (and whose buffers no machine holds) is refused before any socket or buffer,
# naming the estimate and the limit
expect 2 '^mk-proxy-bench: error: .*needs ~.*put buffers .* above --max-memory 4 GiB' -- \
  "$proxy" --put --max-bytes 16777215T --max-memory 4G --json "$work/p.json"
expect 2 'above --max-memory 1 GiB' -- "$proxy" --put --max-bytes 1G --max-memory 1G
check "a refused run wrote nothing" test ! -e "$work/p.json"
check "a refused run wrote $work/p.json" test ! -e "$work/p.json"

cli_summary
