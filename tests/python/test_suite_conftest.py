"""What the suite's conftest does with a test under tests/run_mpi_pytest.sh that hangs,
or fails on some ranks only.

A test that hangs ends its job, naming itself. The conftest arms a watchdog (faulthandler's thread) for each test: one that outlives
MT_TEST_TIMEOUT, or its own ``timeout`` marker, dumps the stack of every thread of
each rank, where the test's frame names it, and ends the job. So a hang in
``make test`` says which test hung, also when a rank is stuck inside an MPI call that
holds the GIL, instead of waiting for the run's outer timeout.

A test that fails on one rank fails on every rank, and rank 0, the one that reports,
shows the failing rank's message.

The job is started from the np=1 run only, with the conftest loaded as a plugin for
a test file of its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mpi_helpers import finish_job, fresh_job_env, start_job

pytestmark = pytest.mark.np(1)

HERE = Path(__file__).resolve().parent
RUN = HERE.parent / "run_mpi_pytest.sh"

HANGS = '''
import pytest
from mpi4py import MPI


def test_waits_for_a_rank_that_never_comes():
    if MPI.COMM_WORLD.Get_rank() == 0:
        MPI.COMM_WORLD.barrier()


@pytest.mark.timeout(2)
def test_has_a_budget_of_its_own():
    if MPI.COMM_WORLD.Get_rank() == 1:
        MPI.COMM_WORLD.barrier()
'''


FAILS = '''
from mpi4py import MPI


def test_fails_on_rank_1_only():
    assert MPI.COMM_WORLD.Get_rank() != 1, "rank one disagrees"


def test_passes_everywhere():
    pass
'''


def _run(tmp_path, test, timeout, source=HANGS):
    (tmp_path / "test_hangs.py").write_text(source)
    env = {**fresh_job_env(), "MT_TEST_TIMEOUT": str(timeout), "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    # The run fails by design: make test's list of failed tests must not name it.
    env.pop("MT_FAILURES", None)
    job = start_job([str(RUN), "2", f"{tmp_path / 'test_hangs.py'}::{test}",
                     "-p", "conftest", "-q"], env=env)
    run = finish_job(job, 100)
    return run.returncode, run.stdout + run.stderr


def test_a_hung_test_ends_its_job_with_its_name_and_stack(tmp_path):
    code, output = _run(tmp_path, "test_waits_for_a_rank_that_never_comes", 3)
    assert code != 0, output
    assert "Timeout (0:00:03)!" in output, output
    assert "in test_waits_for_a_rank_that_never_comes" in output, output


def test_a_timeout_marker_sets_the_tests_own_budget(tmp_path):
    code, output = _run(tmp_path, "test_has_a_budget_of_its_own", 60)
    assert code != 0, output
    assert "Timeout (0:00:02)!" in output, output
    assert "in test_has_a_budget_of_its_own" in output, output


def test_a_failure_on_one_rank_is_reported_by_rank_0_with_its_message(tmp_path):
    code, output = _run(tmp_path, "test_fails_on_rank_1_only", 60, FAILS)
    assert code != 0, output
    assert "the test failed on rank 1 of 2" in output and "rank one disagrees" in output, output
    code, output = _run(tmp_path, "test_passes_everywhere", 60, FAILS)
    assert code == 0 and "1 passed" in output and "failed on rank" not in output, output
