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
# find_package(mkernel COMPONENTS models) on a machine without CUDA, SimGrid, MPI or OpenSSL: each of them made
# unfindable (pkg-config finds no module, find_package of CUDAToolkit, MPI, OpenSSL and PkgConfig disabled).
PKG_CONFIG_LIBDIR=/nonexistent PKG_CONFIG_PATH= cmake -S "$here" -B "$work/consumer-models" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DMODELS_ONLY=ON -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=ON \
  "$@" >"$work/configure-models.log"
cmake --build "$work/consumer-models" >"$work/build-models.log"
"$work/consumer-models/consumer" | grep '^consumer (models only): OK'
"$work/prefix/bin/mk-schedule" --op allgather --algo direct --ranks 3 --bytes 3K --verify | grep '^verify: OK'
