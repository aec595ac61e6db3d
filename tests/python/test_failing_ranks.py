"""A failing rank ends the whole job instead of leaving the others waiting.

Each test starts its own 3-rank job with mpiexec, as a user would, and checks how
it ends: an uncaught exception on one rank under `python -m mpi4py` (the pattern
the README recommends) aborts the job with that rank's traceback; a rank killed by
a signal in the middle of redistributes ends the job with a non-zero exit. Both
within a timeout far below the hang it would otherwise be.

The jobs are launched from the np=1 run only: a job started from inside a
multi-rank job would share its ranks' cores and Open MPI environment.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpi_helpers import finish_job, fresh_job_env, kill_job, start_job

pytestmark = pytest.mark.np(1)

# Seconds a job has to end once started (or once a rank is killed), past which it
# is killed with all its ranks and the test fails: a hang would last until the
# outer timeout. With STARTUP, what the ranks have to get going before the kill, it
# stays below the suite's per-test timeout, which would leave the job running.
DEADLINE = 60
STARTUP = 40

WORKER = """
import os, sys, time
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Replicate, Shard

mode, piddir = sys.argv[1], sys.argv[2]
rank = MPI.COMM_WORLD.Get_rank()
mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
x = mt.distribute_tensor(np.arange(3000.0).reshape(300, 10), mesh, [Shard(0)])
for i in range(10**7):
    x = x.redistribute(mesh, [Replicate()]).redistribute(mesh, [Shard(i % 2)])
    if i == 10:
        open(os.path.join(piddir, f"{rank}.pid"), "w").write(str(os.getpid()))
        if mode == "raise" and rank == 1:
            raise RuntimeError("rank 1 failed on purpose")
"""


def start_worker(tmp_path: Path, mode: str, *python_args: str) -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = ["mpiexec", "--oversubscribe", "-n", "3", sys.executable, *python_args,
           str(script), mode, str(tmp_path)]
    return start_job(cmd)


def finish(proc: subprocess.Popen, started: float):
    """(exit code, stdout and stderr, seconds since ``started``); kills the job
    whole, failing the test, if it outlives DEADLINE."""
    run = finish_job(proc, DEADLINE)
    return run.returncode, run.stdout + run.stderr, time.monotonic() - started


def wait_for_pids(tmp_path: Path, proc: subprocess.Popen, n: int) -> dict:
    """The pids of the n ranks, once each has finished some redistributes."""
    end = time.monotonic() + STARTUP
    while time.monotonic() < end and proc.poll() is None:
        files = list(tmp_path.glob("*.pid"))
        if len(files) == n and all(f.read_text() for f in files):
            return {int(f.stem): int(f.read_text()) for f in files}
        time.sleep(0.05)
    return {}


def test_exception_on_one_rank_aborts_the_job_with_its_traceback(tmp_path):
    started = time.monotonic()
    proc = start_worker(tmp_path, "raise", "-m", "mpi4py")
    code, out, seconds = finish(proc, started)
    assert code != 0, f"exit {code} after {seconds:.0f}s:\n{out[-3000:]}"
    assert "rank 1 failed on purpose" in out, out[-3000:]
    assert "Traceback" in out, out[-3000:]


def test_rank_killed_during_redistributes_ends_the_job(tmp_path):
    started = time.monotonic()
    proc = start_worker(tmp_path, "loop", "-m", "mpi4py")
    try:
        pids = wait_for_pids(tmp_path, proc, 3)
        if not pids:
            out, err = kill_job(proc)
            pytest.fail(f"the job never got going:\n{(out + err)[-3000:]}")
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        code, out, _ = finish(proc, started)
    finally:
        kill_job(proc)  # the ranks left, had the test failed before the job ended
    assert code != 0, (
        f"exit {code} {time.monotonic() - killed:.0f}s after the kill:\n{out[-3000:]}")


# The collective watchdog (MPITENSOR_TIMEOUT): a job whose ranks wait in collectives
# that never match ends with a sentence naming where each rank waits.
WATCHED = """
import sys, time
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Replicate, Shard

mode = sys.argv[1]
rank = MPI.COMM_WORLD.Get_rank()
mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
x = mt.distribute_tensor(np.arange(48.0).reshape(6, 8), mesh, [Shard(0)])
if mode == "differ":  # one rank never enters the collective the others wait in
    if rank == 0:
        time.sleep(60)
    else:
        x.redistribute(mesh, [Replicate()])
elif mode == "slow":  # a late rank is not a stuck one
    if rank == 1:
        time.sleep(2.0)
    y = x.redistribute(mesh, [Replicate()])
    print("job finished on rank", rank, float(y.to_local().sum()), flush=True)
"""


def run_watched(tmp_path: Path, mode: str, timeout: str):
    script = tmp_path / "watched.py"
    script.write_text(WATCHED)
    env = {**fresh_job_env(), "MPITENSOR_TIMEOUT": timeout}
    started = time.monotonic()
    proc = start_job(["mpiexec", "--oversubscribe", "-n", "3", sys.executable, str(script),
                      mode], env=env)
    return finish(proc, started)


def test_ranks_waiting_in_collectives_that_never_match_abort_the_job(tmp_path):
    code, out, seconds = run_watched(tmp_path, "differ", "2")
    assert code != 0, f"exit {code} after {seconds:.0f}s:\n{out[-3000:]}"
    # An agreement waits in MPI's all-reduce, or on a node with a core per rank in
    # the one through shared memory: either way the sentence names it.
    assert re.search(r"has waited 2 s in (MPI_|the agreement's all-reduce in shared "
                     r"memory)", out), out[-3000:]
    assert "MPITENSOR_TIMEOUT=2 seconds" in out, out[-3000:]
    # The rank the others wait for says where it is too: asleep, outside mpitensor.
    assert "rank 0 is in no collective that mpitensor watches" in out, out[-3000:]
    assert re.search(r'watched\.py", line 14 in <module>', out), out[-3000:]


def test_a_late_rank_within_the_timeout_does_not_abort_the_job(tmp_path):
    code, out, seconds = run_watched(tmp_path, "slow", "6")
    assert code == 0, f"exit {code} after {seconds:.0f}s:\n{out[-3000:]}"
    assert out.count("job finished") == 3 and "has waited" not in out, out[-3000:]


def test_a_bad_timeout_raises_the_same_error_on_every_rank(tmp_path):
    code, out, seconds = run_watched(tmp_path, "none", "soon")
    assert code != 0, f"exit {code} after {seconds:.0f}s:\n{out[-3000:]}"
    assert out.count("MPITENSOR_TIMEOUT must be a number of seconds >= 0") >= 3, out[-3000:]
