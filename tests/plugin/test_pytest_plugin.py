"""The pytest plugin (pytest_mpitensor), seen from a user's suite: plain pytest runs
mpi-marked tests under mpiexec and reports each as one ordinary test; a pytest that
already runs under mpiexec runs them in place or skips them; -p no:mpitensor turns
the plugin off. Each test runs a user's suite in a fresh pytest process.

Run with plain pytest (never under mpiexec): `python -m pytest tests/plugin`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

pytestmark = pytest.mark.skipif(
    any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")),
    reason="runs pytest sessions of its own: run it with plain pytest, not under mpiexec")

USER_SUITE = '''
import numpy as np
import pytest
import mpitensor as mt
from mpitensor.testing import assert_equal


@pytest.mark.mpi(ranks=2)
def test_two_ranks(mesh):
    from mpi4py import MPI
    assert MPI.COMM_WORLD.Get_size() == 2 and mesh.shape == (2,)
    assert_equal(mt.ones(4, device_mesh=mesh, placements=[mt.Shard(0)]), np.ones(4))


@pytest.mark.mpi(ranks=3)
def test_fails_on_rank_1_only():
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_rank() == 2:
        # Still running when rank 1 ends with its failure: rank 2's report must
        # survive rank 1's exit.
        __import__("time").sleep(2)
    assert MPI.COMM_WORLD.Get_rank() != 1, "rank one disagrees"


@pytest.mark.mpi(ranks=2)
def test_collective_assert_names_the_rank(mesh):
    x = mt.distribute_tensor(np.arange(4.0), mesh, [mt.Shard(0)])
    assert_equal(x, np.array([0.0, 1.0, 2.0, 9.0]))


@pytest.mark.mpi(ranks=2, timeout=5)
def test_hangs():
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_rank() == 0:
        MPI.COMM_WORLD.barrier()  # rank 1 never comes


@pytest.mark.mpi(ranks=2, timeout=10)
def test_passes_but_its_ranks_never_exit():
    import threading
    import time
    # Not a daemon: each rank's interpreter waits for it at exit, after the report.
    threading.Thread(target=time.sleep, args=(3600,)).start()


@pytest.mark.mpi(ranks=2)
def test_skipped_everywhere():
    pytest.skip("nothing to see")


@pytest.mark.mpi(ranks=2)
@pytest.mark.xfail(reason="known to fail")
def test_expected_to_fail():
    assert False


@pytest.mark.mpi(ranks=2)
@pytest.mark.parametrize("k", [1, 2])
def test_parametrized(k):
    assert k == 1


def test_unmarked_runs_in_the_pytest_process():
    assert "OMPI_COMM_WORLD_SIZE" not in __import__("os").environ
'''


def run_suite(tmp_path, *args, launcher=(), env=None):
    """Runs the user's suite in a new pytest; returns ({test name: (outcome,
    message)}, output)."""
    (tmp_path / "test_user.py").write_text(USER_SUITE)
    report = tmp_path / "report.xml"
    cmd = [*launcher, sys.executable, "-m", "pytest", "test_user.py", "-p", "no:cacheprovider",
           f"--junitxml={report}", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args]
    run_env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1", **(env or {})}
    proc = subprocess.run(cmd, cwd=tmp_path, env=run_env, capture_output=True, text=True,
                          timeout=600)
    outcomes = {}
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            kind = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
            outcome = "passed" if kind is None else kind.tag
            text = "" if kind is None else (kind.get("message", "") + "\n" + (kind.text or ""))
            outcomes[case.get("name")] = (outcome, text)
    return outcomes, proc.stdout + proc.stderr


def test_plain_pytest_runs_marked_tests_under_mpiexec(tmp_path):
    got, output = run_suite(tmp_path)
    assert got["test_two_ranks"][0] == "passed", output
    assert got["test_unmarked_runs_in_the_pytest_process"][0] == "passed", output

    outcome, text = got["test_fails_on_rank_1_only"]
    assert outcome == "failure" and "failed on rank(s) [1]" in text, text
    assert "rank one disagrees" in text

    # assert_equal fails on both ranks; the message names the rank holding index 3.
    # Its frames are hidden, so both ranks' reports are the same and show once.
    outcome, text = got["test_collective_assert_names_the_rank"]
    assert outcome == "failure" and "failed on rank(s) [0, 1]" in text, text
    assert "global index (3,) on rank 1" in text and "actual 3.0, expected 9.0" in text
    assert "rank(s) [0, 1] (call)" in text and "rank(s) [0] (call)" not in text, text
    assert "_comparison.py" not in text, text

    outcome, text = got["test_hangs"]
    assert outcome == "failure", text
    assert "test_user.py::test_hangs on 2 MPI rank(s) did not finish within 5 s" in text
    line = USER_SUITE.splitlines().index("        MPI.COMM_WORLD.barrier()  # rank 1 never comes") + 1
    assert f'test_user.py", line {line} in test_hangs' in text  # rank 0's stack at the limit
    # Neither the healthy rank's pytest summary nor the launcher's banner.
    assert "passed" not in text and "-" * 20 not in text, text

    # The outcome is known once every rank reported: a job that then does not end
    # is killed after the test's timeout, with a warning.
    assert got["test_passes_but_its_ranks_never_exit"][0] == "passed", output
    assert ("test_user.py::test_passes_but_its_ranks_never_exit on 2 MPI rank(s): every rank "
            "reported, but the job did not end within 10 s after and was killed") in output

    outcome, text = got["test_skipped_everywhere"]
    assert outcome == "skipped" and "nothing to see" in text, text
    assert got["test_expected_to_fail"][0] == "skipped"  # junit's word for xfailed
    assert got["test_parametrized[1]"][0] == "passed"
    assert got["test_parametrized[2]"][0] == "failure"


def test_ranks_of_a_failed_test_end_mpi_without_abort(tmp_path):
    # A rank exiting non-zero makes mpi4py's runner call MPI_Abort while the other
    # ranks are in MPI_Finalize, a job Open MPI now and then never ends. The ranks'
    # side of the plugin therefore always exits zero; the failure is in the report.
    (tmp_path / "test_user.py").write_text(USER_SUITE)
    (tmp_path / "reports").mkdir()
    proc = subprocess.run(
        ["mpiexec", "-n", "3", sys.executable, "-m", "mpi4py", "-m", "pytest",
         "test_user.py::test_fails_on_rank_1_only", "-p", "no:terminal", "-p", "no:cacheprovider",
         f"--mpitensor-worker-report={tmp_path / 'reports'}", "--mpi-timeout=120"],
        cwd=tmp_path, env={**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"},
        capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "MPI_ABORT" not in output, output
    outcomes = [[x["outcome"] for x in json.loads((tmp_path / "reports" / f"rank{r}.json")
                                                  .read_text()) if x["when"] == "call"]
                for r in range(3)]
    assert outcomes == [["passed"], ["failed"], ["passed"]], outcomes


def test_under_mpiexec_marked_tests_run_in_place_or_skip(tmp_path):
    # A launcher that always fails proves that no nested mpiexec is started.
    got, output = run_suite(
        tmp_path, "-k", "two_ranks or rank_1 or unmarked or parametrized",
        launcher=["mpiexec", "-n", "2"], env={"MPITENSOR_MPIEXEC": "false"})
    assert got["test_two_ranks"][0] == "passed", output
    outcome, text = got["test_fails_on_rank_1_only"]
    assert outcome == "skipped" and "needs 3 MPI ranks; this pytest runs on 2" in text, output
    assert got["test_parametrized[1]"][0] == "passed", output
    # Open MPI gives the ranks a terminal for stdout; the report still follows
    # mpiexec's own output, a pipe here: no colour codes in a log.
    assert "\x1b[" not in output, output


def test_plugin_can_be_switched_off(tmp_path):
    got, output = run_suite(tmp_path, "-k", "two_ranks", "-p", "no:mpitensor")
    outcome, text = got["test_two_ranks"]
    assert outcome == "error" and "fixture 'mesh' not found" in text, output


def test_a_bad_marker_is_a_usage_error(tmp_path):
    (tmp_path / "test_bad.py").write_text(
        "import pytest\n@pytest.mark.mpi(ranks=0)\ndef test_x():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_bad.py", "-p", "no:cacheprovider"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "@pytest.mark.mpi needs ranks=<positive int>" in proc.stdout + proc.stderr


def test_an_import_error_on_the_ranks_is_shown(tmp_path):
    (tmp_path / "test_ranks_only.py").write_text(
        "import os\nimport pytest\n"
        "if 'OMPI_COMM_WORLD_SIZE' in os.environ:\n"
        "    raise ImportError('this module breaks under mpiexec')\n"
        "@pytest.mark.mpi(ranks=2)\ndef test_x():\n    pass\n")
    env = {**os.environ, "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_ranks_only.py", "-p",
                           "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "1 failed" in output, output
    assert "failed on rank(s) [0, 1]" in output and "(collect)" in output, output
    assert "this module breaks under mpiexec" in output, output


# Stands for pytest-mpi / pytest-isolate-mpi: a plugin registered under the same name
# that defines an `mpi` marker of its own (here: it skips every marked test).
OTHER_PLUGIN = '''
import pytest

def pytest_configure(config):
    config.addinivalue_line("markers", "mpi: the other plugin's marker")

def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("mpi"):
            item.add_marker(pytest.mark.skip(reason="the other plugin decides"))
'''


@pytest.mark.parametrize("name, dist", [("pytest_mpi", "pytest-mpi"),
                                        ("pytest_isolate_mpi", "pytest-isolate-mpi")])
def test_another_mpi_marker_plugin_keeps_its_marker(tmp_path, name, dist):
    (tmp_path / f"{name}.py").write_text(OTHER_PLUGIN)
    got, output = run_suite(tmp_path, "-k", "two_ranks or unmarked", "-p", name)
    assert "INTERNALERROR" not in output, output
    outcome, text = got["test_two_ranks"]
    assert outcome == "skipped" and "the other plugin decides" in text, output
    assert got["test_unmarked_runs_in_the_pytest_process"][0] == "passed", output
    assert f"leaves the `mpi` marker to {dist}" in output, output
    assert f"-p no:{name}" in output, output
