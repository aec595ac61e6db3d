"""Joining DTensors along an axis a mesh dim shards, and NumPy's joining shorthands
(``np.hstack``, ``np.vstack``, ``np.column_stack``, ``np.dstack``, ``np.append``).

``np.concatenate`` along an axis no mesh dim shards is a dim map (``_shape.py``):
every rank joins its own blocks and nothing moves. Along an axis mesh dim ``m``
shards, each input's rows lie in torch.chunk's blocks and the result's rows must
too, so every rank knows where each of its rows goes: one exchange of runs of
rows along ``m`` (``_row_exchange``) re-chunks them, and the result stays sharded
along the axis. Each row moves at most once and only when its owner changes;
nothing is gathered. The inputs first agree on the other mesh dims' placements
(kept when they already agree, Replicate otherwise) and take ``Shard(axis)`` on
``m`` (a local cut for a Replicate one).

The shorthands are NumPy's own definitions over ``np.atleast_*d``,
``np.expand_dims`` and ``np.concatenate``, so they are local or one exchange as
that concatenate is.
"""

from __future__ import annotations

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X

__all__ = ["concatenate_sharded", "joining_mesh_dim", "hstack", "vstack", "column_stack",
           "dstack", "append"]


def _agreed(mesh, arrays, m, ax) -> tuple:
    """The placements every input takes: ``Shard(ax)`` on ``m``; on another mesh dim
    the inputs' common placement (a Shard of another dim wins over Replicate, as
    taking it is a local cut), else Replicate."""
    out = []
    for i in range(mesh.ndim):
        if i == m:
            out.append(Shard(ax))
            continue
        seen = {x._spec.placements[i] for x in arrays}
        shards = {p for p in seen if p.is_shard()}
        if len(seen) == 1 and not (next(iter(seen)) == Shard(ax) and mesh.shape[i] > 1):
            out.append(next(iter(seen)))
        elif len(shards) == 1 and seen <= shards | {Replicate()} and \
                next(iter(shards)) != Shard(ax):
            out.append(next(iter(shards)))
        else:
            out.append(Replicate())
    return tuple(out)


def joining_mesh_dim(arrays, ax):
    """The first mesh dim (of more than one rank) that shards axis ``ax`` of some
    input, or None (then concatenate is a dim map and local). Local.

    Example: ``joining_mesh_dim([a, b], 0)`` of ``[Shard(0)]`` DTensors is 0.
    """
    for i, n in enumerate(arrays[0]._spec.mesh._mesh.shape):
        if n > 1:
            for x in arrays:
                p = x._spec.placements[i]
                if type(p) is Shard and p.dim == ax:  # Shard(ax), not a strided one
                    return i
    return None


def concatenate_sharded(name, arrays, ax, m):
    """``np.concatenate(arrays, axis=ax)`` of DTensors (checked by the caller: one
    mesh, equal other dims) when mesh dim ``m`` shards ``ax`` in some input: the
    result is ``Shard(ax)`` on ``m``, re-chunked by one exchange of rows along it.
    Collective on the mesh.

    Example: ``np.concatenate([a, b])`` of two ``[Shard(0)]`` 1-D DTensors is a
    ``[Shard(0)]`` DTensor; only rows whose owner changes move.
    """
    mesh = arrays[0]._spec.mesh
    dtype = np.result_type(*[x._spec.dtype for x in arrays])
    X.check_movable(name, dtype)
    target = _agreed(mesh, arrays, m, ax)
    arrays = [D.relayout(name, x, target) for x in arrays]
    lengths = [x._spec.shape[ax] for x in arrays]
    shape = list(arrays[0]._spec.shape)
    shape[ax] = total = sum(lengths)
    shape = tuple(shape)
    spec = DTensorSpec(mesh, target, shape, dtype, contiguous_strides(shape))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), dtype), spec)
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    blocks = [X.along(x.to_local(), ax) for x in arrays]
    send = np.concatenate([b.astype(dtype, copy=False) for b in blocks])
    ends = X.bounds(total, p)
    transfers = []
    base = np.zeros(p, np.int64)   # where input k's rows start in each rank's buffer
    start = 0
    for n in lengths:
        at = X.bounds(n, p)
        for c in range(p):
            size = int(at[c + 1] - at[c])
            for q, row, off, run in X.cut(ends, start + int(at[c]), size):
                transfers.append((c, int(base[c]) + off, q, row, run))
            base[c] += size
        start += n
    out = np.empty((int(ends[me + 1] - ends[me]),) + send.shape[1:], dtype)
    X.exchange(name, arrays[0]._spec, m, send, transfers, out)
    return DTensor(np.ascontiguousarray(np.moveaxis(out, 0, ax)), spec)


