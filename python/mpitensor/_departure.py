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

In an IPython kernel (the engines of an ipyparallel MPI cluster, one per rank) a
cell that raises does not end the process: the engine tells the others, for the
cell they all run (each engine counts its cells), and an engine still waiting in a
collective of that cell 2 s later aborts the job. Open MPI 4.1 cannot take back a
collective that one process never entered (it has no fault tolerance), so the
engines cannot be kept: the raising engine says so in its cell's output, with how
to restart the cluster, instead of the notebook freezing until the watchdog's
timeout.
"""

from __future__ import annotations

import atexit
import sys
import time

from . import _comm

_listening = False
_abort_status = [0]  # what mpi4py's runner set for its MPI_Abort at exit


def listen(mesh) -> None:
    """Listens for ranks that leave, once: collective on the mesh ``mesh`` (a
    _comm.Mesh just created on every rank of its communicator) when it holds every
    rank of the world, else local and nothing."""
    global _listening
    if _listening or _comm.collective_timeout() == 0:
        return
    if _comm.watchdog_listen(mesh):
        _listening = True
        _watch_mpi4py_abort()
        _watch_cells()
        atexit.register(_leave)


_cell = [0]  # the cells this engine has run; every engine counts alike

RESTART = (
    "mpitensor: engine {rank} raised before a collective that the other engines may "
    "be waiting in ({others} of {size} did not raise in this cell). A collective that "
    "one engine never entered cannot be taken back (Open MPI 4.1 has no fault "
    "tolerance), so if they wait, mpitensor ends the engines' MPI job within a few "
    "seconds, and the cluster must be restarted: cluster.stop_cluster_sync(); "
    "rc = cluster.start_and_connect_sync(activate=True), then run the cells that "
    "create the mesh again. To make such errors recoverable, raise on every engine "
    "alike (check with a collective, e.g. mpitensor's agreement, before raising)."
)


def _watch_cells() -> None:
    """In an IPython kernel, counts the cells it runs and tells the other engines
    of a cell that raised."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "events"):
        return
    # pre_execute and post_execute fire for silent code too (ipyparallel's
    # execute()), not only for %%px cells.
    shell.events.register("pre_execute", _cell_starts)
    shell.events.register("post_execute", lambda: _cell_ended(shell))


def _cell_starts() -> None:
    _cell[0] += 1
    _comm.watchdog_work(_cell[0])


def _cell_ended(shell) -> None:
    error = getattr(shell.last_execution_result, "error_in_exec", None)
    if error is None or not _listening:
        return
    text = " ".join(str(error).split())
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    _comm.watchdog_tell(f"raised {type(error).__name__}: {text}"[:200] + " in a cell",
                     _cell[0])
    # Engines that raised too say so within moments; a wait for the others only
    # when some did not (the error may have come before a collective).
    others = world.Get_size() - 1
    deadline = time.monotonic() + 0.5
    while _comm.watchdog_failed(_cell[0]) < others and time.monotonic() < deadline:
        time.sleep(0.02)
    missing = others - _comm.watchdog_failed(_cell[0])
    if missing > 0:
        print(RESTART.format(rank=world.Get_rank(), others=missing, size=others + 1),
              file=sys.stderr, flush=True)


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
        _comm.watchdog_leave(None if _abort_status[0] else reason())
    except Exception:  # noqa: BLE001 - exiting: nothing to raise to
        pass
