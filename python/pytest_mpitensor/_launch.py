"""The launching side of an mpi-marked test: one ``mpiexec`` job per test, whose
ranks' reports are folded into one ordinary pytest outcome."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from . import _worker

# Plugins (by their pytest11 entry-point names) that define an ``mpi`` marker of
# their own, with other meanings: both acting on one test breaks the run.
OTHER_MPI_PLUGINS = {"pytest_isolate_mpi": "pytest-isolate-mpi", "pytest_mpi": "pytest-mpi"}

# Variables a launcher gives its processes: their presence means pytest itself
# runs as one rank of a job (Open MPI, then MPICH/Hydra and Intel MPI).
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# Variables an MPI library may set in its own process (a singleton MPI_Init in the
# pytest process, done by a test module that imports mpi4py) that would make the
# child mpiexec believe it is nested. Those present before any test ran are kept.
_MPI_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "OPAL_", "ORTE_", "PRTE_", "HYDRA_", "I_MPI_")
_ENV_AT_START = dict(os.environ)
_TAIL = 6000  # characters of a job's output kept in a failure message
# Seconds a job may take beyond the test's timeout to start and end its ranks.
_START_ALLOWANCE = 120.0
# Seconds a job may take to end once every rank's report is on disk (at most the
# test's own timeout).
_END_ALLOWANCE = 60.0


def launched_world_size() -> int | None:
    """The size of the MPI job this process is a rank of, or None under plain pytest."""
    for var in _SIZE_VARS:
        if _ENV_AT_START.get(var, "").isdigit():
            return int(_ENV_AT_START[var])
    return None


def output_is_terminal() -> bool:
    """Whether what this process writes to stdout reaches a terminal. Open MPI gives
    its ranks a pseudo-terminal for stdout whatever mpiexec's own stdout is (a log
    file, a pipe), so under a launcher the answer is that of the launcher's stdout,
    the parent process's, read from /proc; where that cannot be read, no."""
    if not sys.stdout.isatty():
        return False
    if launched_world_size() is None:
        return True
    try:
        target = os.readlink(f"/proc/{os.getppid()}/fd/1")
    except OSError:
        return False
    return re.fullmatch(r"/dev/(pts/\d+|tty\w*)", target) is not None


def marker_ranks(marker) -> int:
    ranks = marker.kwargs.get("ranks", marker.args[0] if marker.args else None)
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise pytest.UsageError(
            f"@pytest.mark.mpi needs ranks=<positive int>, got {marker.args} {marker.kwargs}")
    return ranks


class MPIJobFailed(Exception):
    """The test failed on some rank, or its job did not finish."""


class MPIItem(pytest.Item):
    """Stands for a test function in the launching pytest: running it runs the
    function on `ranks` ranks under mpiexec and reports the combined outcome."""

    def __init__(self, *, function: pytest.Function, marker, **kwargs):
        super().__init__(**kwargs)
        self.function = function
        self.own_markers = list(function.own_markers)
        self.keywords.update(function.keywords)
        self.ranks = marker_ranks(marker)
        self.timeout = float(marker.kwargs.get("timeout") or self.config.getoption("mpi_timeout"))

    def reportinfo(self):
        return self.function.reportinfo()

    def runtest(self) -> None:
        with tempfile.TemporaryDirectory(prefix="mpitensor-pytest-") as directory:
            cmd = self._command(directory)
            reported = [os.path.join(directory, f"rank{r}.json") for r in range(self.ranks)]
            end = min(self.timeout, _END_ALLOWANCE)
            output, hung = _run(cmd, self.timeout + _START_ALLOWANCE, end,
                                str(self.config.rootpath),
                                lambda: all(map(os.path.exists, reported)))
            reports, stacks = _read_reports(directory, self.ranks)
        where = f"{self.nodeid} on {self.ranks} MPI rank(s)"
        if hung == "at its end":
            # Every rank finished the test and said how; what did not end is the
            # launcher's teardown (Open MPI's mpiexec can deadlock there) or a
            # rank's exit: the outcome stands, and the warning says what was killed.
            self.warn(pytest.PytestWarning(
                f"{where}: every rank reported, but the job did not end within "
                f"{end:g} s after and was killed"))
            hung = None
        if stacks:
            raise MPIJobFailed(
                f"{where} did not finish within {self.timeout:g} s (a hang, or a rank "
                f"waiting in a collective that another skipped).\ncommand: {shlex.join(cmd)}"
                + "".join(f"\n========== stacks of rank {r} at the time limit\n"
                          f"{_tail(_user_frames(text))}" for r, text in stacks.items())
                + _output_section(output))
        if hung:
            raise MPIJobFailed(
                f"{where}: the job did not end within {self.timeout + _START_ALLOWANCE:g} s "
                f"and was killed.\ncommand: {shlex.join(cmd)}{_output_section(output)}")
        _judge(where, reports, self.ranks, cmd, output)

    def _command(self, directory: str) -> list[str]:
        config = self.config
        cmd = [config.getoption("mpiexec"), *shlex.split(config.getoption("mpiexec_args")),
               "-n", str(self.ranks), sys.executable, "-m", "mpi4py", "-m", "pytest",
               # The ranks report through files: their terminal output would only
               # repeat it ("1 passed") in a failure's message.
               self.nodeid, "-p", "no:terminal", "-p", "no:cacheprovider",
               "--rootdir", str(config.rootpath),
               f"{_worker.OPTION}={directory}", f"--mpi-timeout={self.timeout:g}"]
        if config.inipath is not None:
            cmd += ["-c", str(config.inipath)]
        # The ranks too must leave the marker to this plugin (the launching pytest
        # runs only when they are off, by -p no:... or not installed).
        for name in OTHER_MPI_PLUGINS:
            cmd += ["-p", f"no:{name}"]
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
            cmd += ["-p", "pytest_mpitensor"]
        return cmd

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, MPIJobFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)


