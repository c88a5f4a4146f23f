#!/usr/bin/env bash
# A killed mk-sim leaves nothing running: its forked simulation child (sim/src/isolated.cpp) dies with it.
# Starts a long simulation, waits for the child, kills the parent with SIGKILL (no handler can clean up) and
# checks the child is gone within a few seconds.  Usage: no_orphans.sh <mk-sim>
set -u
tool=$1
# shellcheck source=../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../cmake/cli_testlib.sh"

# alive <pid>: the process exists and is not a zombie waiting for its (new) parent to reap it
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

# A run that takes well over 3 s without --fast (the child exists for most of it).
"$tool" --nodes 256 --algo hierarchical --bytes 1G >/dev/null 2>&1 &
parent=$!
child=
for _ in $(seq 1 200); do  # up to 20 s for the fork
  child=$(cat /proc/"$parent"/task/*/children 2>/dev/null | tr -s ' ' '\n' | grep -m1 .)
  [[ -n $child ]] && break
  alive "$parent" || break
  sleep 0.1
done
check "mk-sim forked a simulation child while still running (the run is long enough to test)" test -n "$child"
if [[ -n $child ]]; then
  sleep 1
  check "the simulation child $child is still running before the kill" alive "$child"
  kill -KILL "$parent"
  wait "$parent" 2>/dev/null
  for _ in $(seq 1 50); do  # up to 5 s
    alive "$child" || break
    sleep 0.1
  done
  if alive "$child"; then
    check "the simulation child $child outlived its killed parent" false
    kill -KILL "$child"
  else
    passes=$((passes + 1))
  fi
else
  kill -KILL "$parent" 2>/dev/null
  wait "$parent" 2>/dev/null
fi
cli_summary
