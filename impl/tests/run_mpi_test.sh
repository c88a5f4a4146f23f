#!/usr/bin/env bash
# Runs one collective test case of mk_mpi_bootstrap_tests on N ranks under mpirun (Open MPI). Passes only when
# mpirun exits 0 AND every rank reports that exactly this one test case ran and passed (a filter that
# matches nothing must not pass). Exits 77 (CTest: skipped) when no mpirun is found, or when every rank of a
# GPU test binary skipped for lack of GPUs.
# Usage: run_mpi_test.sh <mpiexec or empty> <ranks> <test binary> <test case name>
set -uo pipefail
if (($# != 4)); then
  echo "usage: run_mpi_test.sh <mpiexec> <ranks> <test binary> <test case name>" >&2
  exit 2
fi
mpiexec=$1 np=$2 bin=$3 tc=$4
if [[ -z $mpiexec || $mpiexec == *NOTFOUND || ! -x $mpiexec ]]; then
  mpiexec=$(command -v mpirun || true)
fi
if [[ -z $mpiexec ]]; then
  echo "run_mpi_test: mpirun not found (apt-get install openmpi-bin): skipped"
  exit 77
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The MPI bootstrap is chosen only without MASTER_ADDR; torchrun-style variables must not leak in either.
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK
# CI runs as root (--allow-run-as-root); 3 ranks on a 2-core runner (--oversubscribe); containers often forbid
# the cross-memory-attach single copy (ptrace scope), hence the plain shared-memory copy.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# Every test job runs on this one node: the "isolated" launcher starts the ranks without the ssh/rsh agent
# Open MPI 4 otherwise insists on finding (absent from many containers and from the GPU machines here).
export OMPI_MCA_plm=${OMPI_MCA_plm:-isolated}
# PMIx 4.2 (Debian 12) picks its "compress" preg component, whose generate_ppn crashes orterun (seen on the
# 2 x H200 machine, Ubuntu 24.04 host with the Debian packages unpacked: segfault in
# pmix_preg_base_generate_ppn); the "native" component does the same job.
export PMIX_MCA_preg=${PMIX_MCA_preg:-native}
timeout 100 "$mpiexec" -np "$np" --oversubscribe --allow-run-as-root "$bin" --no-colors=true --test-case="$tc" >"$out" 2>&1
rc=$?
cat "$out"
passed=$(grep -cE 'test cases: +1 \| +1 passed \| +0 failed' "$out")
# A GPU test binary (gpu_test_main.cpp) prints "SKIP: ..." and exits 77 on a machine with too few GPUs:
# skipped only when every rank says so, never passed.
skipped=$(grep -cE '^SKIP: ' "$out")
if ((skipped == np)); then
  echo "run_mpi_test: every rank skipped '$tc' (not enough GPUs)"
  exit 77
fi
if ((rc != 0)); then
  echo "run_mpi_test: mpirun exited $rc (124: no answer within 100 s)"
  exit 1
fi
if ((passed != np)); then
  echo "run_mpi_test: $passed of $np ranks report '$tc' as the one test case run and passed"
  exit 1
fi
echo "run_mpi_test: '$tc' passed on $np ranks"
