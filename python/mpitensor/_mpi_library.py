"""The check, made before the first mesh, that mpi4py and mpitensor's extension
use one MPI library.

mpi4py hands its communicators to mpitensor._C as C handles; an ``MPI_Comm`` of
one MPI library means nothing to another (Open MPI's is a pointer, MPICH's an int),
and an mpi4py wheel may load another MPI at run time than the one mpitensor was
built against. Both would load side by side and crash at the first collective, so
the versions are compared first and a mismatch is a clear error.
"""

from __future__ import annotations

import os
import re

from . import _comm

_checked = False
_LIBMPI = re.compile(r"/libmpi\.so")
# What launchers tell each process about the job it belongs to: how many processes
# they started, and who they are.
_LAUNCHERS = (("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec"),
              ("PMI_SIZE", "a PMI launcher (MPICH's or Intel MPI's mpiexec, or srun "
                           "--mpi=pmi2)"))


def same_mpi_library(ours: str, theirs: str) -> bool:
    """Whether two ``MPI_Get_library_version`` strings name one library. Local.

    Open MPI counts the terminating NUL in the length it reports and mpi4py passes
    it on, so trailing NULs and blanks do not count.

    Example::

        >>> same_mpi_library("Open MPI v4.1.4", "Open MPI v4.1.4\\0")
        True
    """
    return ours.rstrip("\0 \n") == theirs.rstrip("\0 \n")


def mismatch_message(ours: str, theirs: str) -> str:
    """The error raised when mpi4py and mpitensor._C use different MPIs. Local."""
    return ("mpi4py and mpitensor's extension use different MPI libraries, which "
            "cannot share communicators:\n"
            f"  mpi4py:       {first_line(theirs)}\n"
            f"  mpitensor._C: {first_line(ours)}\n"
            "Build mpi4py against the MPI that mpitensor was built with (or the "
            "reverse): `pip install --no-binary=mpi4py --force-reinstall mpi4py` with "
            "that MPI's mpicc on PATH, then reinstall mpitensor. "
            "mpitensor.show_config() lists both.")


def check_mpi_library() -> None:
    """Raises RuntimeError naming both libraries when mpi4py's MPI is not the one
    mpitensor._C was built with; checked once per process, before the first mesh.
    Local (every rank checks its own process).

    Example::

        >>> check_mpi_library()  # silent when both use one library
    """
    global _checked
    if _checked:
        return
    from mpi4py import MPI

    ours, theirs = _comm.mpi_library_version(), MPI.Get_library_version()
    if not same_mpi_library(ours, theirs):
        raise RuntimeError(mismatch_message(ours, theirs))
    # Two libraries loaded side by side may also report one version: where one
    # exports its symbols globally, the other's callers end up in it.
    loaded = loaded_libmpi()
    if len(loaded) > 1:
        raise RuntimeError(
            "this process has loaded several MPI libraries, which cannot share "
            "communicators:\n" + "".join(f"  {p}\n" for p in loaded)
            + "mpi4py and mpitensor must both be built against one of them: `pip "
              "install --no-binary=mpi4py --force-reinstall mpi4py` with its mpicc on "
              "PATH, then reinstall mpitensor. mpitensor.show_config() lists both.")
    _checked = True


def loaded_libmpi() -> list[str]:
    """The MPI libraries mapped into this process (Linux; elsewhere none), one real
    path each. Local.

    Example: ``loaded_libmpi()`` -> ``['/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4']``.
    """
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return []
    return sorted({os.path.realpath(p) for p in paths if _LIBMPI.search(p)})


def launcher_mismatch(world_size: int, environ=None) -> str | None:
    """Why this process looks started by a launcher of another MPI library: the
    launcher says it started several processes, yet this one's world holds
    ``world_size`` = 1 rank, so each process would run alone. None when it does
    not. Local.

    Example: ``launcher_mismatch(1, {"PMI_SIZE": "4"})`` names the PMI launcher;
    ``launcher_mismatch(4, {"PMI_SIZE": "4"})`` is None.
    """
    environ = os.environ if environ is None else environ
    if world_size != 1:
        return None
    for variable, launcher in _LAUNCHERS:
        try:
            started = int(environ.get(variable, "1"))
        except ValueError:
            continue
        if started > 1:
            return (f"{launcher} started this process as one of {started} "
                    f"({variable}={started}), but its MPI world holds 1 rank: that "
                    f"launcher belongs to another MPI library than the one mpi4py and "
                    f"mpitensor use ({first_line(_comm.mpi_library_version())}), so every "
                    f"process would run alone. Start the job with that library's "
                    f"mpiexec (`mpiexec --version` names its own), or build mpi4py and "
                    f"mpitensor against the MPI of the launcher you use. "
                    f"mpitensor.show_config() lists the libraries.")
    return None


def slurm_hint(world_size: int, environ=None) -> str:
    """A sentence for errors about a communicator too small, when srun started more
    tasks than this process's MPI world holds; "" otherwise. Local.

    Example: ``slurm_hint(1, {"SLURM_STEP_NUM_TASKS": "8"})`` -> ``" srun started
    8 tasks ..."``.
    """
    environ = os.environ if environ is None else environ
    try:
        tasks = int(environ.get("SLURM_STEP_NUM_TASKS", "1"))
    except ValueError:
        return ""
    if world_size != 1 or tasks <= 1:
        return ""
    return (f" srun started {tasks} tasks (SLURM_STEP_NUM_TASKS) but this one's MPI "
            f"world holds 1 rank: srun needs the PMI plugin the MPI library was built "
            f"for (`srun --mpi=pmix` for Open MPI, `--mpi=pmi2` for MPICH; "
            f"`srun --mpi=list` shows what the cluster offers).")


def first_line(text: str) -> str:
    return text.rstrip("\0 \n").splitlines()[0] if text.strip("\0 \n") else "(empty)"
