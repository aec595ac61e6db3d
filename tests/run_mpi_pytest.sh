#!/usr/bin/env bash
# Runs the Python suite under mpiexec at NP ranks: tests/run_mpi_pytest.sh NP [pytest args]
#
# - python -m mpi4py turns an uncaught exception on one rank into MPI_Abort, so a
#   crashed rank ends the job instead of leaving the others waiting;
# - the conftest's watchdog dumps the stacks, with the test's name, of a test that
#   takes over MT_TEST_TIMEOUT seconds and ends the job; the outer `timeout` ends
#   anything that still hangs;
# - rank 0 reports verbosely; the other ranks stay quiet, since the conftest sends
#   their failures to rank 0.
# MT_MPIEXEC replaces the launcher (tests/multinode/run.sh passes its simulated
# hosts' mpiexec) and MT_RUN_LABEL names where the run went in its report lines.
set -u
np=${1:?usage: run_mpi_pytest.sh NP [pytest args]}
shift
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
export MT_TEST_TIMEOUT=${MT_TEST_TIMEOUT:-120}
whole=${MT_RUN_TIMEOUT:-900}
launcher=${MT_MPIEXEC:-mpiexec}
where=${MT_RUN_LABEL:+ on $MT_RUN_LABEL}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0
# Every rank would otherwise compile mpitensor and rewrite the suite's asserts again
# where bytecode is not written (PYTHONDONTWRITEBYTECODE): keep both in build/.
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-$here/build/pycache}
unset PYTHONDONTWRITEBYTECODE
# Test paths among the arguments replace the default of the whole suite.
paths=("$here/tests/python")
for a in "$@"; do
  case "$a" in -*) ;; *.py|*.py::*|*/*) paths=(); break ;; esac
done
common=(-m mpi4py -m pytest "${paths[@]}" -p no:cacheprovider -p no:timeout)
# The other ranks run without pytest's terminal plugin, which owns the verbosity and
# report options: they take the remaining arguments only.
quiet=()
for a in "$@"; do
  case "$a" in -q|-qq|-v|-vv|--quiet|--verbose|-r*) ;; *) quiet+=("$a") ;; esac
done
echo "=== pytest at np=$np$where"
cmd=("$launcher" --oversubscribe -n 1 "$py" "${common[@]}" -v -rfE "$@")
if [ "$np" -gt 1 ]; then
  cmd+=(: -n $((np - 1)) "$py" "${common[@]}" "${quiet[@]}" -p no:terminal)
fi
run() {
  local start=$SECONDS
  timeout -k 20 "$whole" "${cmd[@]}"
  local rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "=== np=$np: the run took over ${whole}s and was killed: the last test rank 0 started above hung, or the machine is too loaded for this budget (MT_RUN_TIMEOUT)"
  fi
  [ $rc -eq 0 ] || echo "=== np=$np: FAILED (exit $rc)"
  echo "=== np=$np: $((SECONDS - start))s"
  return $rc
}
source "$here/tests/record_failures.sh"
record_failures "pytest at np=$np$where" run
