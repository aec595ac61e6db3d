"""Iterating over a DTensor (``for row in dt``, ``list(dt)``), as torch iterates a
tensor over ``unbind(0)``: dim 0 is gathered once, then each row is a local view.

Without ``__iter__`` Python would index ``dt[0]``, ``dt[1]``, ... until IndexError,
one collective per row.
"""

from __future__ import annotations

from ._dtensor_spec import contiguous_strides
from .placement_types import Replicate, Shard, _StridedShard


def iterate(dt):
    """An iterator over the rows of ``dt`` along dim 0, each a DTensor of shape
    ``dt.shape[1:]`` on the same mesh. Collective on the mesh when dim 0 is sharded
    (one redistribution, made here, not at the first ``next``), then local.

    Example::

        >>> x = distribute_tensor(np.arange(6.0).reshape(3, 2), mesh, [Shard(0)])
        >>> [row.full_tensor().tolist() for row in x]
        [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    """
    if not dt.shape:
        raise TypeError("iteration over a 0-d DTensor")
    ndim = len(dt.shape)
    dims = [p.dim % ndim if isinstance(p, (Shard, _StridedShard)) else None
            for p in dt.placements]
    whole = dt
    if 0 in dims:
        whole = dt.redistribute(dt.device_mesh, [Replicate() if d == 0 else p
                                                 for d, p in zip(dims, dt.placements)])
    row_placements = [_row_placement(p, ndim) for p in whole.placements]
    shape = tuple(dt.shape[1:])
    return _rows(whole, row_placements, shape, contiguous_strides(shape))


def _rows(whole, placements, shape, stride):
    local, mesh = whole.to_local(), whole.device_mesh
    for i in range(whole.shape[0]):
        # local[i, ...] keeps a row of a 1-D array a 0-d array, not a NumPy scalar.
        yield type(whole).from_local(local[i, ...], mesh, placements, shape=shape,
                                     stride=stride)


def _row_placement(p, ndim: int):
    """A placement of the whole (dim 0 not sharded) as its rows' placement: a
    shard of dim d shards dim d - 1 of a row, its split factor kept."""
    if isinstance(p, Shard):
        return Shard(p.dim % ndim - 1)
    if isinstance(p, _StridedShard):
        return _StridedShard(p.dim % ndim - 1, split_factor=p.split_factor)
    return p
