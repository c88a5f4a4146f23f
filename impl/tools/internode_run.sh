#!/usr/bin/env bash
# The inter-node measurements of one GPU machine, in one go (docs/inter-node.md, docs/results.md): every rank
# process shares GPU 0 under CUDA MPS, each process is a "node" of its own (--ranks-per-node 1) and the network is
# the socket transport over loopback TCP.
#   impl/tools/internode_run.sh <build dir> <out dir> [quick]
# <build dir> holds impl/<binaries> (a build folder, or impl/tools/pack_device.sh's output with lib/ beside it).
# Writes <out>/*.json (measurement files) and <out>/*.log (the ranks' own logs go to $TMPDIR). `quick`: short sweeps,
# to check that everything runs.
set -u
build=$1
out=$2
quick=${3:-}
mkdir -p "$out"
[[ -d $build/lib ]] && export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bench=$build/impl/mk-bench
status=0
step() {  # step <name> <command...>: run, log, remember the first failure
  local name=$1
  shift
  echo "== $name: $*" | tee -a "$out/internode.log"
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc, $((SECONDS - t0)) s" | tee -a "$out/internode.log"
  tail -3 "$out/$name.log" | sed 's/^/   /' | tee -a "$out/internode.log"
  [[ $rc -ne 0 && $status -eq 0 ]] && status=$rc
  return 0
}
ranks() {  # ranks <n> <per node> <mk-bench args...>: n processes, <per node> a node, sharing GPU 0 under MPS
  local n=$1 per=$2
  shift 2
  "$here/launch_ranks.sh" --mps --logs "$(mktemp -d "${TMPDIR:-/tmp}/mk-ranks.XXXXXX")" "$n" "$bench" "$@" \
    --ranks-per-node "$per" --share-gpus --transport socket
}
if [[ -n $quick ]]; then
  fifo=(--rounds 2000 --commands 200000 --reps 3)
  net=(-b 8 -e 4M -f 16 --reps 3)
  coll=(-b 8 -e 1M -f 32 -n 10 -w 3 --reps 3)
else
  fifo=()
  net=(-b 8 -e 256M -f 4 --reps 5)
  coll=(-b 8 -e 256M -f 4 -n 10 -w 3 --reps 5)
fi
coll+=(--algo auto,hierarchical)
step probe-fifo "$build/impl/mk-probe-fifo" "${fifo[@]}" --json "$out/fifo.json"
step probe-fifo-32 "$build/impl/mk-probe-fifo" "${fifo[@]}" --pushers 32 --json "$out/fifo-32pushers.json"
[[ -x $build/impl/mk-proxy-bench ]] && step proxy-bench "$build/impl/mk-proxy-bench" --json "$out/proxy-bench.json"
step calibrate-network ranks 2 1 calibrate-network "${net[@]}" --json "$out/calibrate-network.json"
step allreduce-2n ranks 2 1 allreduce "${coll[@]}" --check --json "$out/allreduce-2n.json"
step allreduce-4n ranks 4 1 allreduce "${coll[@]}" --check --json "$out/allreduce-4n.json"
step allreduce-2x2 ranks 4 2 allreduce "${coll[@]}" --check --json "$out/allreduce-2x2.json"
echo "internode_run: status $status" | tee -a "$out/internode.log"
exit $status
