"""``np.flip`` along an axis a mesh dim shards, when no other dim can take the
shard (a 1-D array): one exchange of reversed runs of rows, not a gather; and
``np.fliplr`` / ``np.flipud``, which are ``np.flip`` along axis 1 / 0.

Rank ``c``'s block, reversed, is the run of output rows ``[n - hi, n - lo)``, so
every rank knows where its rows land in the output's torch.chunk blocks: one
all-to-all of variable parts along the mesh dim (``_row_exchange``) moves them,
and the output keeps ``Shard(axis)``. Flipping is a permutation, so a Partial is
kept.
"""

from __future__ import annotations

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from . import _row_exchange as X

__all__ = ["flip_sharded", "fliplr", "flipud"]


def flip_sharded(a, ax: int):
    """``np.flip(a, ax)`` by one exchange along the mesh dim that shards ``ax``,
    placed as ``a``. Collective on the mesh.

    Example: ``flip_sharded(dt, 0)`` of a (10,) ``[Shard(0)]`` DTensor.
    """
    name = "numpy.flip"
    X.check_movable(name, a._spec.dtype)
    a, m = X.sharding_mesh_dim(name, a, ax)
    spec = a._spec
    mesh = spec.mesh
    if mesh.get_coordinate() is None:
        return DTensor(np.array(a.to_local(), copy=True), spec)
    n, p = spec.shape[ax], mesh.shape[m]
    at = X.bounds(n, p)
    transfers = []
    for c in range(p):
        size = int(at[c + 1] - at[c])
        for q, row, off, run in X.cut(at, n - int(at[c + 1]), size):
            transfers.append((c, off, q, row, run))
    send = np.ascontiguousarray(X.along(a.to_local(), ax)[::-1])
    out = X.exchange(name, spec, m, send, transfers, np.empty_like(send))
    return DTensor(np.ascontiguousarray(np.moveaxis(out, 0, ax)), spec)


def _at_least(name, m, ndim):
    if type(m) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(m).__name__}")
    if m.ndim < ndim:
        raise ValueError(f"Input must be >= {ndim}-d.")


@_registry.implements(np.fliplr)
def fliplr(m):
    """``np.fliplr``: ``np.flip(m, 1)`` of a DTensor of 2 or more dims. Local unless
    axis 1 is sharded.

    Example: ``np.fliplr(dt)`` of a ``[Shard(0)]`` DTensor moves nothing.
    """
    _at_least("numpy.fliplr", m, 2)
    return np.flip(m, 1)


@_registry.implements(np.flipud)
def flipud(m):
    """``np.flipud``: ``np.flip(m, 0)`` of a DTensor of 1 or more dims. Local unless
    axis 0 is sharded; a sharded 1-D array flips by one exchange.

    Example: ``np.flipud(dt)`` of a ``[Shard(1)]`` DTensor moves nothing.
    """
    _at_least("numpy.flipud", m, 1)
    return np.flip(m, 0)
