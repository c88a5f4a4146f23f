#!/usr/bin/env bash
# install-test: cmake --install into a temporary prefix, then configure, build and run a consumer project
# that uses find_package(mkernel).   Usage: run.sh <build dir> <scratch dir> [consumer cmake args...]
# (a sanitizer build passes its -fsanitize flags: the installed libraries need its runtime).
set -euo pipefail
build=$1
work=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -f "$work/prefix/lib/cmake/mkernel/mkernelConfig.cmake"
test -x "$work/prefix/bin/mk-schedule"
test -f "$work/prefix/include/mk/schedule/schedule.hpp"
cmake -S "$here" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" "$@" >"$work/configure.log"
cmake --build "$work/consumer" >"$work/build.log"
"$work/consumer/consumer"
"$work/prefix/bin/mk-schedule" --op allgather --algo direct --ranks 3 --bytes 3K --verify | grep '^verify: OK'
