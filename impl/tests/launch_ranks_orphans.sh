#!/usr/bin/env bash
# impl/tools/launch_ranks.sh leaves no rank behind: SIGTERM and SIGINT to the launcher stop its ranks (its trap), and
# so does SIGKILL, which no trap sees (the ranks' parent-death signal). Each rank is a `sleep` renamed to a unique
# tag, so only this test's processes are counted.
set -u
launcher=$1
tag="mk-orphan-$$-$RANDOM"
count() { pgrep -fc "^$tag" || true; }
for sig in TERM INT KILL; do
  # A background job of a script starts with SIGINT ignored, and bash cannot trap a signal ignored at its entry:
  # env --default-signal gives the launcher the disposition it has when started from a terminal.
  env --default-signal=INT setsid "$launcher" --grace 1 2 bash -c "exec -a $tag sleep 300" >/dev/null 2>&1 &
  lp=$!
  for _ in $(seq 100); do [[ $(count) -ge 2 ]] && break; sleep 0.05; done
  if [[ $(count) -ne 2 ]]; then
    echo "SIG$sig: the 2 ranks did not start ($(count) running)"
    pkill -9 -f "^$tag"
    exit 1
  fi
  kill -s "$sig" "$lp"
  for _ in $(seq 100); do kill -0 "$lp" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$lp" 2>/dev/null; then
    echo "SIG$sig: the launcher is still running 5 s later"
    kill -9 "$lp"
    pkill -9 -f "^$tag"
    exit 1
  fi
  wait "$lp" 2>/dev/null
  for _ in $(seq 100); do [[ $(count) -eq 0 ]] && break; sleep 0.05; done
  left=$(count)
  if [[ $left -ne 0 ]]; then
    echo "SIG$sig to the launcher: $left rank(s) left running"
    pkill -9 -f "^$tag"
    exit 1
  fi
  echo "SIG$sig to the launcher: no rank left"
done
