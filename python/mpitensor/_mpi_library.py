"""The check, made before the first mesh, that mpi4py and mpitensor's extension
use one MPI library.

mpi4py hands its communicators to mpitensor._C as C handles; an ``MPI_Comm`` of
one MPI library means nothing to another (Open MPI's is a pointer, MPICH's an int),
and an mpi4py wheel may load another MPI at run time than the one mpitensor was
built against. Both would load side by side and crash at the first collective, so
the versions are compared first and a mismatch is a clear error.
"""

from __future__ import annotations

from . import _C

_checked = False


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

    ours, theirs = _C.mpi_library_version(), MPI.Get_library_version()
    if not same_mpi_library(ours, theirs):
        raise RuntimeError(mismatch_message(ours, theirs))
    _checked = True


def first_line(text: str) -> str:
    return text.rstrip("\0 \n").splitlines()[0] if text.strip("\0 \n") else "(empty)"
