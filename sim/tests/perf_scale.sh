#!/usr/bin/env bash
# Scale benchmark of mk-sim (label perf; `ctest -L perf`): hierarchical all-reduce of 512 MiB bfloat16 on
# rail-optimised DGX-H100 clusters, wall time and peak memory (GNU time, the whole process tree) of the exact
# replay and --fast. Rows "auto" run the default options (chunks and channels by size and node count, inter-node
# phase auto: docs/results.md "Scaling of the hierarchical all-reduce"), and the targets are checked on
# them: 1024 GPUs (exact replay) <= 5 s and <= 2 GB, 8192 GPUs (fast) <= 60 s. Rows "ring" (--inter ring
# --chunks 1: 2(M-1) steps per chunk) stay for comparison with the runs before.
# Usage: perf_scale.sh <mk-sim> <workdir>. Bounds (largest node count tried, default in brackets):
#   MK_SIM_PERF_MAX_NODES [1024]        every row
#   MK_SIM_PERF_EXACT_MAX_NODES [128]   exact replay (transfers timed and proven uncontended, or a second pass
#                                       that simulates them: docs/simulator.md "Exact mode: transfers timed,
#                                       then proven")
#   MK_SIM_PERF_RING_MAX_NODES [128]    ring rows: O(M^2) steps (4096 GPUs: 158 s, 8192: 756 s, docs/simulator.md)
#   MK_SIM_PERF_REPEAT [1]              runs per row; the median wall time is reported (the machine is shared)
set -u
tool=$1
work=$2
max_nodes=${MK_SIM_PERF_MAX_NODES:-1024}
exact_max_nodes=${MK_SIM_PERF_EXACT_MAX_NODES:-128}
ring_max_nodes=${MK_SIM_PERF_RING_MAX_NODES:-128}
repeat=${MK_SIM_PERF_REPEAT:-1}
rm -rf "$work" && mkdir -p "$work"
[[ -x /usr/bin/time ]] || { echo "perf_scale: /usr/bin/time (GNU time) is needed"; exit 1; }

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

printf '%6s %6s %-5s %-6s %12s %10s %11s %12s %10s\n' GPUs nodes inter mode predicted wall_s peak_MiB steps comms
missed=0
for nodes in 8 32 128 512 1024; do
  ((nodes > max_nodes)) && { echo "# $((nodes * 8)) GPUs skipped (MK_SIM_PERF_MAX_NODES=$max_nodes)"; continue; }
  for inter in auto ring; do
    [[ $inter == ring ]] && ((nodes > ring_max_nodes)) && continue
    for mode in exact fast; do
      [[ $mode == exact ]] && ((nodes > exact_max_nodes)) && continue
      flags=(--op allreduce --algo hierarchical --cluster dgx-h100 --nodes "$nodes" --bytes 512MiB --dtype bfloat16 --verbose)
      [[ $inter == ring ]] && flags+=(--inter ring --chunks 1)
      [[ $mode == fast ]] && flags+=(--fast)
      walls=() rss=0 rc=0
      for ((i = 0; i < repeat; ++i)); do
        log="$work/$nodes-$inter-$mode-$i.log"
        /usr/bin/time -v "$tool" "${flags[@]}" >"$log" 2>&1
        rc=$?
        walls+=("$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, t, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + t[i]; print s}' "$log")")
        r=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$log")
        ((r > rss)) && rss=$r
      done
      wall=$(printf '%s\n' "${walls[@]}" | median)
      predicted=$(awk '/^predicted:/ {print $2 $3}' "$log")
      steps=$(awk '/^simulation:/ {print $2}' "$log")
      comms=$(awk '/^simulation:/ {print $4}' "$log")
      printf '%6d %6d %-5s %-6s %12s %10s %11s %12s %10s\n' $((nodes * 8)) "$nodes" "$inter" "$mode" \
        "${predicted:-rc=$rc}" "$wall" "$rss" "${steps:-?}" "${comms:-?}"
      [[ $inter == auto ]] || continue
      if [[ $mode == exact && $nodes -eq 128 ]]; then
        awk -v w="$wall" -v m="$rss" 'BEGIN { exit !(w <= 5 && m <= 2048) }' ||
          { echo "# MISSED: 1024 GPUs took ${wall} s and ${rss} MiB (target <= 5 s, <= 2048 MiB)"; missed=1; }
      fi
      if [[ $mode == fast && $nodes -eq 1024 ]]; then
        awk -v w="$wall" 'BEGIN { exit !(w <= 60) }' || { echo "# MISSED: 8192 GPUs took ${wall} s (target <= 60 s)"; missed=1; }
      fi
    done
  done
done
exit $missed
