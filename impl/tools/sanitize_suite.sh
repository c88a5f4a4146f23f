#!/usr/bin/env bash
# compute-sanitizer over the GPU tests that can be checked, one case per process
# under a time limit, with a summary line per case.
#
#   impl/tools/sanitize_suite.sh <build dir> <out dir> [seconds per case, default 120]
#
# GEMM (standalone kernel, GPU 0): memcheck and racecheck on the TMA-store, split-K and stream-K cases.
# Engine (resident kernel): memcheck, racecheck and synccheck on "multiprocess arena: ..." (the configuration
# memcheck can check: user buffers allocated before the kernel started, CommConfig::deviceArenaBytes, and the
# MemOps stream hand-off, because the sanitizer runs one kernel at a time), as one rank alone and as 2 rank
# processes each under its own sanitizer; and memcheck on the one-process, 2-GPU arena case. Every case runs
# with MK_LOG=debug (every op logged); one still running 10 s before its limit gets its host stacks dumped into its log.
# MK_SANITIZE_ENGINE_ONLY=1 skips the GEMM cases. Results: docs/gpu-engine.md, "compute-sanitizer".
# Exit 0 when every case passed, 1 otherwise, 77 (ctest's "skipped") with one line when compute-sanitizer is not
# installed (it comes with the CUDA toolkit: /usr/local/cuda/bin, or $CUDA_HOME/bin).
set -u
build=$1
R=$2
limit=${3:-120}
B=$build/impl
export CUDA_MODULE_LOADING=EAGER NCCL_NVLS_ENABLE=0
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib; do [[ -d $d ]] && export LD_LIBRARY_PATH=$d:${LD_LIBRARY_PATH:-}; done
# MK_COMPUTE_SANITIZER names the binary (the test of the missing case points it nowhere); else PATH, then the toolkit.
sanitizer=${MK_COMPUTE_SANITIZER:-}
if [[ -z $sanitizer ]]; then
  sanitizer=$(command -v compute-sanitizer)
  for d in "${CUDA_HOME:-/usr/local/cuda}/bin" /usr/local/cuda/bin; do
    [[ -z $sanitizer && -x $d/compute-sanitizer ]] && sanitizer=$d/compute-sanitizer
  done
fi
if [[ -z $sanitizer || ! -x $sanitizer ]]; then
  echo "sanitize_suite: SKIPPED: compute-sanitizer not found (${sanitizer:-not on PATH, nor in \$CUDA_HOME/bin or /usr/local/cuda/bin}): install the CUDA toolkit's compute-sanitizer" >&2
  exit 77
