#!/usr/bin/env bash
# mk-schedule's resource guards and output contract: a request above --max-memory is refused fast with the parts
# and the option named (exit 2), absurd counts are refused before any loop runs, and when one of several outputs
# cannot be written none of the targets is replaced.  Usage: guards_contract.sh <mk-schedule> <workdir>
set -u
tool=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
# shellcheck source=../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../cmake/cli_testlib.sh"

# refused fast and in little memory (guarded: 10 s, 2 GiB of address space)
expect 2 'needs more than ~[0-9.]+ GiB \(schedule >[0-9.]+ GiB\) above --max-memory 12 GiB; raise it with --max-memory' -- \
  guarded "$tool" --op allreduce --algo ring --cluster dgx-h100 --nodes 1024 --max-memory 12G
expect 2 'needs .*\(schedule .*verify .*\) above --max-memory 4 GiB' -- \
  guarded "$tool" --op allreduce --algo ring --ranks 32 --cluster dgx-h100 --nodes 4 --bytes 64MiB --verify --max-memory 4G
expect 2 'chunks 4294967295 is more than the 262144 element\(s\) per rank' -- \
  guarded "$tool" --op allreduce --algo ring --ranks 8 --bytes 1MiB --chunks 4294967295
expect 2 'needs more than' -- guarded "$tool" --op allreduce --algo ring --ranks 8 --bytes 1G --channels 4294967295 --max-memory 1G
expect 2 'needs' -- guarded "$tool" --op allreduce --algo ring --cluster dgx-h100 --nodes 1024 --ranks 2048 --chunks 8 --channels 2
# the same requests under a limit that holds them run
expect 0 '^verify: OK' -- "$tool" --op allreduce --algo ring --ranks 8 --bytes 1MiB --verify --max-memory 1G
# --max-memory itself: a size, > 0
expect 2 'max-memory' -- "$tool" --max-memory lots
expect 2 'max-memory' -- "$tool" --max-memory 0
expect 2 'max-memory' -- "$tool" --max-memory=-5G
one_line_error "$tool" --op allreduce --algo ring --cluster dgx-h100 --nodes 1024 --max-memory 1G
expect 0 'max-memory SIZE +refuse' -- "$tool" --help
expect 0 'progress' -- "$tool" --help
# progress lines go to stderr only when asked (or on a terminal), never into stdout
out=$("$tool" --op allreduce --algo ring --ranks 8 --bytes 1MiB --progress 2>/dev/null)
check "progress lines stay off stdout" test -z "$(grep -E 'done,|: generate:|: verify:' <<<"$out")"

# all or nothing: the second output cannot be written (a name too long for a temporary next to it), so the first
# target keeps its old content and no temporary is left
echo old >"$work/keep.json"
long="$work/$(printf 'p%.0s' {1..250})"
expect 2 "io-error.*cannot write" -- "$tool" --op allreduce --algo ring --ranks 4 --bytes 4K --json "$work/keep.json" \
  --packed "$long"
check "the first target kept its old content" grep -qx old "$work/keep.json"
check "no temporary left next to the targets" test -z "$(find "$work" -name '*.tmp.*')"
# both written when both can be
expect 0 'wrote' -- "$tool" --op allreduce --algo ring --ranks 4 --bytes 4K --json "$work/keep.json" --packed "$work/k.bin"
check "both outputs written" test -s "$work/k.bin" -a "$(head -c 1 "$work/keep.json")" = "{"

cli_summary
