"""``np.searchsorted`` in a sorted 1-D DTensor: local searches plus offsets.

Where a value goes in a sorted array is the count of elements before it (``<``
for ``side='left'``, ``<=`` for ``'right'``), and a sorted array's shards are
sorted runs, so that count is the sum over the shards of each shard's own
``searchsorted``. Each rank searches its block for every value and the answer is
a ``Partial(sum)`` over the mesh dim that shards the array: no element of it
moves, and reading the result is one all-reduce of the values' positions. The
values must be whole along that mesh dim (they are queries, moved if sharded
there); their other placements are kept.
"""

from __future__ import annotations

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Partial, Replicate
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X

__all__ = ["searchsorted"]


@_registry.implements(np.searchsorted)
def searchsorted(a, v, side="left", sorter=None):
    """``np.searchsorted`` of values ``v`` (a DTensor, or an array or scalar the same
    on every rank) in the sorted 1-D DTensor ``a``: every rank searches its own
    block, the result (intp, ``v``'s shape) is ``Partial(sum)`` on the mesh dim
    that shards ``a`` and placed as ``v`` elsewhere. Local, unless ``v`` must be
    made whole along that mesh dim (or a Partial summed).

    Example: ``np.searchsorted(dt, [2.5, 7.0]).full_tensor()`` of a sorted
    ``[Shard(0)]`` DTensor equals NumPy's.
    """
    name = "numpy.searchsorted"
    if type(a) is not DTensor:
        raise _registry.NoRule(f"{name}: a plain array searched for DTensor values has "
                               f"no distributed rule")
    if sorter is not None:
        raise _registry.NoRule(f"{name}: sorter= has no distributed rule")
    if a.ndim != 1:
        raise _registry.NoRule(f"{name}: only a 1-D DTensor is searched distributed")
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right' (got {side!r})")
    mesh = a._spec.mesh
    if any(p.is_partial() for p in a._spec.placements):
        a = D.relayout(name, a, [Replicate() if p.is_partial() else p
                                 for p in a._spec.placements])
    a, m = X.sharding_mesh_dim(name, a, 0)
    if type(v) is DTensor:
        D.same_mesh(name, (a, v))
        # Every rank of mesh dim m searches the same values; a Partial is summed first.
        want = [Replicate() if (i == m or p.is_partial()) else p
                for i, p in enumerate(v._spec.placements)]
        v = D.relayout(name, v, want)
        shape, values = v._spec.shape, (v.to_local() if mesh.get_coordinate() else None)
    else:
        # Values the same on every rank, as the fallback would take them.
        values = np.asarray(v)
        if values.dtype == object:
            raise _registry.NoRule(f"{name}: object values have no distributed rule")
        want, shape = [Replicate()] * mesh.ndim, values.shape
    out = tuple(Partial("sum") if i == m else p for i, p in enumerate(want))
    spec = DTensorSpec(mesh, out, shape, np.dtype(np.intp), contiguous_strides(shape))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), np.intp), spec)
    local = np.searchsorted(a.to_local(), values, side=side)
    return DTensor(np.array(local, np.intp, order="C"), spec)