fi
mkdir -p "$R"
status=0
# A case that has not finished 10 s before its limit: print the host threads' stacks (gdb when present, else
# each thread's kernel wait channel) of the process under the sanitizer, then let the limit kill it.
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
stacks() {  # stacks <pid of the case's timeout> <log>
  local app
  for app in $(descendants "$1"); do
    [[ $(cat /proc/"$app"/comm 2> /dev/null) == mk_* ]] || continue
    echo "=== host stacks of pid $app (case still running $((limit - 10)) s in) ===" >> "$2"
    if command -v gdb > /dev/null; then
      timeout 20 gdb -p "$app" -batch -ex "thread apply all bt 12" >> "$2" 2>&1
    else
      for t in /proc/"$app"/task/*; do echo "$t $(cat "$t"/comm) $(cat "$t"/wchan)"; done >> "$2" 2>&1
    fi
  done
}
# Start one sanitizer process in the background (<tool> <log> <command...>); its pid in $!.
start() {
  local tool=$1 log=$2
  shift 2
  MK_LOG=debug timeout -k 5 "$limit" "$sanitizer" --tool "$tool" --error-exitcode 9 "$@" >> "$log" 2>&1 &
}
# Wait for the pids given, dumping stacks of those still running near the limit; the worst exit code in $rc.
finish() {  # finish <log> <pid>...
  local log=$1 t0=$SECONDS p c
  shift
  while (( SECONDS - t0 < limit - 10 )); do
    local alive=0
    for p in "$@"; do kill -0 "$p" 2> /dev/null && alive=1; done
    (( alive )) || break
    sleep 1
  done
  for p in "$@"; do kill -0 "$p" 2> /dev/null && stacks "$p" "$log"; done
  rc=0
  for p in "$@"; do
    wait "$p"
    c=$?
    (( c > rc )) && rc=$c
  done
}
verdict() {  # verdict <tool> <what> <seconds>
  local what=PASS
  [[ $rc -eq 124 || $rc -eq 137 ]] && what=TIMEOUT
  [[ $rc -eq 9 ]] && what=ERRORS
  [[ $rc -ne 0 && $what == PASS ]] && what="FAIL($rc)"
  [[ $what != PASS ]] && status=1
  printf '%-8s %5ss  %-9s %s\n' "$what" "$3" "$1" "$2" | tee -a "$R/summary.log"
}
run() {  # run <tool> <visible devices> <binary> <test-case filter>: one process
  local tool=$1 devs=$2 bin=$3 tc=$4 t0=$SECONDS
  CUDA_VISIBLE_DEVICES=$devs start "$tool" "$R/sanitizer-$tool.log" "$B/$bin" "-tc=$tc"
  finish "$R/sanitizer-$tool.log" $!
  verdict "$tool" "$bin: $tc" $((SECONDS - t0))
}
run_ranks() {  # run_ranks <tool> <ranks> <binary> <test-case filter>: one process per GPU, each under its own sanitizer
  local tool=$1 n=$2 bin=$3 tc=$4 t0=$SECONDS r pids=()
  local port=$((20000 + RANDOM % 20000)) key
  key=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')  # the job key of these ranks (docs/inter-node.md)
  for ((r = 0; r < n; ++r)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MK_JOB_KEY=$key \
      start "$tool" "$R/sanitizer-$tool-$n-ranks-rank$r.log" "$B/$bin" "-tc=$tc" --no-intro
    pids+=($!)
  done
  finish "$R/sanitizer-$tool-$n-ranks-rank0.log" "${pids[@]}"
  verdict "$tool" "$bin ($n rank process(es)): $tc" $((SECONDS - t0))
}
engine_only=0
[[ ${MK_SANITIZE_ENGINE_ONLY:-0} == 1 ]] && engine_only=1
if (( ! engine_only )); then
  for tool in memcheck racecheck; do
    run $tool 0 mk_gemm_gpu_tests "gemm tma-store: exact tiles and remainders*"
    run $tool 0 mk_gemm_gpu_tests "gemm split-K: the last piece*"
    run $tool 0 mk_gemm_gpu_tests "gemm stream-K: cut tiles*"
  done
  run synccheck 0 mk_gemm_gpu_tests "gemm stream-K: cut tiles*"
fi
arena="multiprocess arena: every collective with a device arena and premapped buffers"
run_ranks memcheck 1 mk_multiprocess_tests "$arena"
run_ranks memcheck 2 mk_multiprocess_tests "$arena"
run memcheck 0,1 mk_multigpu_tests "engine arena: with a preallocated device arena*"
for tool in racecheck synccheck; do
  run_ranks $tool 1 mk_multiprocess_tests "$arena"
  run_ranks $tool 2 mk_multiprocess_tests "$arena"
  run $tool 0,1 mk_multigpu_tests "engine arena: with a preallocated device arena*"
done
# The Auto hand-off must have chosen memory operations under the sanitizer (the multi-process case leaves it Auto).
if grep -q "stream hand-off: a 32-thread kernel" "$R"/sanitizer-*-ranks-rank*.log; then
  echo "FAIL     Auto stream hand-off chose the kernel under compute-sanitizer" | tee -a "$R/summary.log"
  status=1
fi
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY" "$R"/sanitizer-*.log | sort | uniq -c | tee -a "$R/summary.log"
exit $status
