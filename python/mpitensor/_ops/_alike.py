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
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np

from .. import _comm

__all__ = ["alike"]


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
        _comm.agree(mesh._handle, True, crc, f"{what}: ranks computed different results")
        return arrays
    except ValueError:
        pass  # on every rank alike: the agreement failed everywhere
    warnings.warn(f"{what}: the ranks' LAPACK gave different results for the same bytes "
                  f"(nodes with other CPUs or BLAS libraries?); every rank takes the "
                  f"first rank's", RuntimeWarning, stacklevel=3)
    out = tuple(np.array(a) for a in arrays)  # writable, for the broadcast in place
    for dim in range(mesh.ndim):
        for a in out:
            mesh._handle.bcast(a, dim)
    return out
