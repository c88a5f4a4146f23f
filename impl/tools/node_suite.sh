#!/usr/bin/env bash
# Everything the multi-GPU issues measure on one node, in ONE device call (the device time is scarce):
# topology, the GPU test suite, mk-bench of all-reduce / all-gather / reduce-scatter (mkernel auto and every
# algorithm, NCCL in the same run, NVLS off), and the calibration micro-benchmarks. mk-validate runs afterwards
# on the developer machine (it needs SimGrid), on the files this writes.
#
#   impl/tools/node_suite.sh <build dir> <out dir> [max bytes, default 1G] [gpus, default all]
#
# <build dir> holds impl/mk-bench and the GPU test binaries (built with nvcc on the developer machine and
# carried). Files written to <out dir>: topo.txt, nvidia-smi.txt, suite.log, suite-summary.txt, mkbench.log,
# <date>-<tag>-{allreduce,allgather,reducescatter,calibration}.json, where <tag> is h200x<gpus>.
set -u
build=$1
out=$2
maxBytes=${3:-1G}
export CUDA_MODULE_LOADING=EAGER NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nccl=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
[[ -d $nccl ]] && export LD_LIBRARY_PATH=$nccl:${LD_LIBRARY_PATH:-}
gpus=${4:-$(nvidia-smi -L | grep -c '^GPU')}
tag="h200x${gpus}"
day=$(date -u +%Y-%m-%d)
mkdir -p "$out"
nvidia-smi topo -m > "$out/topo.txt" 2>&1
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
here=$(cd "$(dirname "$0")" && pwd)
"$here/gpu_suite.sh" "$build" "$out/suite.log" 60 > "$out/suite-summary.txt" 2>&1
tail -1 "$out/suite-summary.txt"
bench=$build/impl/mk-bench
status=0
for op in allreduce allgather reducescatter; do
  "$bench" "$op" -g "$gpus" -b 8 -e "$maxBytes" -f 2 --algo all --baseline nccl -n 40 -w 10 --reps 3 \
    --json "$out/$day-$tag-$op.json" >> "$out/mkbench.log" 2>&1 || status=1
done
"$bench" calibrate --json "$out/$day-$tag-calibration.json" >> "$out/mkbench.log" 2>&1 || status=1
grep -E "^# (wrote|mk-bench)|error|wrong" "$out/mkbench.log"
exit $status
