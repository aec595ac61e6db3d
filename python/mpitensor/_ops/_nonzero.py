"""Where a DTensor's nonzero elements are, without gathering it: ``np.count_nonzero``,
``np.nonzero`` (and ``np.where`` with one argument), ``np.argwhere`` and
``np.flatnonzero``.

``count_nonzero`` is ``sum(a != 0)`` in NumPy's int: an elementwise test and a sum,
so a sharded reduced axis leaves a Partial(sum) of the counts, as ``np.sum`` does.

The index functions: each rank finds its own nonzero elements and shifts their
indices by its box's global offset. NumPy lists them in C order, and a Shard cuts
that order wherever the sharded dim ``d`` is not the first: each "row" (an index of
the dims before ``d``) is split among the ranks of the mesh dim that shards ``d``.
So the ranks first share their count per row (one all-gather of rows x ranks
counts, not of the array), from which every rank knows where each of its
elements stands in the global order, and one all-to-all of variable parts sends
each index to the rank that holds its position in the result's shards
(``torch.chunk``'s sizes): each index moves once, and the input not at all. The
results are ``Shard(0)`` along the mesh dim that shards the input (Replicate on
the others), in NumPy's dtype (intp).

Inputs sharded along more than one mesh dim (of more than one rank) and 0-d inputs
have no rule here: they go to the fallback.
"""

from __future__ import annotations

import numpy as np

from .. import _comm, _registry
from .._bind.core import chunk_sizes
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D

__all__ = ["count_nonzero", "nonzero", "argwhere", "flatnonzero"]


@_registry.implements(np.count_nonzero)
def count_nonzero(a, axis=None, *, keepdims=False):
    """``np.count_nonzero`` of a DTensor: ``sum(a != 0)`` counted in intp. Local;
    a sharded reduced axis leaves a Partial(sum) of the counts, reduced when read
    (collective then).

    Example: ``np.count_nonzero(dt, axis=0)`` of a (4, 3) ``[Shard(0)]`` DTensor is
    a (3,) ``[Partial(sum)]`` DTensor.
    """
    if type(a) is not DTensor:
        raise TypeError(f"numpy.count_nonzero: expected a DTensor, got {type(a).__name__}")
    return np.sum(a != 0, axis=axis, dtype=np.intp, keepdims=bool(keepdims))


def _sharding_mesh_dim(name, spec):
    """The one mesh dim (of more than one rank) that shards the input, or None."""
    mesh = spec.mesh
    dims = [m for m, p in enumerate(spec.placements) if p.is_shard() and mesh.shape[m] > 1]
    if len(dims) > 1:
        raise _registry.NoRule(f"{name}: a DTensor sharded along more than one mesh dim "
                               f"has no distributed rule")
    return dims[0] if dims else None


def _wrap(mesh, m, local, shape):
    placements = tuple(Shard(0) if i == m else Replicate() for i in range(mesh.ndim))
    local = np.ascontiguousarray(local, np.intp)
    return DTensor(local, DTensorSpec(mesh, placements, shape, np.dtype(np.intp),
                                      contiguous_strides(shape)))


def _row_counts(name, mesh, m, rows, mine):
    """The count of nonzero elements in each row on each rank of mesh dim ``m``:
    a (rows, ranks) table, the same on every rank. Collective along ``m``."""
    k = mesh.shape[m]
    pls = [Shard(1) if i == m else Replicate() for i in range(mesh.ndim)]
    parts = DTensor.from_local(np.ascontiguousarray(mine.reshape(rows, 1), np.int64), mesh,
                               pls, shape=(rows, k), stride=contiguous_strides((rows, k)))
    return D.relayout(name, parts, [Replicate()] * mesh.ndim, records=True).to_local()


