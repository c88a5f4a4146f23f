#!/usr/bin/env bash
# mk-sim's resource guards and output contract: requests far above --max-memory refused fast (exit 2), a sweep up
# to 2^64-1 that terminates, a huge cluster of which only the used nodes are built, outputs all or nothing, and no
# temporary left behind by SIGTERM.  Usage: guards_contract.sh <mk-sim> <workdir>
set -u
tool=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../cmake/cli_testlib.sh"

# the cases of issues 19 and 20: refused in well under a second, in little memory, naming the parts and the option
expect 2 'needs more than ~[0-9.]+ GiB \(schedule >[0-9.]+ GiB, simulation >[0-9.]+ GiB\) above --max-memory' -- \
  guarded "$tool" --algo ring --cluster dgx-h100 --nodes 1024
expect 2 'raise it with --max-memory' -- guarded "$tool" --algo ring --cluster dgx-h100 --nodes 256 --chunks 8 --channels 2
expect 2 'chunks 4294967295 is more than' -- guarded "$tool" --algo ring --cluster h200x2 --bytes 1MiB --chunks 4294967295
expect 2 'needs more than' -- guarded "$tool" --algo ring --cluster dgx-h100 --bytes 1G --channels 4294967295 --max-memory 2G
expect 2 'max-memory' -- "$tool" --max-memory lots
one_line_error "$tool" --algo ring --cluster dgx-h100 --nodes 1024

# issue 40: a 1 KiB schedule declaring 5000000 flags (the replay keeps a counter per rank x flag: 24 GB once) or
# barriers is refused before the replay, naming the estimate and the limit
for field in nFlags nBarriers; do
  cat >"$work/$field.json" <<EOF
{"schema": "mkernel.schedule.v1", "nRanks": 1, "nodeOf": [0], "$field": 5000000,
 "buffers": [{"name": "x", "dtype": "float32", "kind": "inout", "count": 4}],
 "ranks": [{"lanes": [{"role": "compute", "steps": [{"kind": "copy", "count": 4, "dst": [0, "x", 0], "a": [0, "x", 0]}]}]}]}
EOF
  expect 2 'needs ~[0-9.]+ [GM]iB \(.*flags and barriers [0-9.]+ [GM]iB\) above --max-memory 64 MiB' -- \
    guarded "$tool" --schedule "$work/$field.json" --cluster h200x2 --max-memory 64M
done
one_line_error "$tool" --schedule "$work/nFlags.json" --cluster h200x2 --max-memory 64M
# under the limit but above the address space: the simulating child runs out of memory, and that is exit 5 with one
# line, not an internal error (an AddressSanitizer build reserves terabytes of address space: no ulimit -v there)
if ! ldd "$tool" 2>/dev/null | grep -q libasan; then
  sed 's/"nFlags": 5000000/"nFlags": 2000000/' "$work/nFlags.json" >"$work/flags2m.json"
  expect 5 '^mk-sim: error: out of memory' -- bash -c "ulimit -v 1048576 && exec \"\$@\"" _ \
    "$tool" --schedule "$work/flags2m.json" --cluster h200x2 --max-memory 4G
  one_line_error bash -c "ulimit -v 1048576 && exec \"\$@\"" _ "$tool" --schedule "$work/flags2m.json" \
    --cluster h200x2 --max-memory 4G
fi

# 2 ranks on a 4000-node cluster: only the node they use is built
expect 0 '^predicted: ' -- timeout 20 "$tool" --cluster dgx-h100 --nodes 4000 --ranks 2 --bytes 1MiB
# a sweep whose MAX is 2^64-1 ends (at most 64 sizes)
expect 0 '^busiest links at' -- timeout 120 "$tool" --algo one-shot --cluster h200x2 --sweep 8:18446744073709551615:1024

# all or nothing: the second output cannot be written, so the first target keeps its old content
echo old >"$work/keep.json"
long="$work/$(printf 't%.0s' {1..250})"
expect 2 'cannot write' -- "$tool" --algo ring --cluster h200x2 --bytes 1MiB --json "$work/keep.json" --trace "$long"
check "the first target kept its old content" grep -qx old "$work/keep.json"
check "no temporary left" test -z "$(find "$work" -name '*.tmp.*')"

# SIGTERM during a long run: the process ends, and neither a target nor a temporary is left behind
"$tool" --algo ring --cluster dgx-h100 --nodes 16 --bytes 1G --chunks 8 --json "$work/long.json" \
  --trace "$work/long-trace.json" >/dev/null 2>&1 &
pid=$!
sleep 2
kill -TERM "$pid"
wait "$pid"
rc=$?
check "SIGTERM ended mk-sim (rc $rc)" test "$rc" -ne 0
check "no target written by the killed run" test ! -e "$work/long.json" -a ! -e "$work/long-trace.json"
check "no temporary left by the killed run" test -z "$(find "$work" -name '*.tmp.*')"

cli_summary
