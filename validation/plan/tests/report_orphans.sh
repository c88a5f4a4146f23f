#!/usr/bin/env bash
# A killed mk-plan leaves nothing running and, after its next run, nothing behind: the report script that
# --report runs dies with it (PR_SET_PDEATHSIG, also on SIGKILL, where no handler runs), and the next run removes
# the temporary report folder it left, but never the folder of a run that is still alive.
# Usage: report_orphans.sh <mk-plan> <workdir>
set -u
tool=$1
work=$2
rm -rf "$work" && mkdir -p "$work/measured"
# shellcheck source=../../../cmake/cli_testlib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../cmake/cli_testlib.sh"

here=$(dirname "${BASH_SOURCE[0]}")
cp "$here/data/tiny-workload.json" "$work/tiny.json"
cp "$here/../../data/measured/2026-11-30-h200x2-5400cad-allreduce-w128.json" "$work/measured/"
run=("$tool" --workload "$work/tiny.json" --cluster dgx-h200 --gpus 8:16 -q --measured "$work/measured"
  --cache "$work/cache" --python /usr/bin/python3 --report "$work/rep")

# Report scripts: one says it started (its pid) and then waits to be killed; one writes a report at once.
cat >"$work/slow.py" <<EOF
import os, time
with open("$work/script.pid.tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename("$work/script.pid.tmp", "$work/script.pid")
time.sleep(120)
EOF
cat >"$work/fast.py" <<'EOF'
import sys
with open(sys.argv[sys.argv.index("--out") + 1] + "/index.html", "w") as f:
    f.write("<html></html>\n")
EOF

# alive <pid>: the process exists and is not a zombie waiting to be reaped
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}
gone() { ! alive "$1"; }
# wait_for <tenths of a second> <command...>: poll until the command succeeds; false when the time ran out
wait_for() {
  local n=$1
  shift
  for _ in $(seq 1 "$n"); do
    "$@" && return 0
    sleep 0.1
  done
  "$@"
}
temps() { compgen -G "$work/.rep.tmp-*"; }

# A run whose report script is running: its temporary report folder exists.
"${run[@]}" --report-script "$work/slow.py" >"$work/slow.log" 2>&1 &
parent=$!
check "mk-plan started the report script within 60 s" wait_for 600 test -s "$work/script.pid"
script=$(cat "$work/script.pid" 2>/dev/null)
stale=$(temps)
check "the running report has its temporary folder (${stale:-none})" test -n "$stale"

# Another run meanwhile leaves that folder alone: its owner lives.
expect 0 '' -- "${run[@]}" --report-script "$work/fast.py"
check "a concurrent run kept the live run's folder" test -d "$stale"
check "the concurrent run wrote its report" test -s "$work/rep/index.html"

# kill -9: no handler runs, the script dies with mk-plan, the folder stays behind.
{
  kill -KILL "$parent"
  wait "$parent"
} 2>/dev/null  # without bash's "Killed" line
if [[ -n $script ]]; then
  if wait_for 50 gone "$script"; then
    passes=$((passes + 1))
  else
    check "the report script $script outlived its killed mk-plan" false
    kill -KILL "$script"
  fi
fi
check "the killed run left its temporary folder" test -d "$stale"

# The next run removes it.
expect 0 '' -- "${run[@]}" --report-script "$work/fast.py"
check "the next run removed the killed run's folder (left: $(temps))" bash -c "! compgen -G '$work/.rep.*' >/dev/null"
check "the next run wrote its report" test -s "$work/rep/index.html"
cli_summary
