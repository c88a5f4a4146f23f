#!/usr/bin/env bash
# cli_testlib.sh's own checks: expect_error passes a command that exits 2 with one matching stderr line, and fails
# (counting each failed check once) a wrong exit code, a second stderr line, or output that does not match.
#   cmake/cli_testlib_test.sh
set -u
# shellcheck source=cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cli_testlib.sh"
status=0
# outcome <passes> <failures> <what>: the counts since the last call must be these; then they are reset
outcome() {
  if [[ $passes -ne $1 || $failures -ne $2 ]]; then
    echo "WRONG: $3: $passes passed, $failures failed (want $1 and $2)"
    status=1
  fi
  passes=0
  failures=0
}
# try <passes> <failures> <what> <regex> <bash code>: expect_error on `bash -c <code>` must count these
try() {
  expect_error "$4" -- bash -c "$5" >/dev/null
  outcome "$1" "$2" "$3"
}
try 2 0 "exit 2, one stderr line that matches" 'bad flag' 'echo "tool: error: bad flag" >&2; exit 2'
try 2 0 "stdout does not count as a stderr line" 'bad flag' 'echo "an answer"; echo "tool: error: bad flag" >&2; exit 2'
try 1 1 "exit 1 instead of 2" 'bad flag' 'echo "tool: error: bad flag" >&2; exit 1'
try 1 1 "two stderr lines" 'bad flag' 'printf "tool: error: bad flag\nmore\n" >&2; exit 2'
try 1 1 "stderr that does not match" 'bad flag' 'echo "tool: error: something else" >&2; exit 2'
try 2 0 "the pattern may match a stdout line" '^answer 42$' 'echo "answer 42"; echo "tool: error: x" >&2; exit 2'
[[ $status -eq 0 ]] && echo "expect_error: 6 of 6 cases counted right"
exit $status
