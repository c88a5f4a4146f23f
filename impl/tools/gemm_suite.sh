#!/usr/bin/env bash
# mkernel — the GEMM engine's device suite, one call on the GPU machine:
#   GPU tests, mk-bench gemm over the reference table (--shapes reference) with --check, SASS / resource facts, and
#   compute-sanitizer memcheck on a small subset of the tests.
#
#   impl/tools/gemm_suite.sh [BIN_DIR] [SECTIONS]
# BIN_DIR holds mk-bench and mk_gemm_gpu_tests (default build-gemm-dev, then build-gemm/impl); SECTIONS is a
# comma list of tests,bench,sass,memcheck (default all). Logs and gemm.json go to $OUT (default
# ./gemm-suite-out). Runs on GPU 0 only (CUDA_VISIBLE_DEVICES=0 unless set). Exit: 0 all passed, 1 otherwise.
set -uo pipefail
BIN=${1:-}
SECTIONS=${2:-tests,bench,sass,memcheck}
if [[ -z "$BIN" ]]; then
  if [[ -x build-gemm-dev/mk-bench ]]; then BIN=build-gemm-dev; else BIN=build-gemm/impl; fi
fi
OUT=${OUT:-./gemm-suite-out}
mkdir -p "$OUT"
export CUDA_MODULE_LOADING=EAGER NCCL_NVLS_ENABLE=0
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# cuBLASLt for the baseline: torch's wheel when present.
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [[ -d "$d" ]] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
status=0
has() { [[ ",$SECTIONS," == *",$1,"* ]]; }
{
  echo "# gemm_suite: $(date -u) bin=$BIN sections=$SECTIONS"
  nvidia-smi -L 2>&1 | head -4
  ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/ 2>&1 | tr '\n' ' '; echo
  ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib 2>&1 | tr '\n' ' '; echo
} 2>&1 | tee "$OUT/env.log"

if has tests; then
  timeout 120 "$BIN/mk_gemm_gpu_tests" 2>&1 | tee "$OUT/tests.log" || status=1
fi
if has bench; then
  timeout 150 "$BIN/mk-bench" gemm --shapes reference --check --json "$OUT/gemm.json" 2>&1 | tee "$OUT/bench.log" || status=1
  # The fixed tile widths, for the tile-choice model (docs/gemm.md), and the "TN" layout.
  for w in 128 256; do
    timeout 60 "$BIN/mk-bench" gemm --shapes reference --tile-n $w --iters 10 --reps 3 \
      --json "$OUT/gemm_tile$w.json" 2>&1 | tee "$OUT/bench_tile$w.log" || status=1
  done
  timeout 60 "$BIN/mk-bench" gemm --shapes reference --layout-b col --check --iters 10 --reps 3 \
    --json "$OUT/gemm_col.json" 2>&1 | tee "$OUT/bench_col.log" || status=1
fi
if has sass; then
  {
    echo "# HGMMA instructions in mk-bench: $(cuobjdump -sass "$BIN/mk-bench" 2>/dev/null | grep -c HGMMA)"
    cuobjdump -sass "$BIN/mk-bench" 2>/dev/null | grep -E "Function : .*gemm" -A0
    cuobjdump -sass "$BIN/mk-bench" 2>/dev/null | grep -m4 HGMMA
    echo "# local-memory instructions (spills) in the GEMM kernels:"
    cuobjdump -sass "$BIN/mk-bench" 2>/dev/null | awk '/Function : .*gemm/{f=1} /Function : /&&!/gemm/{f=0} f' | grep -cE "LDL|STL"
    cuobjdump -res-usage "$BIN/mk-bench" 2>/dev/null | grep -A1 -i gemm
  } 2>&1 | tee "$OUT/sass.log"
fi
if has memcheck; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/mk_gemm_gpu_tests" \
    -tc="gemm: exact tiles*,gemm: bad input*,gemm: fewer CTAs*" 2>&1 | tail -40 | tee "$OUT/memcheck.log" || status=1
fi
echo "# gemm_suite: exit $status" | tee -a "$OUT/env.log"
exit $status
