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
