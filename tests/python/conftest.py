"""Runs the suite the same way at 1..4 ranks: every rank runs every test, and the
verdict of a test is combined across ranks so that a failure on any rank fails it
on all of them, with that rank's message shown on rank 0.

A test that fails on one rank while the others wait in a collective cannot finish;
a watchdog then ends the job with every thread's stack (naming the test), also when
the rank is stuck inside an MPI call that holds the GIL, where pytest-timeout's
thread cannot run.
"""

from __future__ import annotations

import array
import faulthandler
import gc
import os
import re
import shutil
import signal
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from mpi4py import MPI

import sweeps

COMM = MPI.COMM_WORLD
# Plans, and so the bytes the tests expect, follow the time model: the suite uses
# the built-in one, whatever table `make calibrate` left on this machine.
os.environ.setdefault("MPITENSOR_TIME_MODEL", "builtin")
# SciPy and scikit-learn take DTensors through the array API only when SciPy was
# imported with this set (the client-library tests), and SciPy reads it once.
os.environ.setdefault("SCIPY_ARRAY_API", "1")
# Verdicts travel on their own communicator, so a rank that left a test early can
# never pair its verdict with a collective the other ranks make inside the test.
VERDICTS = COMM.Dup()


def _count_nodes() -> int:
    """How many nodes (sets of ranks that share memory, MPI_COMM_TYPE_SHARED) the
    ranks of this run span; the same on every rank. Collective."""
    node = COMM.Split_type(MPI.COMM_TYPE_SHARED, key=COMM.Get_rank())
    try:
        return COMM.allreduce(1 if node.Get_rank() == 0 else 0, op=MPI.SUM)
    finally:
        node.Free()


NODES = _count_nodes()