def _child_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k in _ENV_AT_START or not k.startswith(_MPI_PREFIXES)}
    # Ranks may outnumber cores: a test of 4 ranks must run on a 2-core machine.
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    return env


def _run(cmd, timeout, end, cwd, reported) -> tuple[str, str | None]:
    """Runs the job in its own process group; returns its output and whether it
    was killed: None, "at its end" (``reported()`` held for ``end`` s while the
    job went on) or "in the test" (``timeout`` s passed)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=_child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline, ended = time.monotonic() + timeout, None
    while True:
        try:
            # communicate() keeps what it read when it times out: no output is lost
            # across the polls.
            out, _ = proc.communicate(timeout=1.0)
            return out.decode(errors="replace"), None
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if ended is None and reported():
                ended = now
            if ended is not None and now - ended > end:
                hung = "at its end"
            elif now > deadline:
                hung = "in the test"
            else:
                continue
        _kill_group(proc)
        out, _ = proc.communicate()
        return out.decode(errors="replace"), hung


def _kill_group(proc) -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)


def _read_reports(directory: str, ranks: int) -> tuple[dict, dict]:
    """The ranks' reports, and the stacks that ranks wrote when they timed out."""
    reports, stacks = {}, {}
    for r in range(ranks):
        path = os.path.join(directory, f"rank{r}")
        if os.path.exists(path + ".json"):
            with open(path + ".json") as f:
                reports[r] = json.load(f)
        if os.path.exists(path + ".stacks") and os.path.getsize(path + ".stacks"):
            with open(path + ".stacks", errors="replace") as f:
                stacks[r] = f.read()
    return reports, stacks


def _judge(where, reports, ranks, cmd, output) -> None:
    """Folds the ranks' reports into this item's outcome: raise to fail, skip to
    skip, return to pass."""
    missing = [r for r in range(ranks) if not reports.get(r)]
    if missing:
        raise MPIJobFailed(f"{where}: rank(s) {missing} reported no result (the test "
                           f"was not found, or a rank died).\ncommand: {shlex.join(cmd)}"
                           f"{_output_section(output)}")
    failed: dict = {}  # (phase, text) -> ranks, so that identical reports show once
    for r, rep in reports.items():
        for x in rep:
            if x["outcome"] == "failed":
                failed.setdefault((x["when"], x["text"]), []).append(r)
    if failed:
        ranks_failed = sorted({r for rs in failed.values() for r in rs})
        raise MPIJobFailed(f"{where}: failed on rank(s) {ranks_failed}\n" + "\n".join(
            f"========== rank(s) {rs} ({when})\n{_tail(text)}"
            for (when, text), rs in failed.items()))
    xfailed = [r for r, rep in reports.items() if any(x["wasxfail"] is not None
                                                      and x["outcome"] == "skipped" for x in rep)]
    if xfailed:
        # The launching pytest sees the same xfail marker and turns this into xfailed.
        raise MPIJobFailed(f"{where}: failed as expected (xfail) on rank(s) {xfailed}")
    skipped = [r for r, rep in reports.items() if any(x["outcome"] == "skipped" for x in rep)]
    if len(skipped) == len(reports):
        reason = next(x["skip_reason"] for x in reports[0] if x["outcome"] == "skipped")
        raise pytest.skip.Exception(f"skipped on every rank: {reason}", _use_item_location=True)


def _user_frames(stacks: str) -> str:
    """A faulthandler dump without the frames of pytest, pluggy and the launch."""
    noise = ("/_pytest/", "/pluggy/", "<frozen runpy>", "/mpi4py/run.py", "/mpi4py/__main__.py",
             "/pytest/__main__.py")
    return "\n".join(line for line in stacks.splitlines() if not any(n in line for n in noise))


# Open MPI's notes that a job ended because a rank failed, between lines of dashes:
# the failure message says so already. Its other notes (refusing to run as root,
# too few slots) stay: they are the reason.
_BANNER = re.compile(r"^-{20,}\n(?:(?!-{20,}\n).*\n)*?-{20,}\n?", re.M)
_BANNER_WORDS = ("Primary job", "exited with non-zero status", "MPI_ABORT was invoked",
                 "noticed that process rank")


def _job_output(output: str) -> str:
    """The job's own output, without the launcher's banners."""
    return _BANNER.sub(lambda m: "" if any(w in m.group(0) for w in _BANNER_WORDS)
                       else m.group(0), output).strip()


def _output_section(output: str) -> str:
    text = _job_output(output)
    return f"\n========== output\n{_tail(text)}" if text else ""


def _tail(text: str) -> str:
    return text if len(text) <= _TAIL else "...\n" + text[-_TAIL:]
