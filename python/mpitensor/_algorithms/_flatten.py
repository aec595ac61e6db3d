"""The flattened order of a sharded DTensor by one exchange of runs of elements,
for the functions whose ``axis=None`` means "the flattened array" (``roll``,
``flip``, ``cumsum``, ``cumprod``, ``concatenate``) where a reshape would gather.

An array whose rows one mesh dim ``m`` cuts into torch.chunk's blocks holds a run
of its flattened elements on each rank: rows ``[r0, r1)`` are elements
``[r0 * inner, r1 * inner)``, ``inner`` the size of a row. So every rank knows
which elements every other rank holds and where they belong in torch.chunk's
blocks of the flat length, and one exchange along ``m`` (``_row_exchange``, the
elements as rows) re-chunks them; the way back is the same exchange reversed.
An array sharded along another dim has its shard moved to dim 0 first (one
all-to-all, no gather). Only mesh dim ``m`` cuts the array; other mesh dims keep
their Replicate or Partial, so a linear function keeps a Partial.
"""

from __future__ import annotations

import numpy as np

from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec
from ..placement_types import Replicate, Shard
from . import _dispatch as D
from . import _row_exchange as X

__all__ = ["sharding_dim", "flatten", "unflatten"]


def sharding_dim(a):
    """The first mesh dim (of more than one rank) that shards ``a``, or None.
    Local.

    Example: ``sharding_dim(dt)`` is 0 for a ``[Shard(1)]`` DTensor on 2 ranks.
    """
    mesh = a._spec.mesh
    return next((i for i, p in enumerate(a._spec.placements)
                 if p.is_shard() and mesh.shape[i] > 1), None)


def _rows_on(name, a, m):
    """``a`` with its rows cut by mesh dim ``m`` alone (plain ``Shard(0)`` there, no
    other mesh dim sharding anything). Collective on the mesh when it moves; a
    Shard along another mesh dim becomes Replicate (a gather along it only,
    reported)."""
    pls = [p if i == m or not p.is_shard() else Replicate()
           for i, p in enumerate(a._spec.placements)]
    pls[m] = Shard(0)
    return D.relayout(name, a, pls)


def flatten(name, a, m=None):
    """``(flat, m, placements)``: the flattened ``a`` as a 1-D DTensor in
    torch.chunk's blocks on the mesh dim ``m`` that shards ``a``, and the
    placements ``a`` had with that one mesh dim sharding it (for
    :func:`unflatten`). ``m``: that mesh dim when it is given (one of a single
    rank included), else :func:`sharding_dim`'s. Collective on the mesh.

    Example: ``flatten("numpy.roll", dt)[0].full_tensor()`` equals
    ``dt.full_tensor().ravel()``.
    """
    m = sharding_dim(a) if m is None else m
    kept = tuple(p if i == m or not p.is_shard() else Replicate()
                 for i, p in enumerate(a._spec.placements))
    a = _rows_on(name, a, m)
    spec = a._spec
    mesh = spec.mesh
    n = int(np.prod(spec.shape))
    out_pls = tuple(Shard(0) if i == m else p for i, p in enumerate(spec.placements))
    out_spec = DTensorSpec(mesh, out_pls, (n,), spec.dtype, (1,))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), spec.dtype), out_spec), m, kept
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    inner = n // spec.shape[0] if spec.shape[0] else 0
    src, dst = X.bounds(spec.shape[0], p) * inner, X.bounds(n, p)
    out = np.empty((int(dst[me + 1] - dst[me]),), spec.dtype)
    X.exchange(name, spec, m, np.ascontiguousarray(a.to_local()).reshape(-1),
               X.moves(src, dst, 0, 0, n), out)
    return DTensor(out, out_spec), m, kept


def unflatten(name, flat, shape, m, placements):
    """The 1-D DTensor ``flat`` (torch.chunk's blocks on mesh dim ``m``) reshaped to
    ``shape`` and laid out by ``placements`` (:func:`flatten`'s): the elements go
    back to the rows of their blocks by one exchange, then the shard moves to its
    dim if that is not dim 0. Collective on the mesh.

    Example: with ``flat, m, pls = flatten(name, dt)``,
    ``unflatten(name, flat, dt.shape, m, pls)`` equals ``dt``.
    """
    spec = flat._spec
    mesh = spec.mesh
    shape = tuple(shape)
    n = spec.shape[0]
    pls = tuple(Shard(0) if i == m else p for i, p in enumerate(spec.placements))
    strides = tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
    rows_spec = DTensorSpec(mesh, pls, shape, spec.dtype, strides)
    if mesh.get_coordinate() is None:
        return D.relayout(name, DTensor(np.empty((0,), spec.dtype), rows_spec), placements)
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    inner = n // shape[0] if shape[0] else 0
    src, dst = X.bounds(n, p), X.bounds(shape[0], p) * inner
    out = np.empty((int(dst[me + 1] - dst[me]),), spec.dtype)
    X.exchange(name, spec, m, np.ascontiguousarray(flat.to_local()), X.moves(src, dst, 0, 0, n),
               out)
    mine = int(np.diff(X.bounds(shape[0], p))[me])
    rows = DTensor(out.reshape((mine,) + shape[1:]), rows_spec)
    return D.relayout(name, rows, placements)
