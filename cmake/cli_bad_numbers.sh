#!/usr/bin/env bash
# Every numeric flag of a tool fed hostile values: each must end in exit 2 and exactly one stderr line.
#
#   cli_bad_numbers.sh [--no-zero] <tool> "<extra flags>" [base args...]
#
# The flags come from the tool's --help (every option typed UINT, INT or FLOAT), plus <extra flags>: options
# typed TEXT that carry a number (--bytes 64K). Each flag gets -1, 1e400, nan, inf, 18446744073709551617, abc
# and 0x10 after the base args (which make a valid, quick run); 0 must be refused the same way or run cleanly
# (exit 0), as 0 is valid for some flags (--root 0, --seed 0); --no-zero skips that probe for tools whose
# valid run is long (a simulation per record).
set -u
zero=1
if [[ $1 == --no-zero ]]; then
  zero=0
  shift
fi
tool=$1
extra=$2
shift 2
base=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cli_testlib.sh
source "$here/cli_testlib.sh"

mapfile -t flags < <("$tool" --help | sed -nE 's/^ +(-[a-z],)?(--[a-z0-9-]+) (UINT|INT|FLOAT)( |=|$).*/\2/p' | sort -u)
for f in $extra; do flags+=("$f"); done
check "$tool --help lists numeric flags" test "${#flags[@]}" -gt 0

# The base args without <flag> and its value: a flag given twice is refused for that reason alone.
without() {
  args=()
  local i=0
  while [[ $i -lt ${#base[@]} ]]; do
    if [[ ${base[$i]} == "$1" ]]; then
      i=$((i + 2))
      continue
    fi
    args+=("${base[$i]}")
    i=$((i + 1))
  done
}

refused() {  # <flag> <value>: exit 2, one stderr line
  local flag=$1 value=$2 err rc lines
  without "$flag"
  err=$("$tool" "${args[@]}" "$flag" "$value" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s' "$err" | grep -c '')
  if [[ $rc -ne 2 || $lines -ne 1 ]]; then
    echo "FAIL: $tool ${args[*]} $flag $value -> rc $rc (want 2), $lines stderr lines (want 1):"
    printf '%s\n' "$err" | head -5 | sed 's/^/    /'
    failures=$((failures + 1))
  else
    passes=$((passes + 1))
  fi
}

for flag in "${flags[@]}"; do
  for value in -1 1e400 nan inf 18446744073709551617 abc 0x10; do refused "$flag" "$value"; done
  [[ $zero -eq 1 ]] || continue
  without "$flag"
  err=$(timeout 120 "$tool" "${args[@]}" "$flag" 0 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s' "$err" | grep -c '')
  if [[ $rc -eq 0 || ($rc -eq 2 && $lines -eq 1) ]]; then
    passes=$((passes + 1))
  else
    echo "FAIL: $tool ${args[*]} $flag 0 -> rc $rc (want 0, or 2 with one line), $lines stderr lines:"
    printf '%s\n' "$err" | head -5 | sed 's/^/    /'
    failures=$((failures + 1))
  fi
done
echo "$tool: ${#flags[@]} numeric flags"
cli_summary
