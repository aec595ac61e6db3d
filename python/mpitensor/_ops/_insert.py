"""``np.insert`` into a DTensor: the old rows move by one exchange along a sharded
axis, as ``np.delete``'s kept rows do (``_delete``, ``_row_exchange``); never a
gather.

``obj`` and ``values`` are the same on every rank, so every rank knows where each
old row lands in the longer axis (NumPy's own reading of ``obj``: a stable sort
of the indices, each shifted by the insertions before it) and what each new row
holds. The old rows run in at most one more runs than there are insertions; each
run goes to the output's torch.chunk blocks by one all-to-all of variable parts
along the mesh dim that shards the axis, and each rank writes the new rows that
fall in its block from ``values`` (broadcast, and cut to its block of the other
dims). Along an axis no mesh dim shards, nothing moves. Inserting is not linear:
a Partial is reduced first.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import local_shape_and_global_offset
from ..placement_types import Partial, Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X

__all__ = ["insert"]


def _indices(obj, n):
    """NumPy's indices of ``obj`` on an axis of ``n`` rows (its errors too), and
    whether they name one place (an int, or a sequence of one)."""
    if isinstance(obj, slice):
        return np.arange(*obj.indices(n), dtype=np.intp)
    indices = np.array(obj)
    if indices.dtype == bool:
        if indices.ndim != 1:
            raise ValueError("boolean array argument obj to insert must be one dimensional")
        return np.flatnonzero(indices)
    if indices.ndim > 1:
        raise ValueError("index array argument obj to insert must be one dimensional "
                         "or scalar")
    return indices


def _plan(obj, values, shape, ax, dtype):
    """``(positions, rows)``: where the new rows go in the longer axis, and their
    values, broadcast to the new rows' global shape (a view). Local, with NumPy's
    errors."""
    n, ndim = shape[ax], len(shape)
    indices = _indices(obj, n)
    if indices.size == 1:
        index = indices.item()
        if index < -n or index > n:
            raise IndexError(f"index {obj} is out of bounds for axis {ax} with size {n}")
        index = index + n if index < 0 else index
        vals = np.array(values, copy=None, ndmin=ndim, dtype=dtype)
        if indices.ndim == 0:
            # NumPy's a[:, 0:1, :]-like reading of a scalar index.
            vals = np.moveaxis(vals, 0, ax)
        k = vals.shape[ax]
        positions = np.arange(index, index + k, dtype=np.intp)
    else:
        if indices.size == 0 and not isinstance(obj, np.ndarray):
            indices = indices.astype(np.intp)
        indices = indices.copy()
        indices[indices < 0] += n
        k = len(indices)
        order = indices.argsort(kind="mergesort")
        indices[order] += np.arange(k)
        # Out of range, or not integers: NumPy's IndexError from this same step.
        np.ones(n + k, bool)[indices] = False
        positions = indices.astype(np.intp)
        vals = np.asarray(values)
    rows = shape[:ax] + (k,) + shape[ax + 1:]
    return positions, np.broadcast_to(vals, rows)


def _old_runs(positions, n):
    """The runs ``(old_row, new_row, length)`` in which the ``n`` old rows land
    once new rows take ``positions``. Local."""
    keep = np.ones(n + len(positions), bool)
    keep[positions] = False
    at = np.flatnonzero(keep)
    if not n:
        return []
    cut = np.flatnonzero(np.diff(at) != 1) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [n]])
    return [(int(s), int(at[s]), int(e - s)) for s, e in zip(starts, ends)]


@_registry.implements(np.insert)
def insert(arr, obj, values, axis=None):
    """``np.insert`` into a DTensor (``obj`` and ``values`` the same on every rank):
    along a sharded axis the old rows move to the longer axis's shards by one
    exchange and each rank writes the new rows of its block; local along an axis
    no mesh dim shards. The output keeps the input's placements. Collective on
    the mesh when rows move.

    Example: ``np.insert(dt, 2, 0.0)`` of a (10,) ``[Shard(0)]`` DTensor is an
    (11,) ``[Shard(0)]`` DTensor.
    """
    name = "numpy.insert"
    if type(arr) is not DTensor or isinstance(obj, DTensor) or isinstance(values, DTensor):
        raise _registry.NoRule(f"{name}: only a DTensor arr, with obj and values arrays, "
                               f"has a distributed rule")
    X.check_movable(name, arr._spec.dtype)
    if axis is None:
        a, ax = (arr if arr.ndim == 1 else np.ravel(arr)), 0
    else:
        a, ax = arr, normalize_axis_index(axis, arr.ndim)
    if any(p.is_shard() and p.dim != ax and type(p) is not Shard for p in a._spec.placements):
        # Its block of another dim is no run of indices to cut the new rows by.
        raise _registry.NoRule(f"{name}: a strided shard of another dim has no rule")
    positions, rows = _plan(obj, values, tuple(a._spec.shape), ax, a._spec.dtype)
    if any(p.is_partial() for p in a._spec.placements):
        a = D.relayout(name, a, [Replicate() if isinstance(p, Partial) else p
                                 for p in a._spec.placements])
    a, m = X.sharding_mesh_dim(name, a, ax)
    spec = a._spec
    mesh = spec.mesh
    n, k = spec.shape[ax], len(positions)
    shape = spec.shape[:ax] + (n + k,) + spec.shape[ax + 1:]
    out_spec = DTensorSpec(mesh, spec.placements, shape, spec.dtype, contiguous_strides(shape))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), spec.dtype), out_spec)
    send = X.along(a.to_local(), ax)
    if m is None:
        lo, hi = 0, n + k
        out = np.empty((n + k,) + send.shape[1:], spec.dtype)
        for old, new, length in _old_runs(positions, n):
            out[new:new + length] = send[old:old + length]
    else:
        p, me = mesh.shape[m], mesh.get_coordinate()[m]
        src, dst = X.bounds(n, p), X.bounds(n + k, p)
        lo, hi = int(dst[me]), int(dst[me + 1])
        out = np.empty((hi - lo,) + send.shape[1:], spec.dtype)
        plan = [t for old, new, length in _old_runs(positions, n)
                for t in X.moves(src, dst, old, new, length)]
        X.exchange(name, spec, m, send, plan, out)
    mine = (positions >= lo) & (positions < hi)
    if mine.any():
        out[positions[mine] - lo] = _local_rows(spec, ax, rows)[mine]
    return DTensor(np.ascontiguousarray(np.moveaxis(out, 0, ax)), out_spec)


def _local_rows(spec, ax, rows):
    """The new rows, axis first, cut to this rank's block of the other dims."""
    local, offset = local_shape_and_global_offset(spec.shape, spec.mesh.shape,
                                                  spec.mesh.get_coordinate(), spec.placements)
    cut = tuple(slice(None) if d == ax else slice(offset[d], offset[d] + local[d])
                for d in range(len(spec.shape)))
    return np.moveaxis(rows[cut], ax, 0).astype(spec.dtype)
