#!/usr/bin/env bash
# Start N rank processes of one command on this machine the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR=127.0.0.1, MASTER_PORT; and MK_JOB_KEY, the caller's or a fresh one), wait for all of them, and exit
# with the first failure's status. A rank that fails gets the others killed after a grace period, so a broken run
# never hangs the caller.
#
#   impl/tools/launch_ranks.sh [--mps] [--logs DIR] [--grace S] N command [args...]
#
# LOCAL_RANK = rank % (visible GPUs): with more ranks than GPUs, ranks share GPUs (give the command --share-gpus;
# mk-bench and the tests take it). --mps starts the CUDA MPS control daemon for the run (several processes' resident
# kernels then run at once on one GPU) and stops it afterwards; without MPS, kernels of different processes
# time-slice and resident kernels cannot meet. Rank 0 prints to this terminal; rank i writes DIR/rank<i>.log (DIR:
# a fresh temporary folder unless --logs), whose tail is printed when that rank fails.
#
# No orphans: SIGINT / SIGTERM / SIGHUP to the launcher stop every rank (SIGTERM, then SIGKILL after 2 s) and the MPS
# daemon it started, and the ranks get SIGKILL from the kernel should the launcher itself be killed (setpriv
# --pdeathsig, where util-linux has it).
set -u
mps=0
logs=""
grace=10
while [[ $# -gt 0 ]]; do
  case $1 in
    --mps) mps=1; shift ;;
    --logs) logs=$2; shift 2 ;;
    --grace) grace=$2; shift 2 ;;
    *) break ;;
  esac
done
if [[ $# -lt 2 || ! $1 =~ ^[0-9]+$ || $1 -lt 1 ]]; then
  echo "usage: launch_ranks.sh [--mps] [--logs DIR] [--grace S] N command [args...]" >&2
  exit 2
fi
n=$1
shift
[[ -z $logs ]] && logs=$(mktemp -d /tmp/mk-ranks.XXXXXX)
mkdir -p "$logs" || { echo "launch_ranks: cannot create $logs" >&2; exit 2; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[[ $gpus -ge 1 ]] || gpus=1
mpsctl=""
if [[ $mps -eq 1 ]]; then
  for c in /usr/local/nvidia/bin/nvidia-cuda-mps-control "$(command -v nvidia-cuda-mps-control 2>/dev/null)"; do
    [[ -n $c && -x $c ]] && { mpsctl=$c; break; }
  done
  [[ -n $mpsctl ]] || { echo "launch_ranks: --mps: nvidia-cuda-mps-control not found" >&2; exit 2; }
  export CUDA_MPS_PIPE_DIRECTORY=$logs/mps-pipe CUDA_MPS_LOG_DIRECTORY=$logs/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  "$mpsctl" -d || { echo "launch_ranks: the MPS daemon did not start" >&2; exit 2; }
fi
stop_mps() { [[ -n $mpsctl ]] && echo quit | "$mpsctl" >/dev/null 2>&1; }
pids=()
on_signal() {
  local sig=$1
  echo "launch_ranks: $sig: stopping the ranks" >&2
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 20); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  stop_mps
  case $sig in INT) exit 130 ;; HUP) exit 129 ;; *) exit 143 ;; esac
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP
deathsig=()
if setpriv --help 2>/dev/null | grep -q -- --pdeathsig; then deathsig=(setpriv --pdeathsig KILL --); fi
port=$((20000 + RANDOM % 20000))
# The job key every rank proves it holds at the rendezvous (docs/inter-node.md, "Who may join a job"): the caller's,
# else a fresh one for this run, handed to the ranks only (the environment is readable by this user alone).
if [[ -z ${MK_JOB_KEY:-} && -z ${MK_JOB_KEY_FILE:-} ]]; then
  MK_JOB_KEY=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  export MK_JOB_KEY
fi
for ((r = 0; r < n; ++r)); do
  if [[ $r -eq 0 ]]; then
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % gpus)) MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${deathsig[@]}" "$@" &
  else
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % gpus)) MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "${deathsig[@]}" "$@" \
      >"$logs/rank$r.log" 2>&1 &
  fi
  pids+=($!)
done
status=0
left=$n
declare -A finished=()
while [[ $left -gt 0 ]]; do
  for ((r = 0; r < n; ++r)); do
    [[ -n ${finished[$r]:-} ]] && continue
    if ! kill -0 "${pids[$r]}" 2>/dev/null; then
      wait "${pids[$r]}"
      rc=$?
      finished[$r]=1
      left=$((left - 1))
      if [[ $rc -ne 0 && $status -eq 0 ]]; then
        status=$rc
        echo "launch_ranks: rank $r exited with status $rc" >&2
        [[ $r -gt 0 ]] && tail -20 "$logs/rank$r.log" >&2
        # The others get a grace period to report their own view, then are killed.
        (sleep "$grace"; for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done) &
      fi
    fi
  done
  sleep 0.05
done
stop_mps
exit $status
