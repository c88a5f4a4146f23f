#!/usr/bin/env bash
# Scale benchmark of mk-sim (label perf; `ctest -L perf`): hierarchical all-reduce of 1 GiB on rail-optimised
# DGX-H100 clusters, wall time and peak memory (GNU time, the whole process tree) for the exact replay and
# --fast, then the targets: 1024 GPUs <= 5 s and <= 2 GB, 8192 GPUs <= 60 s.
# Usage: perf_scale.sh <mk-sim> <workdir>. MK_SIM_PERF_MAX_NODES (default 128) bounds the largest cluster tried:
# schedules grow quadratically with the node count (4096 GPUs: ~75 M steps), see docs/simulator.md.
set -u
tool=$1
work=$2
max_nodes=${MK_SIM_PERF_MAX_NODES:-128}
exact_max_nodes=${MK_SIM_PERF_EXACT_MAX_NODES:-128}
rm -rf "$work" && mkdir -p "$work"
[[ -x /usr/bin/time ]] || { echo "perf_scale: /usr/bin/time (GNU time) is needed"; exit 1; }

printf '%6s %6s %-6s %12s %10s %11s %12s %10s\n' GPUs nodes mode predicted wall_s peak_MiB steps comms
missed=0
for nodes in 8 32 128 512 1024; do
  ((nodes > max_nodes)) && { echo "# $((nodes * 8)) GPUs skipped (MK_SIM_PERF_MAX_NODES=$max_nodes)"; continue; }
  for mode in exact fast; do
    [[ $mode == exact ]] && ((nodes > exact_max_nodes)) && continue
    flags=(--op allreduce --algo hierarchical --cluster dgx-h100 --nodes "$nodes" --bytes 1G --verbose)
    [[ $mode == fast ]] && flags+=(--fast)
    log="$work/$nodes-$mode.log"
    /usr/bin/time -v "$tool" "${flags[@]}" >"$log" 2>&1
    rc=$?
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; print s}' "$log")
    rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$log")
    predicted=$(awk '/^predicted:/ {print $2 $3}' "$log")
    steps=$(awk '/^simulation:/ {print $2}' "$log")
    comms=$(awk '/^simulation:/ {print $4}' "$log")
    printf '%6d %6d %-6s %12s %10s %11s %12s %10s\n' $((nodes * 8)) "$nodes" "$mode" "${predicted:-rc=$rc}" \
      "$wall" "$rss" "${steps:-?}" "${comms:-?}"
    if [[ $mode == fast && $nodes -eq 128 ]]; then
      awk -v w="$wall" -v m="$rss" 'BEGIN { exit !(w <= 5 && m <= 2048) }' ||
        { echo "# MISSED: 1024 GPUs took ${wall} s and ${rss} MiB (target <= 5 s, <= 2048 MiB)"; missed=1; }
    fi
    if [[ $mode == fast && $nodes -eq 1024 ]]; then
      awk -v w="$wall" 'BEGIN { exit !(w <= 60) }' || { echo "# MISSED: 8192 GPUs took ${wall} s (target <= 60 s)"; missed=1; }
    fi
  done
done
exit $missed
