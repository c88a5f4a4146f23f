#!/usr/bin/env bash
# Run every test case of the GPU test binaries in its own process under a time limit, so a hang costs one
# case rather than the suite; print one line per case and a summary. CTest files hold absolute build
# paths, so on a machine the build folder was copied to this is the way to run the GPU suite.
#   impl/tools/gpu_suite.sh <build dir> <log file> [seconds per case] [binary ...] [-- doctest filters]
# MK_SUITE_MAX_FAILURES (default 8): stop early after that many failures (a broken build should not eat
# a whole device lease).
set -u
maxFail=${MK_SUITE_MAX_FAILURES:-8}
build=$1
log=$2
limit=${3:-120}
shift 3 || true
bins=()
while [[ $# -gt 0 && $1 != "--" ]]; do bins+=("$1"); shift; done
[[ ${1:-} == "--" ]] && shift
[[ ${#bins[@]} -eq 0 ]] && bins=(mk_gpu_tests mk_multigpu_tests mk_multiprocess_tests)
: > "$log"
pass=0
fail=0
failed=()
for bin in "${bins[@]}"; do
  exe=$build/impl/$bin
  if [[ ! -x $exe ]]; then echo "gpu suite: $exe is missing (not built?)" | tee -a "$log"; fail=$((fail + 1)); failed+=("$bin: missing"); continue; fi
  mapfile -t names < <("$exe" -ltc "$@" 2>/dev/null | awk '/^=+$/{inside=!inside; next} inside')
  for name in "${names[@]}"; do
    [[ -z $name ]] && continue
    t0=$(date +%s.%N)
    # doctest splits a filter at ',': escaped, a name that holds one selects its own case.
    out=$(timeout -k 5 "$limit" "$exe" "-tc=${name//,/\\,}" 2>&1)
    rc=$?
    # A filter that matched nothing "passes" having run nothing: that is a failure here.
    [[ $rc -eq 0 ]] && ! grep -qE 'test cases: +[1-9]' <<<"$out" && rc=3
    t1=$(date +%s.%N)
    dur=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
    if [[ $rc -eq 0 ]]; then
      status=PASS
      pass=$((pass + 1))
    else
      [[ $rc -eq 124 || $rc -eq 137 ]] && status=TIMEOUT || status="FAIL($rc)"
      fail=$((fail + 1))
      failed+=("$bin: $name")
    fi
    printf '%-8s %6ss  %s: %s\n' "$status" "$dur" "$bin" "$name" | tee -a "$log"
    # What the case reported (doctest MESSAGE lines: timings, counts) goes to the log, passed or not.
    grep -E 'MESSAGE:' <<<"$out" | sed 's/^/    /' >> "$log"
    if [[ $status != PASS ]]; then
      printf '%s\n' "$out" | tail -60 >> "$log"
      if [[ $fail -ge $maxFail ]]; then
        echo "gpu suite: stopping after $fail failures" | tee -a "$log"
        break 2
      fi
    fi
  done
done
echo "gpu suite: $pass passed, $fail failed" | tee -a "$log"
for f in "${failed[@]}"; do echo "  failed: $f" | tee -a "$log"; done
[[ $fail -eq 0 ]]
