#!/usr/bin/env bash
# The fused operators across "nodes" on one GPU machine (issue 37; docs/fused-operators.md, "Across nodes"): every
# rank is a process sharing GPU 0 under CUDA MPS, nodes of 1 (2 x 1) or 2 (2 x 2) ranks, the network the socket
# transport over loopback TCP. Each op (gemm-rs, ag-gemm, gemm-ar) runs with --check at shapes where the GEMM and the
# loopback transfer take comparable time (m = n = 4096, k = 1024 / 2048 / 4096), next to GEMM-then-collective over the
# same transport, in the same run; calibrate-network first records the transport of the same session.
#   impl/tools/fused_nodes_run.sh <build dir> [out dir (default $OUT)] [quick]
# <build dir> holds impl/mk-bench (a build folder, or impl/tools/pack_device.sh's output with lib/ beside it). Writes
# <out>/*.json (measurement files), <out>/*.log (rank 0's output) and <out>/ranks-<step>/rank<i>.log. Every step runs
# under `timeout` (launch_ranks.sh stops its ranks and the MPS daemon on the signal), so the script ends by itself.
# `quick`: one small shape, to check that everything runs. Exit status: the first failing step's.
set -u
build=${1:?usage: fused_nodes_run.sh <build dir> [out dir] [quick]}
out=${2:-${OUT:?no out dir: give one or set OUT}}
quick=${3:-}
mkdir -p "$out"
[[ -d $build/lib ]] && export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench=$build/impl/mk-bench
[[ -x $bench ]] || { echo "fused_nodes_run: $bench is missing (build or pack it first)" >&2; exit 2; }
limit=420  # seconds per step (the full set's longest, 4 processes at k = 2048, needs well under it): a hang costs one step
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
  ks=(1024)
  mn=2048
  timing=(--iters 5 -w 2 --reps 3)
  net=(-b 8 -e 4M -f 16 --reps 3)
else
  ks=(1024 2048 4096)
  mn=4096
  timing=(--iters 10 -w 3 --reps 5)
  net=(-b 8 -e 64M -f 4 --reps 5)
fi
step calibrate-network 2 1 calibrate-network "${net[@]}" --json "$out/calibrate-network.json"
for op in gemm-rs ag-gemm gemm-ar; do
  for k in "${ks[@]}"; do
    step "$op-2x1-k$k" 2 1 "$op" -m "$mn" -n "$mn" -k "$k" "${timing[@]}" --check --json "$out/$op-2x1-k$k.json"
  done
  # 2 nodes of 2 ranks: four processes on the GPU; the middle shape only
  k=${ks[$((${#ks[@]} / 2))]}
  step "$op-2x2-k$k" 4 2 "$op" -m "$mn" -n "$mn" -k "$k" "${timing[@]}" --check --json "$out/$op-2x2-k$k.json"
done
echo "fused_nodes_run: status $status" | tee -a "$out/fused_nodes.log"
exit $status
