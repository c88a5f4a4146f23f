#!/usr/bin/env bash
# write_build_commit.cmake: the commit is the tree's at build time, and the generated source is rewritten only when
# it changes (a rebuild recompiles nothing otherwise).   Usage: build_commit_test.sh <source dir> <scratch dir>
set -u
src=$1
work=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work/notgit"
out=$work/commit.cpp
gen() { cmake -DSRC="$1" -DOUT="$out" -P "$here/write_build_commit.cmake"; }
fail=0
gen "$src"
sha=$(git -C "$src" rev-parse HEAD)
grep -q "return \"$sha\(-dirty\)\?\";" "$out" || { echo "FAIL: $out does not name HEAD $sha"; cat "$out"; fail=1; }

touch -d '2000-01-01' "$out"
stamp=$(stat -c %Y "$out")
gen "$src"
[[ $(stat -c %Y "$out") == "$stamp" ]] || { echo "FAIL: an unchanged commit rewrote $out"; fail=1; }
GIT_CEILING_DIRECTORIES=$work gen "$work/notgit"  # no repository above it either
grep -q 'return "unknown";' "$out" || { echo "FAIL: outside git the commit is not 'unknown'"; cat "$out"; fail=1; }
[[ $(stat -c %Y "$out") != "$stamp" ]] || { echo "FAIL: a changed commit left $out as it was"; fail=1; }
[[ $fail == 0 ]] && echo "build commit: OK"
exit $fail
