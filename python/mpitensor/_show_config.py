"""What this installation of mpitensor runs on: :func:`show_config`, for bug
reports and for checking an installation."""

from __future__ import annotations

import os
import platform
import re
import sys

import numpy as np
from threadpoolctl import threadpool_info

from . import _C, _mpi_library
from ._version import __version__
from .nn import _blas

__all__ = ["show_config"]

# Environment variables that change what mpitensor does (docs/getting_started.md).
SWITCHES = {
    "MPITENSOR_BLAS": "the BLAS of the nn kernels: mkl, openblas, none or a library path",
    "MPITENSOR_NN_KERNELS": "0: the nn layers compute with NumPy",
    "MPITENSOR_POOL_BYTES": "cap of the block pool in bytes, 0 turns it off",
    "MPITENSOR_LOGS": "debug logging, e.g. +dtensor",
    "MPITENSOR_CHECK": "1: check that every rank makes the same collective",
    "MPITENSOR_TIMEOUT": "seconds a collective may wait before the job is aborted (default 1800, 0: off)",
    "MPITENSOR_MPIEXEC": "the launcher of the pytest plugin",
    "MPITENSOR_MPIEXEC_ARGS": "extra launcher arguments of the pytest plugin",
}
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_LIBMPI = re.compile(r"/libmpi\.so")



def _loaded_libmpi() -> list[str]:
    """The MPI libraries mapped into this process (Linux), one path each."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return []
    return sorted({os.path.realpath(p) for p in paths if _LIBMPI.search(p)})


def _blas_info() -> dict:
    numpy_blas = [f"{i.get('internal_api')} {i.get('version')} "
                  f"({i.get('num_threads')} threads) {i.get('filepath')}"
                  for i in threadpool_info() if i.get("user_api") == "blas"]
    return {"nn kernels": _blas.provider(), "nn kernels library": _blas.library(),
            "loaded BLAS libraries": numpy_blas}


def config() -> dict:
    """What :func:`show_config` prints, as a dict of sections. Local; imports
    mpi4py.MPI, which initializes MPI if it is not yet."""
    import mpi4py
    from mpi4py import MPI

    theirs, ours = MPI.Get_library_version(), _C.mpi_library_version()
    return {
        "mpitensor": {"version": __version__,
                      "path": os.path.dirname(os.path.abspath(__file__)),
                      "extension": _C.__file__},
        "Python": {"version": platform.python_version(), "executable": sys.executable,
                   "platform": platform.platform()},
        "NumPy": {"version": np.__version__},
        "mpi4py": {"version": mpi4py.__version__,
                   "MPI library": _mpi_library.first_line(theirs),
                   "MPI standard": "{}.{}".format(*MPI.Get_version())},
        "MPI of mpitensor._C": {"MPI library": _mpi_library.first_line(ours),
                                "same as mpi4py's": _mpi_library.same_mpi_library(ours, theirs),
                                "libmpi files loaded": _loaded_libmpi()},
        "BLAS": _blas_info(),
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
