"""A rank that leaves the job tells the others (csrc/include/mpitensor/watchdog.h).

When the first mesh over every rank of MPI_COMM_WORLD is made, each process starts
listening, and at exit (before MPI_Finalize) it leaves: if every process leaves
within a second, as a job that ends normally does, that costs one nonblocking
barrier; otherwise it tells the others why it left (its end, or the exception that
ended it), and a process that the collective watchdog finds waiting in a
collective for 2 s after that aborts the job, naming the rank and the reason:

    mpitensor: rank 0 has waited 2 s in MPI_Allgather (MPI call 31 of this
    process), and rank 1 has left the job: its Python exited (the script ended or
    called sys.exit()). Its collectives will never come, so the job is aborted.

A process that runs alone, or with the watchdog off (MPITENSOR_TIMEOUT=0), does
nothing. Under ``python -m mpi4py`` an uncaught exception already aborts the job
(mpi4py calls MPI_Abort at exit), so such a process only stops listening.
"""

from __future__ import annotations

import atexit
import sys

from . import _C

_listening = False
_abort_status = [0]  # what mpi4py's runner set for its MPI_Abort at exit


def listen(handle) -> None:
    """Listens for ranks that leave, once: collective on the mesh ``handle`` (a
    _C.Mesh just created on every rank of its communicator) when it holds every
    rank of the world, else local and nothing."""
    global _listening
    if _listening or _C.collective_timeout() == 0:
        return
    if _C.watchdog_listen(handle):
        _listening = True
        _watch_mpi4py_abort()
        atexit.register(_leave)


def _watch_mpi4py_abort() -> None:
    """Notes the status ``python -m mpi4py`` sets when the program raised or
    exited non-zero: mpi4py then aborts the job at exit, and a leaving process must
    not wait for the others first."""
    mpi = sys.modules.get("mpi4py.MPI")
    original = getattr(mpi, "_set_abort_status", None)
    if original is None or getattr(original, "_mt_wrapped", False):
        return

    def set_abort_status(status):
        _abort_status[0] = status
        return original(status)

    set_abort_status._mt_wrapped = True
    mpi._set_abort_status = set_abort_status


def reason() -> str:
    """Why this process leaves, for the other ranks' message."""
    exc = getattr(sys, "last_value", None)
    if isinstance(exc, BaseException):
        text = " ".join(str(exc).split())
        return f"it raised {type(exc).__name__}: {text}"[:240]
    return "its Python exited (the script ended or called sys.exit())"


def _leave() -> None:
    """At exit, before MPI_Finalize (mpi4py finalizes after Python's atexit)."""
    try:
        _C.watchdog_leave(None if _abort_status[0] else reason())
    except Exception:  # noqa: BLE001 - exiting: nothing to raise to
        pass
