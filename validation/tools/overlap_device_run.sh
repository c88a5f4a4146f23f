#!/bin/bash
# GEMMs beside our resident kernel and beside the Triton copy stand-in, on one GPU machine, in one call
# (docs/calibration.md, "GEMMs beside communication"; issue 34, item 4):
#   validation/tools/overlap_device_run.sh <pack.tar.xz> <commit> <out dir>
# <pack.tar.xz>: impl/tools/pack_device.sh's folder `pack` (mk-bench and its libraries) as a tarball. The MPS daemon
# is started here, not by impl/tools/launch_ranks.sh: the launcher marks its child as one rank, and the engine's
# `mk-bench soak --ranks 2` refuses that. The engine runs 2, 4, 8 and 16 workers per rank (two ranks: 4 to 32 CTAs;
# two workers is its minimum, one lane per CTA); the copy then runs without MPS at 2, 8, 16 and 32 CTAs.
set -u
pack=$1 commit=$2 out=$3
work=$(mktemp -d)
mkdir -p "$out"
tar xJf "$pack" -C "$work" || { echo "overlap_device_run: cannot unpack $pack" >&2; exit 2; }
export LD_LIBRARY_PATH=$work/pack/lib:${LD_LIBRARY_PATH:-}
py=/opt/torch/.venv/bin/python
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >"$out/gpu.txt"
t0=$SECONDS
export CUDA_MPS_PIPE_DIRECTORY=$work/mps-pipe CUDA_MPS_LOG_DIRECTORY=$out/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
/usr/local/nvidia/bin/nvidia-cuda-mps-control -d
timeout -k 20 420 "$py" validation/tools/overlap_bench.py --comm engine --mk-bench "$work/pack/impl/mk-bench" \
  --ctas 2,4,8,16 --commit "$commit" --out "$out/overlap-engine.json" >"$out/overlap-engine.log" 2>&1
echo "engine rc $? $((SECONDS - t0)) s"
echo quit | /usr/local/nvidia/bin/nvidia-cuda-mps-control
sleep 2
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
t1=$SECONDS
timeout -k 20 240 "$py" validation/tools/overlap_bench.py --ctas 2,8,16,32 --commit "$commit" \
  --out "$out/overlap-copy.json" >"$out/overlap-copy.log" 2>&1
echo "copy rc $? $((SECONDS - t1)) s"
rm -rf "$work"
