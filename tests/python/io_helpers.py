"""What the HDF5, Zarr and .npy format tests share: the layouts to load into at this
run's size, the arrays to save (bfloat16 included), and checks that every rank
makes alike."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from mpi4py import MPI

from mpitensor import Replicate, Shard
from mpi_helpers import bits_equal, gather_global
import checkpoint_files as cf

COMM = MPI.COMM_WORLD
N = COMM.Get_size()
RANK = COMM.Get_rank()
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64", "float16", "float32", "float64", "complex64", "complex128", "bfloat16"]


def array(shape, dtype, salt: int = 0) -> np.ndarray:
    """A deterministic array of distinct values (as far as the dtype allows)."""
    if dtype in ("bfloat16", BF16):
        return cf.global_array(shape, "float32", salt).astype(BF16)
    return cf.global_array(shape, dtype, salt)


def meshes():
    """Every mesh shape this run can make, 1-D and 2-D, the uneven ones included."""
    return [(N,)] + [(a, N // a) for a in range(2, N) if N % a == 0]


def layouts(ndim: int):
    """(mesh shape, placements) pairs to load into over the meshes of this run:
    each dim sharded, replicated, and a dim sharded by both dims of a 2-D mesh."""
    out = []
    for shape in meshes():
        if ndim == 0:
            out.append((shape, [Replicate()] * len(shape)))
        elif len(shape) == 1:
            out += [(shape, [Replicate()])] + [(shape, [Shard(d)]) for d in range(ndim)]
        else:
            out += [(shape, [Shard(0), Shard(ndim - 1)]), (shape, [Shard(0), Shard(0)])]
    return out


def check_dtensor(p, dt, expect: np.ndarray, what: str) -> None:
    """Collective. ``dt`` holds exactly ``expect``, each rank its reference box."""
    got, problems = gather_global(dt)
    p.expect(problems == [], f"{what}: {problems}")
    p.expect(bits_equal(got, expect), f"{what}: values differ")


def on_first(action) -> None:
    """Collective: ``action()`` on rank 0, then a barrier."""
    if RANK == 0:
        action()
    COMM.Barrier()
