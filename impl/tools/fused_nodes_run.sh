#!/usr/bin/env bash
# The fused operators across "nodes" on one GPU machine (issue 37; docs/fused-operators.md, "Across nodes"): every
# rank is a process sharing GPU 0 under CUDA MPS, nodes of 1 (2 x 1) or 2 (2 x 2) ranks, the network the socket
# transport over loopback TCP. Each op (gemm-rs, ag-gemm, gemm-ar) runs with --check next to GEMM-then-collective over
# the same transport, in the same run; calibrate-network first records the transport of the same session.
# Shapes: a ProxyPut over loopback moved about 2 GB/s (validation/data/measured/internode, calib-put-network at 2-32
# MiB), a rank's share of an H100 computes some 10^14 FLOP/s, so GEMM time ~ transfer time needs k ~ 10^5 for gemm-rs
# and gemm-ar (the transfer grows with m n, the GEMM with m n k) and n ~ 10^5 for ag-gemm (transfer m k, GEMM m n k):
# two such shapes per op around that balance, and m = n = k = 4096, where the network dominates.
#   impl/tools/fused_nodes_run.sh <build dir> [out dir (default $OUT)] [quick|full] [step...]
# step: calibrate-network, gemm-rs, ag-gemm, gemm-ar (default: all four, in this order; a lease's 10-minute call
# fits calibrate-network + one op, so a full run is usually two or three calls).
# <build dir> holds impl/mk-bench (a build folder, or `impl/tools/pack_device.sh build-cuda <pack> mk-bench`'s output,
# lib/ beside it). Writes
# <out>/*.json (measurement files), <out>/*.log (rank 0's output) and <out>/ranks-<step>/rank<i>.log. Every step runs
# under `timeout` (launch_ranks.sh stops its ranks and the MPS daemon on the signal), so the script ends by itself.
# `quick`: one small shape, to check that everything runs. Exit status: the first failing step's.
set -u
build=${1:?usage: fused_nodes_run.sh <build dir> [out dir] [quick]}
out=${2:-${OUT:?no out dir: give one or set OUT}}
mode=${3:-full}
[[ $mode == quick || $mode == full ]] || { echo "fused_nodes_run: mode must be quick or full, not '$mode'" >&2; exit 2; }
quick=""
[[ $mode == quick ]] && quick=1
steps=("${@:4}")
[[ ${#steps[@]} -eq 0 ]] && steps=(calibrate-network gemm-rs ag-gemm gemm-ar)
for s in "${steps[@]}"; do
  [[ $s =~ ^(calibrate-network|gemm-rs|ag-gemm|gemm-ar)$ ]] || { echo "fused_nodes_run: unknown step '$s'" >&2; exit 2; }
done
wanted() { [[ " ${steps[*]} " == *" $1 "* ]]; }
mkdir -p "$out"
[[ -d $build/lib ]] && export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench=$build/impl/mk-bench
[[ -x $bench ]] || { echo "fused_nodes_run: $bench is missing (build or pack it first)" >&2; exit 2; }
limit=420  # seconds per step: a hang costs one step, not the lease
status=0
step() {  # step <name> <ranks> <per node> <mk-bench args...>: n processes sharing GPU 0 under MPS, logged, bounded
  local name=$1 n=$2 per=$3
  shift 3
  echo "== $name: $n ranks, $per per node: mk-bench $*" | tee -a "$out/fused_nodes.log"
  local t0=$SECONDS
  timeout -k 20 "$limit" "$here/launch_ranks.sh" --mps --logs "$out/ranks-$name" "$n" "$bench" "$@" \
    --ranks-per-node "$per" --share-gpus --transport socket >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc, $((SECONDS - t0)) s" | tee -a "$out/fused_nodes.log"
  tail -6 "$out/$name.log" | sed 's/^/   /' | tee -a "$out/fused_nodes.log"
  [[ $rc -ne 0 && $status -eq 0 ]] && status=$rc
  return 0
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
if [[ -n $quick ]]; then
  reduce=("2048 1024 8192")  # "m n k" of gemm-rs and gemm-ar
  gather=("2048 8192 1024")  # of ag-gemm
  timing=(--iters 5 -w 2 --reps 3)
  net=(-b 8 -e 4M -f 16 --reps 3)
else
  reduce=("8192 1024 32768" "8192 1024 131072" "4096 4096 4096")
  gather=("4096 32768 1024" "4096 131072 1024" "4096 4096 4096")
  timing=(--iters 10 -w 3 --reps 5)
  net=(-b 8 -e 64M -f 4 --reps 5)
fi
wanted calibrate-network && step calibrate-network 2 1 calibrate-network "${net[@]}" --json "$out/calibrate-network.json"
for op in gemm-rs ag-gemm gemm-ar; do
  wanted "$op" || continue
  if [[ $op == ag-gemm ]]; then shapes=("${gather[@]}"); else shapes=("${reduce[@]}"); fi
  for shape in "${shapes[@]}"; do
    read -r m n k <<<"$shape"
    step "$op-2x1-${m}x${n}x$k" 2 1 "$op" -m "$m" -n "$n" -k "$k" "${timing[@]}" --check \
      --json "$out/$op-2x1-${m}x${n}x$k.json"
  done
  # 2 nodes of 2 ranks: four processes on the GPU; the first shape only
  read -r m n k <<<"${shapes[0]}"
  step "$op-2x2-${m}x${n}x$k" 4 2 "$op" -m "$m" -n "$n" -k "$k" "${timing[@]}" --check \
    --json "$out/$op-2x2-${m}x${n}x$k.json"
done
echo "fused_nodes_run: status $status" | tee -a "$out/fused_nodes.log"
exit $status
