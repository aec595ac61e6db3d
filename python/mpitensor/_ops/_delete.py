"""``np.delete``, ``np.compress`` and ``np.extract`` of a DTensor: the kept rows,
re-chunked by one exchange along a sharded axis, never gathered.

Which rows of the axis stay is known on every rank (``obj`` and ``condition`` are
the same everywhere), so every rank knows how many of each rank's rows stay and
where they land in the output's torch.chunk blocks: each rank keeps its own rows
and one all-to-all of variable parts along the mesh dim that shards the axis
(``_row_exchange``) moves those whose owner changes. Along an axis no mesh dim
shards, every rank selects its block and nothing moves. Selecting is linear, so a
Partial is kept. A DTensor ``obj`` or ``condition`` goes to the fallback.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._algorithms import _row_exchange as X

__all__ = ["delete", "compress", "extract"]


def _keep_rows(name, a, ax, keep):
    """``a`` with only the rows of axis ``ax`` where the bool array ``keep`` is
    True. Collective along the mesh dim that shards ``ax``, local otherwise."""
    X.check_movable(name, a._spec.dtype)
    a, m = X.sharding_mesh_dim(name, a, ax)
    spec = a._spec
    mesh = spec.mesh
    total = int(keep.sum())
    shape = spec.shape[:ax] + (total,) + spec.shape[ax + 1:]
    out_spec = DTensorSpec(mesh, spec.placements, shape, spec.dtype, contiguous_strides(shape))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), spec.dtype), out_spec)
    if m is None:
        return DTensor(np.ascontiguousarray(np.compress(keep, a.to_local(), axis=ax)),
                       out_spec)
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    at = X.bounds(spec.shape[ax], p)
    kept = np.array([keep[at[c]:at[c + 1]].sum() for c in range(p)], np.int64)
    src = np.concatenate([[0], np.cumsum(kept)])
    send = X.along(a.to_local(), ax)[keep[at[me]:at[me + 1]]]
    dst = X.bounds(total, p)
    out = np.empty((int(dst[me + 1] - dst[me]),) + send.shape[1:], spec.dtype)
    X.exchange(name, spec, m, np.ascontiguousarray(send), X.moves(src, dst, 0, 0, total), out)
    return DTensor(np.ascontiguousarray(np.moveaxis(out, 0, ax)), out_spec)


def _flat_or_axis(a, axis):
    if axis is None:
        return (a if a.ndim == 1 else np.ravel(a)), 0
    return a, normalize_axis_index(axis, a.ndim)


@_registry.implements(np.delete)
def delete(arr, obj, axis=None):
    """``np.delete`` of a DTensor (``obj`` an int, a slice, ints or a bool mask, the
    same on every rank): local along an axis no mesh dim shards; along a sharded
    one the kept rows are re-chunked by one exchange and the output stays sharded.
    Collective on the mesh then.

    Example: ``np.delete(dt, [0, 5])`` of a (10,) ``[Shard(0)]`` DTensor is an (8,)
    ``[Shard(0)]`` DTensor.
    """
    name = "numpy.delete"
    if type(arr) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(arr).__name__}")
    if isinstance(obj, DTensor):
        raise _registry.NoRule(f"{name}: a DTensor obj has no distributed rule")
    a, ax = _flat_or_axis(arr, axis)
    n = a.shape[ax]
    # NumPy's own reading of obj (and its errors, alike on every rank).
    keep = np.zeros(n, bool)
    keep[np.delete(np.arange(n), obj)] = True
    return _keep_rows(name, a, ax, keep)


@_registry.implements(np.compress)
def compress(condition, a, axis=None, out=None):
    """``np.compress`` of a DTensor by a 1-D bool condition the same on every rank:
    as :func:`delete` of the rows where it is False (or beyond its length).

    Example: ``np.compress([True, False, True], dt, axis=0)``.
    """
    name = "numpy.compress"
    if type(a) is not DTensor or isinstance(condition, DTensor) or out is not None:
        raise _registry.NoRule(f"{name}: only a DTensor a, with condition an array and "
                               f"no out=, has a distributed rule")
    a, ax = _flat_or_axis(a, axis)
    n = a.shape[ax]
    cond = np.asarray(condition).astype(bool).reshape(-1)
    if len(cond) > n:
        raise IndexError(f"index {n} is out of bounds for axis {ax} with size {n}")
    keep = np.zeros(n, bool)
    keep[:len(cond)] = cond
    return _keep_rows(name, a, ax, keep)


@_registry.implements(np.extract)
def extract(condition, arr):
    """``np.extract`` from a DTensor: the flattened ``arr`` where the flattened
    ``condition`` (a DTensor or an array the same on every rank, of ``arr``'s size)
    is nonzero: a bool mask on the flattened array (``dt[mask]``: each rank selects
    its own elements and one exchange re-chunks them), never a gather.

    Example: ``np.extract(dt > 0, dt)`` of a ``[Shard(0)]`` DTensor is ``[Shard(0)]``.
    """
    name = "numpy.extract"
    shape = condition.shape if type(condition) is DTensor else np.shape(condition)
    size = int(np.prod(shape))
    if type(arr) is not DTensor or size != int(np.prod(arr.shape)):
        raise _registry.NoRule(f"{name}: only a DTensor arr with a condition of its size "
                               f"has a distributed rule")
    flat = arr if arr.ndim == 1 else np.ravel(arr)
    if type(condition) is DTensor:
        mask = np.ravel(condition) if condition.ndim != 1 else condition
        return flat[mask != 0] if mask.dtype != np.bool_ else flat[mask]
    return compress(np.asarray(condition).reshape(-1) != 0, flat, axis=0)