def _indices(name, a):
    """(the global indices of ``a``'s nonzero elements as a (n, ndim) intp DTensor in
    C order, ``Shard(0)`` on the mesh dim that shards ``a``; that mesh dim or None).
    Collective on the mesh when ``a`` is sharded."""
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")
    if a.ndim == 0:
        raise _registry.NoRule(f"{name}: a 0-d DTensor has no distributed rule")
    if any(p.is_partial() for p in a._spec.placements):
        # Being nonzero is not linear: the values are summed first.
        a = D.relayout(name, a, [Replicate() if p.is_partial() else p
                                 for p in a._spec.placements])
    spec = a._spec
    mesh = spec.mesh
    ndim = len(spec.shape)
    m = _sharding_mesh_dim(name, spec)
    if mesh.get_coordinate() is None:
        # Outside the mesh nothing is known of the count: an empty stand-in.
        return _wrap(mesh, m, np.empty((0, ndim)), (0, ndim)), m
    local = a.to_local()
    if m is None:
        found = np.argwhere(local)
        return _wrap(mesh, m, found, found.shape), m
    d = spec.placements[m].dim
    _, offset = compute_local_shape_and_global_offset(spec.shape, mesh, spec.placements)
    rows = int(np.prod(spec.shape[:d]))
    # Only dim d is cut, so the dims before it are whole here and C order holds
    # this rank's elements row by row.
    found = np.flatnonzero(local)[:, None] if ndim == 1 else np.argwhere(local)
    # Cut along dim 0 there is one row, whose count is the indices found: no
    # second pass over the data.
    per_row = (np.array([len(found)], np.int64) if d == 0 else
               np.count_nonzero(local.reshape(rows, -1), axis=1) if local.size else
               np.zeros(rows, np.int64))
    table = _row_counts(name, mesh, m, rows, per_row)
    total = int(table.sum())
    c = mesh.get_coordinate()[m]
    starts = (np.cumsum(table.reshape(-1)) - table.reshape(-1)).reshape(table.shape)[:, c]
    if offset and any(offset):
        found += np.asarray(offset, np.intp)
    k = mesh.shape[m]
    bounds = np.cumsum(np.asarray((0,) + tuple(chunk_sizes(total, k)), np.int64))
    if d == 0:
        # Cut along dim 0, this rank's positions are the one run
        # [starts[0], starts[0] + len(found)), and each rank's run follows the one
        # before: the indices arrive in order, and no position need travel with them.
        at = np.clip(bounds - int(starts[0]), 0, len(found))
        got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(found, np.int64),
                                        np.diff(at).tolist(), m)
        return _wrap(mesh, m, got, (total, ndim)), m
    row_of = (np.ravel_multi_index(tuple(found[:, :d].T), spec.shape[:d]) if d and len(found)
              else np.zeros(len(found), np.intp))
    first_in_row = np.cumsum(per_row) - per_row
    position = starts[row_of] + np.arange(len(found)) - first_in_row[row_of]
    # Positions grow in local order: the rows do, and within a row the rank's
    # elements are consecutive.
    counts = np.diff(np.searchsorted(position, bounds, side="left")).tolist()
    records = np.concatenate([position[:, None].astype(np.int64), found.astype(np.int64)],
                             axis=1)
    got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(records), counts, m)
    got = got[np.argsort(got[:, 0], kind="stable")]
    return _wrap(mesh, m, got[:, 1:], (total, ndim)), m


def _column(mesh, m, idx, j):
    total = idx._spec.shape[0]
    local = idx.to_local()
    return _wrap(mesh, m, local[:, j] if local.ndim == 2 else local, (total,))


@_registry.implements(np.argwhere)
def argwhere(a):
    """``np.argwhere`` of a DTensor: the (n, ndim) global indices of its nonzero
    elements in C order, intp, ``Shard(0)`` on the mesh dim that shards ``a``.
    Collective on the mesh when ``a`` is sharded: an all-gather of a count per row
    and rank, and an all-to-all of the indices.

    Example: ``np.argwhere(dt)`` of a (4, 3) ``[Shard(1)]`` DTensor.
    """
    return _indices("numpy.argwhere", a)[0]


@_registry.implements(np.nonzero)
def nonzero(a):
    """``np.nonzero`` of a DTensor: one (n,) intp DTensor per dim, the global indices
    of its nonzero elements in C order, ``Shard(0)`` on the mesh dim that shards
    ``a``. Collective on the mesh when ``a`` is sharded (as ``np.argwhere``).

    Example: ``rows, cols = np.nonzero(dt)``.
    """
    idx, m = _indices("numpy.nonzero", a)
    mesh = idx._spec.mesh
    return tuple(_column(mesh, m, idx, j) for j in range(a.ndim))


@_registry.implements(np.flatnonzero)
def flatnonzero(a):
    """``np.flatnonzero`` of a DTensor: the (n,) intp flat indices of its nonzero
    elements, ``Shard(0)`` on the mesh dim that shards ``a``. Collective on the
    mesh when ``a`` is sharded (as ``np.argwhere``).

    Example: ``np.flatnonzero(dt)``.
    """
    idx, m = _indices("numpy.flatnonzero", a)
    spec = idx._spec
    local = idx.to_local()
    flat = (local[:, 0] if a.ndim == 1 else np.ravel_multi_index(tuple(local.T), a.shape)
            if local.size else np.zeros(local.shape[0], np.intp))
    return _wrap(spec.mesh, m, flat, (spec.shape[0],))
