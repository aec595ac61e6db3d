"""Results every rank computes for itself from the same bytes, made alike.

TSQR's tree and the SVD of stacked R factors leave every rank with the same
matrix (the R of A, its SVD, a least-squares solution) without a broadcast: each
rank runs LAPACK on identical bytes. On one machine image that gives identical
results. Ranks on nodes whose CPUs make OpenBLAS pick other kernels, or with
another LAPACK, may round differently, and a decomposition is not continuous in
its input: two ranks' singular vectors of nearly equal singular values can differ
by a rotation, an eigenvector by its sign. A Replicate result whose replicas
differ, or a U whose rows come from two different SVDs, would be a silent wrong
answer. So the ranks agree on a checksum of what they computed (one small
all-reduce), and when it differs they all take the first rank's result.

ScaLAPACK's replica groups (a matrix replicated over a mesh dim its grid does not
use is factored by every group, each on its own grid) round differently even on
one machine, so their results are made alike the same way, silently
(:func:`same_along`): by the mesh dims along which a result must be the same.
"""

from __future__ import annotations

import warnings
import weakref
import zlib

import numpy as np

from .. import _comm

__all__ = ["alike", "same_along"]


def alike(mesh, arrays, what: str) -> tuple:
    """``arrays`` (ndarrays each rank of ``mesh`` computed from the same bytes) as
    they are on every rank: unchanged when every rank's bytes are the same, else
    the first rank's, broadcast, with a RuntimeWarning naming ``what``. Ranks
    outside the mesh get theirs back. Collective on the mesh.

    Example: ``u_r, s, vh = alike(mesh, np.linalg.svd(r), "numpy.linalg.svd")``.
    """
    arrays = tuple(np.asarray(a, order="C") for a in arrays)  # 0-d stays 0-d
    if mesh._coordinate is None or mesh.size() == 1:
        return arrays
    crc = 0
    for a in arrays:
        crc = zlib.crc32(a.reshape(-1).view(np.uint8), crc)
    try:
        _comm.agree(mesh, True, crc, f"{what}: ranks computed different results")
        return arrays
    except ValueError:
        pass  # on every rank alike: the agreement failed everywhere
    warnings.warn(f"{what}: the ranks' LAPACK gave different results for the same bytes "
                  f"(nodes with other CPUs or BLAS libraries?); every rank takes the "
                  f"first rank's", RuntimeWarning, stacklevel=3)
    out = tuple(np.array(a) for a in arrays)  # writable, for the broadcast in place
    for dim in range(mesh.ndim):
        for a in out:
            _comm.bcast(mesh, a, dim)
    return out


def _crc(arrays) -> int:
    crc = 0
    for a in arrays:
        crc = zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8), crc)
    return crc


# Each mesh object's slices over sets of its dims, made once: a slice's first
# agreement makes its communicator, a collective on its members, so the cache
# goes by the object itself (meshes equal by value may live on some ranks only,
# as long as their garbage waits to be collected).
_slices: dict = {}


def _slice(mesh, dims):
    key = id(mesh)
    entry = _slices.get(key)
    if entry is None or entry[0]() is not mesh:
        entry = (weakref.ref(mesh, lambda _, key=key: _slices.pop(key, None)), {})
        _slices[key] = entry
    if dims not in entry[1]:
        entry[1][dims] = _comm.sliced(mesh, list(dims))
    return entry[1][dims]


def same_along(mesh, arrays, dims) -> None:
    """Makes the C-contiguous, writable ndarrays ``arrays`` the same bytes on the
    ranks that differ only in mesh dims ``dims``: one small agreement of their
    checksums over those ranks, and where they differ, coordinate 0's broadcast
    along each dim. Ranks outside the mesh do nothing. Collective on the mesh.

    Example: ``same_along(mesh, [u_block], [2])`` after each replica group along
    mesh dim 2 computed U.
    """
    dims = tuple(sorted(m for m in set(dims) if mesh.shape[m] > 1))
    if not dims or mesh._coordinate is None or not arrays:
        return
    everywhere = dims == tuple(m for m in range(mesh.ndim) if mesh.shape[m] > 1)
    over = mesh if everywhere else _slice(mesh, dims)
    try:
        _comm.agree(over, True, _crc(arrays), "replicas differ")
        return
    except ValueError:
        pass  # on every rank of the slice alike
    for m in dims:
        for a in arrays:
            _comm.bcast(mesh, a, m)
