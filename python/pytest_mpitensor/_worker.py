"""The ranks' side of an mpi-marked test started by plain pytest: each rank writes
its reports to a file that the launching pytest reads."""

from __future__ import annotations

import faulthandler
import json
import os

import pytest

OPTION = "--mpitensor-worker-report"
OPTION_HELP = "(internal) directory where each rank writes its test reports"


def _rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


class Worker:
    """Collects this rank's reports and writes them as JSON when the session ends."""

    def __init__(self, config):
        self.directory = config.getoption(OPTION.lstrip("-").replace("-", "_"))
        self.timeout = config.getoption("mpi_timeout")
        self.reports: list[dict] = []

    def pytest_sessionstart(self, session):
        from mpi4py import MPI

        self._stacks = open(os.path.join(self.directory, f"rank{_rank()}.stacks"), "w")
        # Its own communicator, so that the barrier at the end never pairs with a
        # collective a test left waiting on another rank.
        self._finish = MPI.COMM_WORLD.Dup()

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        # A test that outlives its timeout ends the rank, which first writes its
        # stacks to a file (stderr is pytest's capture then), so the failure shows
        # where each rank waited. Start-up time does not count.
        faulthandler.dump_traceback_later(self.timeout, exit=True, file=self._stacks)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()

    def pytest_runtest_logreport(self, report):
        sections = "".join(f"\n----- {name}\n{text}" for name, text in report.sections
                           if text.strip())
        self.reports.append({
            "when": report.when,
            "outcome": report.outcome,
            "text": report.longreprtext + (sections if report.failed else ""),
            "wasxfail": getattr(report, "wasxfail", None),
            "skip_reason": _skip_reason(report),
        })

    def pytest_collectreport(self, report):
        # The ranks run without a terminal reporter: an import error in the test's
        # module would otherwise show nowhere.
        if report.failed:
            self.reports.append({"when": "collect", "outcome": "failed",
                                 "text": report.longreprtext, "wasxfail": None,
                                 "skip_reason": None})

    def pytest_sessionfinish(self, session, exitstatus):
        self._stacks.close()
        path = os.path.join(self.directory, f"rank{_rank()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.reports, f)
        os.replace(path + ".tmp", path)
        # No rank leaves before every rank's report is on disk; a rank still stuck
        # in a test is ended by its timeout.
        self._finish.Barrier()
        # The outcome travels in the reports, so every rank ends MPI the ordinary
        # way. A rank exiting non-zero would make mpi4py's runner call MPI_Abort
        # while the others are in MPI_Finalize, and Open MPI 4.1 now and then never
        # ends such a job.
        session.exitstatus = pytest.ExitCode.OK


def _skip_reason(report):
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return None
    return str(report.longrepr[2]).removeprefix("Skipped: ")
