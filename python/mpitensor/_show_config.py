"""What this installation of mpitensor runs on: :func:`show_config`, for bug
reports and for checking an installation."""

from __future__ import annotations

import os
import platform
import sys

import numpy as np
from threadpoolctl import threadpool_info

from . import _C, _mpi_library, device_mesh, _comm
from ._algorithms._scalapack import PACKAGE, scalapack_library, scalapack_source
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
    "MPITENSOR_SCALAPACK": "the ScaLAPACK of np.linalg.solve, eigh, ...: debian, mkl or a library path",
    "MPITENSOR_MPIEXEC_ARGS": "extra launcher arguments of the pytest plugin",
}
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# What launchers tell a process of its job: processes in all, and on its node.
_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_SIZE",
                       "MPI_LOCALNRANKS", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES",
                       "SLURM_STEP_TASKS_PER_NODE")
# The meshes show_config lists, the most recent first.
_MESHES_SHOWN = 8


def _mesh_line(mesh) -> str:
    """One mesh's shape and names, and how it lies on the nodes."""
    layout = mesh._node_layout()
    k, inside, across = layout["ranks_per_node"], layout["inside"], layout["across"]
    names = f" {mesh.mesh_dim_names}" if mesh.mesh_dim_names else ""
    count = layout["count"]
    if layout["nodes"] == "one":
        nodes = "on one node"
    elif layout["nodes"] == "unequal":
        nodes = (f"{count} nodes of {layout['smallest']} to {layout['largest']} "
                 "consecutive ranks, planned as one rank per node")
    elif layout["nodes"] == "interleaved":
        nodes = (f"{count} nodes whose ranks are not consecutive, planned as one rank "
                 "per node")
    elif k == 1:
        nodes = f"one rank per node, {count} nodes"
    else:
        nodes = f"nodes of {k} consecutive ranks, {count} nodes"

    def dims(ds):
        return ", ".join(str(d) for d in ds) if ds else "none"

    return (f"mesh {mesh.shape}{names}: {nodes}; inside a node: {dims(inside)}; "
            f"across nodes: {dims(across)}")


def _nodes_info(MPI) -> dict:
    """Where this process runs and how the live meshes lie on the nodes, as each
    learnt it when it was made. Local."""
    world = MPI.COMM_WORLD
    roots = [m for m in list(device_mesh._live_meshes.values())
             if m._root is None and not device_mesh.is_local_mesh(m)]
    lines = [_mesh_line(m) for m in reversed(roots[-_MESHES_SHOWN:])]
    if len(roots) > _MESHES_SHOWN:
        lines.append(f"... and {len(roots) - _MESHES_SHOWN} older meshes")
    return {"this process": f"rank {world.Get_rank()} of {world.Get_size()} on "
                            f"{MPI.Get_processor_name()}",
            "launcher": [f"{v}={os.environ[v]}" for v in _LAUNCHER_VARIABLES
                         if v in os.environ],
            "meshes (ranks per node, dims inside a node)": lines}


def _blas_info() -> dict:
    numpy_blas = [f"{i.get('internal_api')} {i.get('version')} "
                  f"({i.get('num_threads')} threads) {i.get('filepath')}"
                  for i in threadpool_info() if i.get("user_api") == "blas"]
    return {"nn kernels": _blas.provider(), "nn kernels library": _blas.library(),
            "loaded BLAS libraries": numpy_blas}


def _linalg_info() -> dict:
    """The ScaLAPACK the square np.linalg routines run on (loaded here if not yet)."""
    found = scalapack_library()
    if found is None:
        return {"ScaLAPACK": f"not found (install Debian's {PACKAGE} or the mkl package)"}
    return {"ScaLAPACK": f"{scalapack_source()}: {found}"}


def config() -> dict:
    """What :func:`show_config` prints, as a dict of sections. Local; imports
    mpi4py.MPI, which initializes MPI if it is not yet."""
    import mpi4py
    from mpi4py import MPI

    theirs, ours = MPI.Get_library_version(), _comm.mpi_library_version()
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
                                "libmpi files loaded": _mpi_library.loaded_libmpi()},
        "nodes": _nodes_info(MPI),
        "BLAS": _blas_info(),
        "linear algebra": _linalg_info(),
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
    of mpi4py and of mpitensor's extension (and whether they agree), where this
    process runs and how each live mesh lies on the nodes (ranks per node, the mesh
    dims that stay inside a node and those across nodes, as the mesh's plans see
    them), the BLAS of the nn kernels and the BLAS libraries loaded, the ScaLAPACK
    found, thread settings and the ``MPITENSOR_*`` switches. ``mode="dicts"`` returns them
    instead. Local (it never communicates: call it on one rank or all); imports
    mpi4py.MPI (which initializes MPI if it is not yet). Include its output when
    you report a problem.

    Example::

        >>> import mpitensor
        >>> mesh = mpitensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        >>> mpitensor.show_config()   # on 2 nodes of 2 ranks
        mpitensor:
          version: 0.1.0
        ...
        nodes:
          this process: rank 0 of 4 on node1
          launcher:
            OMPI_COMM_WORLD_SIZE=4
            OMPI_COMM_WORLD_LOCAL_SIZE=2
          meshes (ranks per node, dims inside a node):
            mesh (2, 2) ('dp', 'tp'): nodes of 2 consecutive ranks, 2 nodes; inside a node: tp; across nodes: dp
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