def _tuple(name, tup):
    if isinstance(tup, DTensor) or not hasattr(tup, "__iter__"):
        raise TypeError(f"{name}: arrays to stack must be passed as a sequence")
    return list(tup)


@_registry.implements(np.hstack)
def hstack(tup, *, dtype=None, casting="same_kind"):
    """``np.hstack`` of DTensors: ``np.concatenate`` of their ``atleast_1d`` forms
    along axis 0 for 1-D inputs, axis 1 otherwise. Local unless that axis is
    sharded (then one exchange of rows, no gather). Collective then.

    Example: ``np.hstack([a, b])`` of two ``[Shard(0)]`` 1-D DTensors is
    ``[Shard(0)]``.
    """
    arrs = [np.atleast_1d(x) for x in _tuple("numpy.hstack", tup)]
    axis = 0 if arrs and arrs[0].ndim == 1 else 1
    return np.concatenate(arrs, axis=axis, dtype=dtype, casting=casting)


@_registry.implements(np.vstack)
def vstack(tup, *, dtype=None, casting="same_kind"):
    """``np.vstack`` of DTensors: ``np.concatenate`` of their ``atleast_2d`` forms
    along axis 0. Local when axis 0 is not sharded (1-D inputs sharded along
    their only dim stay ``Shard(1)``); one exchange of rows otherwise.

    Example: ``np.vstack([a, b])`` of two (4, 3) ``[Shard(0)]`` DTensors is a
    (8, 3) ``[Shard(0)]`` DTensor.
    """
    arrs = [np.atleast_2d(x) for x in _tuple("numpy.vstack", tup)]
    return np.concatenate(arrs, axis=0, dtype=dtype, casting=casting)


@_registry.implements(np.dstack)
def dstack(tup):
    """``np.dstack`` of DTensors: ``np.concatenate`` of their ``atleast_3d`` forms
    along axis 2. Local unless axis 2 is sharded.

    Example: ``np.dstack([a, b])`` of two (4, 3) DTensors is (4, 3, 2).
    """
    arrs = [np.atleast_3d(x) for x in _tuple("numpy.dstack", tup)]
    return np.concatenate(arrs, axis=2)


@_registry.implements(np.column_stack)
def column_stack(tup):
    """``np.column_stack`` of DTensors: 1-D inputs become columns (a new axis 1,
    their Shard following their dim), the others stay; joined along axis 1. Local
    unless axis 1 of a 2-D input is sharded.

    Example: ``np.column_stack([a, b])`` of two (n,) ``[Shard(0)]`` DTensors is an
    (n, 2) ``[Shard(0)]`` DTensor, with no communication.
    """
    arrs = []
    for x in D.implicit(tuple(_tuple("numpy.column_stack", tup))):
        if type(x) is DTensor and x.ndim < 2:
            x = np.expand_dims(np.atleast_1d(x), 1)
        arrs.append(x)
    return np.concatenate(arrs, axis=1)


@_registry.implements(np.append)
def append(arr, values, axis=None):
    """``np.append`` with a DTensor: ``np.concatenate`` of the two (flattened when
    ``axis`` is None); a plain array beside the DTensor is taken as the same on
    every rank (Replicate, made locally). Local unless the joined axis is sharded
    (then one exchange of rows, no gather).

    Example: ``np.append(dt, [1.0, 2.0])`` of a (10,) ``[Shard(0)]`` DTensor is a
    (12,) ``[Shard(0)]`` DTensor.
    """
    mesh = next(x._spec.mesh for x in (arr, values) if type(x) is DTensor)
    pair = []
    for x in (arr, values):
        if type(x) is not DTensor:
            x = np.asarray(x)
            if axis is None:
                x = x.ravel()
            elif x.ndim == 0:
                raise ValueError("zero-dimensional arrays cannot be concatenated")
            x = np.ascontiguousarray(x)
            x = DTensor.from_local(x, mesh, [Replicate()] * mesh.ndim, shape=x.shape,
                                   stride=contiguous_strides(x.shape))
        elif axis is None and x.ndim != 1:
            x = np.ravel(x)
        pair.append(x)
    return np.concatenate(pair, axis=0 if axis is None else axis)
