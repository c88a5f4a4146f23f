#!/usr/bin/env bash
# mkernel — A/B of the GEMM engine's two epilogues, one call on the GPU machine.
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
#   table:    mk-bench gemm --shapes reference --check: direct, then tma-store            -> bench_{direct,tma}.log/json
#   memcheck: compute-sanitizer memcheck on the tma-store correctness cases            -> memcheck.log
#   table2:   the table without --check (10 x 3 launches): tma-store, then direct (reverse order)
# Not in the default (ask for them; "streamk,sanitize-sk" takes ~3-4 min):
#   streamk:  the stream-K GPU cases, then 512 x 8192 x 8192 on 116 CTAs --schedule tiles / stream-k alternating
#             3x, then 4096 x 4096 x 2048 and 1024 x 8192 x 14336 on 116 CTAs and 128 x 8192 x 8192 on all SMs,
#             tiles / stream-k, all --check                                          -> streamk.log, streamk_*.json
#   sanitize-sk: compute-sanitizer memcheck and racecheck on the stream-K remainder case -> sanitize_sk.log
# Every mk-bench record carries extra.epilogue = "direct" | "tma-store" and extra.schedule (what ran).
# GPU 0 only (CUDA_VISIBLE_DEVICES=0 unless set). Exit: 0 all passed, 1 a test or check failed, 2 bad usage.
set -uo pipefail
if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
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

# The reference table (--shapes reference) with --check, one pass per variant.
if has table; then
  timeout 150 "$BIN/mk-bench" gemm --shapes reference --check --epilogue direct --json "$OUTDIR/bench_direct.json" \
    2>&1 | tee "$OUTDIR/bench_direct.log" || status=1
  timeout 150 "$BIN/mk-bench" gemm --shapes reference --check --epilogue tma-store --json "$OUTDIR/bench_tma.json" \
    2>&1 | tee "$OUTDIR/bench_tma.log" || status=1
fi

# Out-of-bounds shared / global accesses of the staged epilogue (small cases only: memcheck is slow).
if has memcheck; then
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/mk_gemm_gpu_tests" \
    -tc="gemm tma-store: exact*,gemm tma-store: many*,gemm split-K: few*" 2>&1 | tail -30 | tee "$OUTDIR/memcheck.log" || status=1
fi

# A second, shorter pass in the reverse order.
if has table2; then
  timeout 60 "$BIN/mk-bench" gemm --shapes reference --iters 10 --reps 3 --epilogue tma-store \
    --json "$OUTDIR/bench_tma_2.json" 2>&1 | tee "$OUTDIR/bench_tma_2.log" || status=1
  timeout 60 "$BIN/mk-bench" gemm --shapes reference --iters 10 --reps 3 --epilogue direct \
    --json "$OUTDIR/bench_direct_2.json" 2>&1 | tee "$OUTDIR/bench_direct_2.log" || status=1
fi

# Stream-K (docs/gemm.md, "Stream-K"): correctness first, then the A/B against whole tiles.
if has streamk; then
  timeout 120 "$BIN/mk_gemm_gpu_tests" -tc="gemm stream-K*" 2>&1 | tee "$OUTDIR/streamk.log" || status=1
  for rep in 1 2 3; do
    for sched in tiles stream-k; do
      timeout 30 "$BIN/mk-bench" gemm -m 512 -n 8192 -k 8192 --ctas 116 --schedule $sched --check \
        --json "$OUTDIR/streamk_512_116_${sched}_$rep.json" 2>&1 | grep -v '^#' | tee -a "$OUTDIR/streamk.log" || status=1
    done
  done
  for shape in "4096 4096 2048 116" "1024 8192 14336 116" "128 8192 8192 0"; do
    read -r m n k ctas <<< "$shape"
    for sched in tiles stream-k; do
      timeout 30 "$BIN/mk-bench" gemm -m "$m" -n "$n" -k "$k" --ctas "$ctas" --schedule $sched --check \
        --json "$OUTDIR/streamk_${m}x${n}x${k}_${ctas}_${sched}.json" 2>&1 | grep -v '^#' | tee -a "$OUTDIR/streamk.log" \
        || status=1
    done
  done
fi
if has sanitize-sk; then
  : > "$OUTDIR/sanitize_sk.log"
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/mk_gemm_gpu_tests" \
      -tc="gemm stream-K: cut tiles*" 2>&1 | tail -20 | tee -a "$OUTDIR/sanitize_sk.log" || status=1
  done
fi

echo "# gemm_ab: exit $status $(date -u)" | tee -a "$OUTDIR/env.log"
exit $status
