#!/usr/bin/env bash
# mkernel — A/B of the GEMM engine's two epilogues (issue 6 follow-up), one call on the GPU machine.
# Builds nothing: runs the binaries of BIN_DIR.
#
#   impl/tools/gemm_ab.sh OUT_DIR [BIN_DIR] [SECTIONS]
#
# OUT_DIR receives every log and JSON file (created). BIN_DIR holds mk-bench and mk_gemm_gpu_tests (default
# build-dev/impl). SECTIONS: comma list (default tests,focus,skinny,table,memcheck,table2; worst case ~10 min,
# the first four ~7 min). Order (most important first, so a time limit cuts the least useful part):
#   tests:    mk_gemm_gpu_tests (all cases, the tma-store ones included)               -> tests.log
#   focus:    4096 x 4096 x 2048 on 132 and 116 CTAs, direct / tma-store alternating 3x -> focus.log, focus_*.json
#   skinny:   split-K on 512 x 8192 x 8192 (116 CTAs) and 128 x 8192 x 8192 (all SMs),
#             --split-k 1 / 2 / 3 alternating twice, --check                           -> skinny.log, skinny_*.json
#   table:    mk-bench gemm --shapes issue6 --check: direct, then tma-store            -> bench_{direct,tma}.log/json
#   memcheck: compute-sanitizer memcheck on the tma-store correctness cases            -> memcheck.log
#   table2:   the table without --check (10 x 3 launches): tma-store, then direct (reverse order)
# Every mk-bench record carries extra.epilogue = "direct" | "tma-store" (the variant that ran).
# GPU 0 only (CUDA_VISIBLE_DEVICES=0 unless set). Exit: 0 all passed, 1 a test or check failed, 2 bad usage.
set -uo pipefail
if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  [[ $# -lt 1 ]] && exit 2 || exit 0
fi
OUTDIR=$1
BIN=${2:-build-dev/impl}
SECTIONS=${3:-tests,focus,skinny,table,memcheck,table2}
has() { [[ ",$SECTIONS," == *",$1,"* ]]; }
for b in mk-bench mk_gemm_gpu_tests; do
  if [[ ! -x "$BIN/$b" ]]; then echo "gemm_ab.sh: $BIN/$b is missing or not executable" >&2; exit 2; fi
done
mkdir -p "$OUTDIR" || { echo "gemm_ab.sh: cannot create $OUTDIR" >&2; exit 2; }
export CUDA_MODULE_LOADING=EAGER NCCL_NVLS_ENABLE=0
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [[ -d "$d" ]] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
status=0
echo "# gemm_ab: $(date -u) bin=$BIN" | tee "$OUTDIR/env.log"
nvidia-smi -L 2>&1 | head -2 | tee -a "$OUTDIR/env.log"

# Correctness first: a variant that fails here makes its timings meaningless.
if has tests; then
  timeout 150 "$BIN/mk_gemm_gpu_tests" 2>&1 | tee "$OUTDIR/tests.log" || status=1
fi

# The target shape, alternating so that clock / neighbour drift hits both variants alike.
has focus && : > "$OUTDIR/focus.log"
has focus && for rep in 1 2 3; do
  for epi in direct tma-store; do
    for ctas in 0 116; do
      timeout 30 "$BIN/mk-bench" gemm -m 4096 -n 4096 -k 2048 --ctas $ctas --epilogue $epi --check \
        --json "$OUTDIR/focus_${epi}_${ctas}_$rep.json" 2>&1 | grep -v '^#' | tee -a "$OUTDIR/focus.log" || status=1
    done
  done
done

# Split-K on the shapes with too few tiles (tile width chosen per shape, direct epilogue).
has skinny && : > "$OUTDIR/skinny.log"
has skinny && for rep in 1 2; do
  for sk in 1 2 3; do
    timeout 30 "$BIN/mk-bench" gemm -m 512 -n 8192 -k 8192 --ctas 116 --split-k $sk --check \
      --json "$OUTDIR/skinny_512_116_sk${sk}_$rep.json" 2>&1 | grep -v '^#' | tee -a "$OUTDIR/skinny.log" || status=1
    timeout 30 "$BIN/mk-bench" gemm -m 128 -n 8192 -k 8192 --split-k $sk --check \
      --json "$OUTDIR/skinny_128_all_sk${sk}_$rep.json" 2>&1 | grep -v '^#' | tee -a "$OUTDIR/skinny.log" || status=1
  done
done

# The issue-6 table with --check, one pass per variant.
if has table; then
  timeout 150 "$BIN/mk-bench" gemm --shapes issue6 --check --epilogue direct --json "$OUTDIR/bench_direct.json" \
    2>&1 | tee "$OUTDIR/bench_direct.log" || status=1
  timeout 150 "$BIN/mk-bench" gemm --shapes issue6 --check --epilogue tma-store --json "$OUTDIR/bench_tma.json" \
    2>&1 | tee "$OUTDIR/bench_tma.log" || status=1
fi

# Out-of-bounds shared / global accesses of the staged epilogue (small cases only: memcheck is slow).
if has memcheck; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/mk_gemm_gpu_tests" \
    -tc="gemm tma-store: exact*,gemm tma-store: many*,gemm split-K: few*" 2>&1 | tail -30 | tee "$OUTDIR/memcheck.log" || status=1
fi

# A second, shorter pass in the reverse order.
if has table2; then
  timeout 60 "$BIN/mk-bench" gemm --shapes issue6 --iters 10 --reps 3 --epilogue tma-store \
    --json "$OUTDIR/bench_tma_2.json" 2>&1 | tee "$OUTDIR/bench_tma_2.log" || status=1
  timeout 60 "$BIN/mk-bench" gemm --shapes issue6 --iters 10 --reps 3 --epilogue direct \
    --json "$OUTDIR/bench_direct_2.json" 2>&1 | tee "$OUTDIR/bench_direct_2.log" || status=1
fi

echo "# gemm_ab: exit $status $(date -u)" | tee -a "$OUTDIR/env.log"
exit $status
