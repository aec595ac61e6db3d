"""A rank that leaves early ends the job within seconds, saying which and why.

`sys.exit(0)` on one rank, under plain `python` or `python -m mpi4py`, or an
uncaught exception on one rank of a plain `python script.py`, left the other ranks
waiting in their next collective until the 1,800 s watchdog. Now the leaving rank
tells the others (csrc/comm/departure.c) and a rank waiting in a collective aborts
the job, naming the rank and the reason. A job whose ranks all end normally,
also when one ends seconds after the others, and a script run as one plain
process, are unaffected.

Each test starts its own job with mpiexec, from the np=1 run only (as
test_failing_ranks.py): a job started from inside a multi-rank job would share its
ranks' cores and Open MPI environment.
"""

import sys
import time
from pathlib import Path

import pytest

from mpi_helpers import run_job

pytestmark = pytest.mark.np(1)

# Seconds before a job is killed with all its ranks, failing the test: the hang
# this replaces lasted 1,800; below the suite's per-test timeout.
DEADLINE = 60
SOON = 30      # what "within seconds" allows on a loaded machine

SCRIPT = """
import sys, time
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Replicate, Shard

mode = sys.argv[1]
rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
mesh = mt.init_device_mesh("cpu", (size,))
x = mt.distribute_tensor(np.arange(48.0).reshape(6, 8), mesh, [Shard(0)])
if rank == 1 and mode == "exit":
    sys.exit(0)
if rank == 1 and mode == "raise":
    raise ValueError("rank 1 failed on purpose")
if mode == "mpi_fails":
    # A 64 MiB all-reduce whose rank-1 part fails inside MPI: rank 1's address
    # space is capped so that its output fits and MPI's own buffers do not.
    sys.path.insert(0, sys.argv[2])
    from memory_cap import capped
    big = mt.DTensor.from_local(np.ones((2**13, 2**10)), mesh, [mt.Partial()],
                                run_check=False)
    if rank == 1:
        with capped(2**26 + 2**23):
            try:
                big.redistribute(mesh, [Replicate()])
            except RuntimeError as e:
                print("rank 1 goes on after:", e, flush=True)
        time.sleep(45)
    else:
        big.redistribute(mesh, [Replicate()])
y = x.redistribute(mesh, [Replicate()])
if mode == "slow_end" and rank == 0:
    time.sleep(4)  # local work after the last collective, the others gone
print("job finished on rank", rank, float(y.to_local().sum()), flush=True)
"""


def run(tmp_path, mode, ranks, *python_args, mpiexec=True):
    """(exit code, stdout and stderr, seconds) of SCRIPT in ``mode`` on ``ranks``
    ranks (one plain process without ``mpiexec``), run as a job: killed whole,
    failing the test, after DEADLINE."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, *python_args, str(script), mode, str(Path(__file__).parent)]
    if mpiexec:
        cmd = ["mpiexec", "--oversubscribe", "-n", str(ranks)] + cmd
    started = time.monotonic()
    proc = run_job(cmd, DEADLINE)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


@pytest.mark.timeout(2 * DEADLINE)
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("mode, runner, why", [
    ("exit", (), "its Python exited"),
    ("exit", ("-m", "mpi4py"), "its Python exited"),
    ("raise", (), "it raised ValueError: rank 1 failed on purpose"),
], ids=["sys_exit", "sys_exit_under_mpi4py", "uncaught_exception"])
def test_a_rank_that_leaves_ends_the_job_naming_it(tmp_path, ranks, mode, runner, why):
    code, out, seconds = run(tmp_path, mode, ranks, *runner)
    assert code != 0, f"exit {code} after {seconds:.0f}s:\n{out[-3000:]}"
    assert seconds < SOON, f"{seconds:.0f}s:\n{out[-3000:]}"
    assert "and rank 1 has left the job: " + why in out, out[-3000:]
    assert "job finished" not in out, out[-3000:]


@pytest.mark.timeout(2 * DEADLINE)
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("mode", ["normal", "slow_end"])
def test_ranks_that_end_normally_are_not_aborted(tmp_path, ranks, mode):
    code, out, seconds = run(tmp_path, mode, ranks)
    assert code == 0, f"exit {code} after {seconds:.0f}s:\n{out[-3000:]}"
    assert out.count("job finished") == ranks and "has left" not in out, out[-3000:]


@pytest.mark.timeout(2 * DEADLINE)
def test_a_script_run_as_one_plain_process_is_unaffected(tmp_path):
    code, out, seconds = run(tmp_path, "normal", 1, mpiexec=False)
    assert code == 0 and out.count("job finished") == 1, f"exit {code}:\n{out[-3000:]}"


@pytest.mark.timeout(2 * DEADLINE)
@pytest.mark.parametrize("ranks", [2, 3])
def test_an_mpi_call_failing_on_one_rank_ends_the_job_naming_it(tmp_path, ranks):
    """An MPI call of the library that fails on one rank (here MPI's own buffers of
    an all-reduce, out of memory) raises there, and the program may go on; the
    others, left in the collective, abort the job within seconds naming that rank
    and the call, instead of waiting for the watchdog's timeout."""
    code, out, seconds = run(tmp_path, "mpi_fails", ranks)
    assert "rank 1 goes on after: MPI_" in out, out[-3000:]
    assert code != 0, f"exit {code} after {seconds:.0f}s:\n{out[-3000:]}"
    assert seconds < SOON, f"{seconds:.0f}s:\n{out[-3000:]}"
    assert "and rank 1 failed: MPI_" in out, out[-3000:]
    assert "job finished" not in out, out[-3000:]
