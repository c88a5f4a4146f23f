#!/usr/bin/env bash
# Gather what a device run needs into one folder to carry (the device image has no MPI, SimGrid or rdma-core):
#   impl/tools/pack_device.sh <build dir> <out dir> [binary ...]
# copies <build dir>/impl/<binary> (default: the one-GPU test binaries and mk-bench) stripped of symbols into
# <out dir>/impl (the layout impl/tools/gpu_suite.sh expects of a build folder), plus every shared library they load that is not part of glibc / libstdc++, into <out dir>/lib.
# On the device: export LD_LIBRARY_PATH=<out dir>/lib; impl/tools/gpu_suite.sh <out dir> <log> ...
# The device tool carries at most 64 MiB with the tree: name only what the run needs.
set -euo pipefail
build=$1
out=$2
shift 2
bins=("$@")
[[ ${#bins[@]} -eq 0 ]] && bins=(mk_gpu_tests mk_compute_lane_gpu_tests mk_gemm_gpu_tests mk-bench)
rm -rf "$out"
mkdir -p "$out/lib" "$out/impl"
for b in "${bins[@]}"; do
  src=$build/impl/$b
  [[ -x $src ]] || { echo "pack_device: $src is missing (build it first)" >&2; exit 2; }
  strip -o "$out/impl/$b" "$src"
  ldd "$src" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
      libc.so*|libm.so*|libstdc++.so*|libgcc_s.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
      *) cp -nL "$lib" "$out/lib/" ;;
    esac
  done
done
du -sh "$out"
