# Shared by the CLI contract tests (models/tests/cli_contract.sh, sim/tests/cli_contract.sh): source it.
# Counts into $passes and $failures; call `cli_summary` last (prints "N passed, N failed", returns non-zero on failure).
passes=0
failures=0

# expect <exit code> <regex that stdout+stderr must match> -- command...
expect() {
  local want=$1 pattern=$2
  shift 3
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  judge "$want" "$pattern" "$rc" "$out" "$@"
}

# judge <exit code wanted> <regex> <exit code> <output> <command...>: the check behind expect, counted once.
judge() {
  local want=$1 pattern=$2 rc=$3 out=$4
  shift 4
  if [[ $rc -ne $want ]] || ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> rc $rc (want $want), output:"
    sed 's/^/    /' <<<"$out" | head -20
    echo "    (wanted /$pattern/)"
    failures=$((failures + 1))
  else
    passes=$((passes + 1))
  fi
}

# check <description> <test command...>: a plain assertion counted like the others.
check() {
  local what=$1
  shift
  if "$@"; then passes=$((passes + 1)); else echo "FAIL: $what"; failures=$((failures + 1)); fi
}

# one_line_error <command...>: a failing command must print exactly one line on stderr.
one_line_error() {
  local n
  n=$("$@" 2>&1 >/dev/null | wc -l)
  check "$* printed $n stderr lines (want 1)" test "$n" -eq 1
}

# expect_error <regex> -- command...: `expect 2 <regex>` and `one_line_error` on one run of the command (exit 2,
# stdout+stderr matching, exactly one stderr line), counted as those two: an instrumented tool's start alone costs
# a quarter of a second, and the contracts refuse hundreds of inputs.
expect_error() {
  local pattern=$1
  shift 2
  local err out rc n
  err=$(mktemp)
  out=$("$@" 2>"$err")
  rc=$?
  n=$(wc -l <"$err")
  out=$(printf '%s\n' "$out" && cat "$err")
  rm -f "$err"
  judge 2 "$pattern" "$rc" "$out" "$@"
  check "$* printed $n stderr lines (want 1)" test "$n" -eq 1
}

# guarded <command...>: run with at most 2 GiB of address space and 10 s, for requests a guard must refuse
# fast and in little memory (a guard that let one through fails here instead of taking the machine). An
# AddressSanitizer build reserves terabytes of shadow address space at start, so there only a time limit applies,
# 30 s: instrumented code runs several times slower (the 1024-node refusal's counting pass: 1.1 s of CPU
# uninstrumented, 6 s under ASan + UBSan), and the 10 s bound on speed is the uninstrumented build's, which CI runs
# first. 30 s still catches a guard that lets a request through (those run for minutes).
guarded() {
  if ldd "$1" 2>/dev/null | grep -q libasan; then
    timeout 30 "$@"
  else
    (ulimit -v 2097152 && timeout 10 "$@")
  fi
}

cli_summary() {
  echo "$passes passed, $failures failed"
  [[ $failures -eq 0 ]]
}
