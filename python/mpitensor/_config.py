"""What this installation of mpitensor runs on (:func:`show_config`), and the
check, made before the first mesh, that mpi4py and mpitensor's extension use one
MPI library.

mpi4py hands its communicators to mpitensor._C as C handles; an ``MPI_Comm`` of
one MPI library means nothing to another (Open MPI's is a pointer, MPICH's an int),
and an mpi4py wheel may load another MPI at run time than the one mpitensor was
built against. Both would load side by side and crash at the first collective, so
the versions are compared first and a mismatch is a clear error.
"""

from __future__ import annotations

import os
import platform
import re
import sys

from . import _C

__all__ = ["show_config"]

# Environment variables that change what mpitensor does (docs/getting_started.md).
SWITCHES = {
    "MPITENSOR_BLAS": "the BLAS of the nn kernels: mkl, openblas, none or a library path",
    "MPITENSOR_NN_KERNELS": "0: the nn layers compute with NumPy",
    "MPITENSOR_POOL_BYTES": "cap of the block pool in bytes, 0 turns it off",
    "MPITENSOR_LOGS": "debug logging, e.g. +dtensor",
    "MPITENSOR_CHECK": "1: check that every rank makes the same collective",
    "MPITENSOR_MPIEXEC": "the launcher of the pytest plugin",
    "MPITENSOR_MPIEXEC_ARGS": "extra launcher arguments of the pytest plugin",
}
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_LIBMPI = re.compile(r"/libmpi\.so")

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
            f"  mpi4py:       {_first_line(theirs)}\n"
            f"  mpitensor._C: {_first_line(ours)}\n"
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


def _first_line(text: str) -> str:
    return text.rstrip("\0 \n").splitlines()[0] if text.strip("\0 \n") else "(empty)"


def _loaded_libmpi() -> list[str]:
    """The MPI libraries mapped into this process (Linux), one path each."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return []
    return sorted({os.path.realpath(p) for p in paths if _LIBMPI.search(p)})


def _blas() -> dict:
    from .nn import _blas

    numpy_blas = []
    try:
        from threadpoolctl import threadpool_info

        numpy_blas = [f"{i.get('internal_api')} {i.get('version')} "
                      f"({i.get('num_threads')} threads) {i.get('filepath')}"
                      for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        pass
    return {"nn kernels": _blas.provider(), "nn kernels library": _blas.library(),
            "loaded BLAS libraries": numpy_blas}


def config() -> dict:
    """What :func:`show_config` prints, as a dict of sections. Local; imports
    mpi4py.MPI, which initializes MPI if it is not yet."""
    import mpi4py
    import numpy
    from mpi4py import MPI

    from ._version import __version__

    theirs, ours = MPI.Get_library_version(), _C.mpi_library_version()
    return {
        "mpitensor": {"version": __version__,
                      "path": os.path.dirname(os.path.abspath(__file__)),
                      "extension": _C.__file__},
        "Python": {"version": platform.python_version(), "executable": sys.executable,
                   "platform": platform.platform()},
        "NumPy": {"version": numpy.__version__},
        "mpi4py": {"version": mpi4py.__version__,
                   "MPI library": _first_line(theirs),
                   "MPI standard": "{}.{}".format(*MPI.Get_version())},
        "MPI of mpitensor._C": {"MPI library": _first_line(ours),
                                "same as mpi4py's": same_mpi_library(ours, theirs),
                                "libmpi files loaded": _loaded_libmpi()},
        "BLAS": _blas(),
        "threads": {**{v: os.environ.get(v, "unset") for v in _THREAD_VARIABLES},
                    "CPUs available": len(os.sched_getaffinity(0))
                    if hasattr(os, "sched_getaffinity") else os.cpu_count()},
        # Unknown MPITENSOR_* variables too: a misspelt switch shows here.
        "environment": {**{v: os.environ.get(v, "unset") for v in SWITCHES},
                        **{k: v for k, v in sorted(os.environ.items())
                           if k.startswith("MPITENSOR_") and k not in SWITCHES}},
    }


def show_config(mode: str = "stdout"):
    """Prints the versions of mpitensor, Python, NumPy and mpi4py, the MPI library
    of mpi4py and of mpitensor's extension (and whether they agree), the BLAS of
    the nn kernels and the BLAS libraries loaded, thread settings and the
    ``MPITENSOR_*`` switches. ``mode="dicts"`` returns them instead. Local; imports
    mpi4py.MPI (which initializes MPI if it is not yet). Include its output when
    you report a problem.

    Example::

        >>> import mpitensor
        >>> mpitensor.show_config()
        mpitensor:
          version: 0.1.0
        ...
    """
    sections = config()
    if mode == "dicts":
        return sections
    if mode != "stdout":
        raise ValueError(f"mode must be 'stdout' or 'dicts', got {mode!r}")
    for title, fields in sections.items():
        print(f"{title}:")
        for name, value in fields.items():
            if isinstance(value, list):
                print(f"  {name}:" + ("" if value else " none"))
                for item in value:
                    print(f"    {item}")
            else:
                print(f"  {name}: {value}")
    return None
