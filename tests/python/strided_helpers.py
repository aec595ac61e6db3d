"""torch's definition of a strided shard's local arrays, shared by the strided
tests: what each rank must hold, computed from the whole array."""

from __future__ import annotations

import numpy as np

from mpitensor import Shard
from mpitensor.placement_types import _StridedShard


def _chunk(a, n, i, axis):
    size = -(-a.shape[axis] // n)
    return a.take(range(min(i * size, a.shape[axis]), min((i + 1) * size, a.shape[axis])),
                  axis)


def ref_local(full, mesh_shape, coord, placements):
    """This coordinate's local array by torch's definitions, mesh dim by mesh dim.

    Example: ``ref_local(np.arange(4.0), (2,), (1,), (Shard(0),))`` is ``[2., 3.]``.
    """
    a = full
    for m, p in enumerate(placements):
        n, i = mesh_shape[m], coord[m]
        if isinstance(p, _StridedShard):
            pieces = np.split(a, p.split_factor, axis=p.dim)
            a = np.concatenate([_chunk(q, n, i, p.dim) for q in pieces], axis=p.dim)
        elif isinstance(p, Shard):
            a = _chunk(a, n, i, p.dim)
    return a