# Every rank must draw the same examples (a test that communicates would otherwise
# pair different collectives), so the seed comes from the test itself, no example
# database is shared between ranks, and nothing depends on timing.
settings.register_profile(
    "mpi",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("mpi")


# MT_TEST_REPORT=path: rank 0 writes each test's outcome and recorded properties
# there as JSON (the verdicts are combined across ranks, so rank 0's are the run's);
# tests/clients_table.py makes docs/ecosystem.md's tables from it.
_REPORT = os.environ.get("MT_TEST_REPORT") if COMM.Get_rank() == 0 else None
_outcomes: list = []


def pytest_runtest_logreport(report):
    if _REPORT and (report.when == "call" or (report.when == "setup" and report.skipped)):
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else (
            "xpassed" if hasattr(report, "wasxfail") else report.outcome)
        why = getattr(report, "wasxfail", "") or (
            str(report.longrepr).strip().splitlines()[-1] if report.longrepr else "")
        _outcomes.append({"nodeid": report.nodeid, "outcome": outcome, "why": why,
                          "properties": dict(report.user_properties)})


def pytest_sessionfinish(session):
    if _REPORT:
        import json
        with open(_REPORT, "w") as f:
            json.dump({"tests": _outcomes}, f, indent=0)


def pytest_configure(config):
    _watchdog_fd[0] = _run_stderr(config)
    config.addinivalue_line(
        "markers", "timeout(seconds): the test's own budget before its watchdog ends "
        "the job (see pytest_runtest_protocol)")
    config.addinivalue_line(
        "markers", "np(*sizes): a test whose content is the same at every rank count (it "
        "reads the source tree, or starts its own jobs) runs only when the suite runs "
        "at one of these sizes (docs/testing.md)")
    config.addinivalue_line(
        "markers", "world(*sizes, reason): a test that needs a world of one of these sizes "
        "(a 2 x 2 mesh needs 4 ranks) runs only there; unlike a skipif on the size, the "
        "sweeps see it (tests/python/sweeps.py)")


@pytest.hookimpl(trylast=True)  # after -k and -m chose
def pytest_collection_modifyitems(config, items):
    # `make test` runs the suite at np 1 to 4: a test that checks the same thing at
    # every size would cost 1 + 2 + 3 + 4 ranks' time to find what one rank finds.
    size = COMM.Get_size()
    if not sweeps.full_sweep_at(size):
        items[:], dropped = sweeps.covering(items, size, keep=sweeps.runs_at_some_sizes)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
    for item in items:
        for name in ("np", "world"):
            marker = item.get_closest_marker(name)
            if marker is not None and size not in marker.args:
                sizes = ", ".join(str(n) for n in marker.args)
                item.add_marker(pytest.mark.skip(reason=marker.kwargs.get("reason") or (
                    f"the same at every rank count: runs at np {sizes}" if name == "np"
                    else f"needs np {sizes}")))


def pytest_collection_finish(session):
    # A full collection walks every object the heap holds, and once the suite is
    # collected that is every test module and the libraries they import: each
    # gc.collect() of a test (those that count freed communicators or drop pending
    # requests) paid for walking all of it again. What collection left is frozen, its
    # garbage collected first, so that collections walk only what the tests make.
    # Every rank does this at the same point, as collection ends.
    gc.collect()
    gc.freeze()


_frozen_for = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # What the earlier test modules left alive (torch once imported, caches, the
    # reports) is frozen too, as each module starts, once its garbage is collected:
    # the same point on every rank, and nothing of the module itself is frozen yet.
    # (The plugin's items that start a job of their own hold no module: nothing to
    # freeze for them in this process.)
    module = getattr(item, "module", None)
    if module is not None and module is not _frozen_for[0]:
        _frozen_for[0] = module
        gc.collect()
        gc.freeze()


def pytest_report_header(config):
    nodes = f" on {NODES} nodes" if NODES > 1 else ""
    return (f"mpitensor tests on {COMM.Get_size()} MPI rank(s){nodes}; this is rank "
            f"{COMM.Get_rank()}")


# Seconds a test may take (setup and teardown included) before its watchdog ends the
# job; tests/run_mpi_pytest.sh sets it, a test's `timeout` marker replaces it.
_PER_TEST = float(os.environ.get("MT_TEST_TIMEOUT", "300"))
_watchdog_fd = [2]
# Seconds between a test's stack dumps and the end of its process: every rank dumps
# before the first rank's end ends the job, since the test's frame is only on the
# rank that hangs, which need not be the first whose watchdog fires.
_GRACE = 5.0
# The end comes from SIGALRM's default action, which needs no GIL.
signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _run_stderr(config) -> int:
    """A descriptor of the run's own stderr. By the time conftests load, pytest's fd
    capture has pointed fd 2 at a file that a process ended by the watchdog never
    shows; the capture keeps the original, which this duplicates."""
    capture = getattr(config.pluginmanager.getplugin("capturemanager"),
                      "_global_capturing", None)
    saved = getattr(getattr(capture, "err", None), "targetfd_save", None)
    return os.dup(saved if isinstance(saved, int) else 2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # The watchdog is faulthandler's C thread: it needs no GIL, so it also fires
    # while a rank is stuck inside an MPI call that holds it. It dumps every
    # thread's stack (the test's frame names the test); the kernel's timer ends the
    # process _GRACE later, which mpiexec turns into the end of the job. One watchdog a test: a
    # thread of pytest-timeout's beside it cost more than an empty test at np 4.
    marker = item.get_closest_marker("timeout")
    seconds = _PER_TEST if marker is None else float(
        marker.args[0] if marker.args else marker.kwargs.get("timeout", _PER_TEST))
    faulthandler.dump_traceback_later(seconds, file=_watchdog_fd[0])
    signal.setitimer(signal.ITIMER_REAL, seconds + _GRACE)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        item._mt_failures = getattr(item, "_mt_failures", []) + [report.longreprtext]
    if report.when != "teardown":
        return
    # Teardown runs for every test on every rank, even after a failed setup, so it
    # is the one place where all ranks can agree without risking a hang.
    mine = getattr(item, "_mt_failures", [])
    # One integer all-reduce a test; the texts only travel when some rank failed.
    failed = array.array("i", [1 if mine else 0])
    VERDICTS.Allreduce(MPI.IN_PLACE, failed, op=MPI.MAX)
    if not failed[0]:
        return
    verdicts = VERDICTS.allgather("\n".join(mine)[-4000:] if mine else None)
    others = [(r, text) for r, text in enumerate(verdicts)
              if text is not None and r != COMM.Get_rank()]
    if others and not mine:
        report.outcome = "failed"
        report.longrepr = "\n".join(
            f"--- the test failed on rank {r} of {COMM.Get_size()}:\n{text}"
            for r, text in others)


@pytest.fixture
def forward_only():
    """Runs a test under ``no_grad``, for tests of forward values and
    communication: module parameters require grad (as torch's nn.Parameter), so in
    grad mode outputs would be recorded and local results be local DTensors;
    torch's own forward checks run under no_grad too (test_nn_autograd.py checks
    the backward). Use: ``pytestmark = pytest.mark.usefixtures("forward_only")``."""
    import mpitensor as mt  # not at the top: collecting plain tests must not import it

    with mt.no_grad():
        yield


@pytest.fixture
def strict_numpy():
    """Runs a test under ``mpitensor.strict()``: a call that no rule covers raises
    its TypeError instead of running on the gathered arrays, for the tests of those
    errors (test_ops_fallback.py checks the answers). Use:
    ``@pytest.mark.usefixtures("strict_numpy")``."""
    import mpitensor as mt

    with mt.strict():
        yield


@pytest.fixture
def comm():
    """MPI.COMM_WORLD."""
    return COMM


@pytest.fixture
def world_size():
    return COMM.Get_size()


@pytest.fixture
def rank():
    return COMM.Get_rank()


def _shared_directory(name: str):
    """A directory that every rank sees (made by rank 0, its path broadcast),
    removed once every rank is done with it. Collective."""
    path = COMM.bcast(tempfile.mkdtemp(prefix=f"mt-{name}-") if COMM.Get_rank() == 0 else None)
    yield path
    COMM.Barrier()
    if COMM.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def tmp(request):
    """A directory that every rank sees, one per test module, removed at its end.
    Use: ``def test_x(tmp): mt.save(x, os.path.join(tmp, "x.npy"))``."""
    yield from _shared_directory(request.module.__name__)


@pytest.fixture
def folder(request):
    """As ``tmp``, but one per test: each test starts from an empty directory."""
    yield from _shared_directory(re.sub(r"[^\w.-]", "_", request.node.name)[:40])
