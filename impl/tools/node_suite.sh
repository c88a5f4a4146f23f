#!/usr/bin/env bash
# Everything the GPU engine's measurements need on one node, in ONE device call (device time is scarce):
#   1. mk-bench calibrate (micro-benchmarks) and mk-calibrate on it -> the node's profile;
#   2. mk-bench allreduce / allgather / reducescatter, 8 B .. max bytes, mkernel auto (costed against that
#      profile) and every algorithm, NCCL in the same run (NVLS off);
#   3. one traced 1 MiB two-shot all-reduce (for mk-validate's side-by-side trace);
#   4. mk-bench gemm over the reference shapes (--shapes reference) with --check, the GEMM GPU tests, SASS facts; the GEMM as a Gemm
#      step inside the resident kernel against the standalone kernel (mk-bench gemm --engine both);
#   5. the GPU test suite (single- and multi-process), one process per case under a time limit;
#   6. mk-probe-latency: the hand-off floors and the engine's per-op stage times (docs/gpu-engine.md, "Latency").
# mk-validate runs afterwards on the developer machine (it needs SimGrid), on the files this writes.
#
#   impl/tools/node_suite.sh <build dir> <out dir> [max bytes, default 512M] [gpus, default all] [--no-gemm-shapes]
#
# --no-gemm-shapes skips step 4's standalone reference table (about 100 s) but keeps the compute-lane benches.
# docs/results.md says which runs used this script and how.
#
# <build dir> holds impl/{mk-bench, mk-probe-latency, mk_gpu_tests, mk_multigpu_tests, mk_multiprocess_tests,
# mk_gemm_gpu_tests, mk_compute_lane_gpu_tests, mk_compute_lane_multigpu_tests}
# and validation/mk-calibrate, built with nvcc on the developer machine and carried. The device tool brings back
# at most 8 files: pack <out dir> (tar) when it runs there.
set -u
build=$1
R=$2
maxBytes=${3:-512M}
gemmShapes=1
[[ ${5:-} == --no-gemm-shapes ]] && gemmShapes=0
export CUDA_MODULE_LOADING=EAGER NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib; do
  [[ -d $d ]] && export LD_LIBRARY_PATH=$d:${LD_LIBRARY_PATH:-}
done
gpus=${4:-$(nvidia-smi -L | grep -c '^GPU')}
tag="h200x${gpus}"
cluster=$([[ $gpus -eq 2 ]] && echo h200x2 || echo dgx-h200)
day=$(date -u +%Y-%m-%d)
B=$build/impl
mkdir -p "$R"
t0=$(date +%s)
stamp() { echo "# $(($(date +%s) - t0)) s: $*" | tee -a "$R/summary.log"; }
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
nvidia-smi topo -m > "$R/topo.txt" 2>&1
stamp calibrate
timeout 150 "$B/mk-bench" calibrate --json "$R/$day-$tag-calibration.json" > "$R/calibrate.log" 2>&1
echo "calibrate rc=$?" >> "$R/summary.log"
"$build/validation/mk-calibrate" --cluster "$cluster" --out "$R/$tag-profile.json" "$R/$day-$tag-calibration.json" \
  > "$R/calibrate-fit.txt" 2>&1
echo "fit rc=$?" >> "$R/summary.log"
prof=()
[[ -s $R/$tag-profile.json ]] && prof=(--profile "$R/$tag-profile.json")
for op in allreduce allgather reducescatter; do
  stamp "$op"
  timeout 300 "$B/mk-bench" "$op" -g "$gpus" -b 8 -e "$maxBytes" -f 2 --algo all --baseline nccl -n 40 -w 10 --reps 3 \
    "${prof[@]}" --json "$R/$day-$tag-$op.json" >> "$R/mkbench.log" 2>&1
  echo "$op rc=$?" >> "$R/summary.log"
done
stamp trace
timeout 30 "$B/mk-bench" allreduce -g "$gpus" -b 1M -e 1M --algo two-shot -n 5 -w 2 --reps 1 --latency-probes 0 \
  --trace "$R/trace-allreduce-two-shot-1M.json" >> "$R/mkbench.log" 2>&1
stamp gemm
if [[ $gemmShapes -eq 1 ]]; then
  timeout 150 "$B/mk-bench" gemm --shapes reference --check --json "$R/$day-h200-gemm.json" > "$R/gemm.log" 2>&1
  echo "gemm rc=$?" >> "$R/summary.log"
  timeout 90 "$B/mk_gemm_gpu_tests" > "$R/gemm-tests.log" 2>&1
  echo "gemm tests rc=$?" >> "$R/summary.log"
  (cuobjdump -sass "$B/mk-bench" | grep -c HGMMA; cuobjdump -res-usage "$B/mk-bench" | grep -A1 -i gemm) > "$R/sass.txt" 2>&1
fi
for shape in "-m 8192 -n 8192 -k 4096" "-m 4096 -n 4096 -k 2048 --ctas 116"; do
  # shellcheck disable=SC2086
  timeout 40 "$B/mk-bench" gemm --engine both --check $shape >> "$R/gemm-compute-lane.log" 2>&1
  echo "gemm compute lane ($shape) rc=$?" >> "$R/summary.log"
done
stamp suite
timeout 200 "$(dirname "$0")/gpu_suite.sh" "$build" "$R/suite.log" 60 mk_gpu_tests mk_multigpu_tests mk_multiprocess_tests \
  mk_compute_lane_gpu_tests mk_compute_lane_multigpu_tests > "$R/suite-summary.txt" 2>&1
tail -2 "$R/suite-summary.txt" | tee -a "$R/summary.log"
stamp probe
timeout 120 "$B/mk-probe-latency" --rounds 1000 > "$R/probe-latency.log" 2>&1
echo "probe rc=$?" >> "$R/summary.log"
stamp done
