"""Writes by position in the flattened array, in place, on DTensors: ``np.put``
(flat indices) and ``np.place`` (the True positions of a mask, in C order).

Both name positions of the whole array, and every rank can find which of them
fall in its own block: ``put``'s indices and values, and ``place``'s values (and
its mask when it is a plain array), are the same on every rank, as NumPy's call on
each rank would take them, so each rank writes its part and nothing moves.
``place`` with a DTensor mask needs, on each rank, how many True positions come
before its block: one exclusive scan of a count over the mesh dims that shard the
rows, for a target cut by rows only (Shard(0) on some mesh dims, Replicate on the
others), where C order runs rank after rank. Other layouts, a Partial target and a
DTensor as indices or values go to the fallback. A target that requires grad is
refused in grad mode by the executor (a RuntimeError, as every write in place:
autograd/_rules.py's ``_WRITES``), before the rule runs.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _modes, _registry
from .._clib import CORE
from .._dtensor import DTensor
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Shard
from .._algorithms import _dispatch as D
from .._algorithms import _views
from ._along_axis import _offsets
from ._select import _everywhere

__all__ = ["put", "place"]


def _target(name, a):
    """The DTensor ``a`` written in place, when a rule covers it: an ndarray target
    takes NumPy's write of the gathered values (the fallback)."""
    if type(a) is not DTensor:
        raise _registry.NoRule(f"{name}: a DTensor written into a {type(a).__name__} "
                               f"has no distributed rule")
    if (any(p.is_partial() or (p.is_shard() and type(p) is not Shard)
            for p in a._spec.placements)
            or (a.requires_grad and _modes.state.grad_enabled)):
        raise _registry.NoRule(f"{name}: a Partial or strided target, or one that "
                               f"requires grad, has no distributed rule")
    return a


def _block(a):
    """(this rank's block as slices of the global array, its local array), or None
    on a rank outside the mesh."""
    spec = a._spec
    if spec.mesh.get_coordinate() is None:
        return None
    sizes, offsets = compute_local_shape_and_global_offset(spec.shape, spec.mesh,
                                                           spec.placements)
    return tuple(slice(o, o + s) for o, s in zip(offsets, sizes)), a.to_local()


@_registry.implements(np.put)
@_views.writes
def put(a, ind, v, mode="raise"):
    """``np.put`` into a DTensor, with indices and values every rank passes alike:
    each rank writes the indices that land in its block (the last value given to
    an index wins, as in NumPy's loop); NumPy's IndexError for an index out of
    bounds under ``mode="raise"``, on every rank. Local.

    Example: ``np.put(dt, [0, 7], [-1.0, -2.0])``.
    """
    name = "numpy.put"
    a = _target(name, a)
    if type(ind) is DTensor or type(v) is DTensor:
        raise _registry.NoRule(f"{name}: DTensor indices or values have no distributed "
                               f"rule")
    if mode not in ("raise", "wrap", "clip"):
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    ind = np.asarray(ind).astype(np.intp).ravel()
    v = np.asarray(v).astype(a.dtype).ravel()
    size = math.prod(a.shape)
    if ind.size == 0:
        return None
    if size == 0:
        raise IndexError("cannot replace elements of an empty array")
    if v.size == 0:
        return None
    if mode == "raise":
        bad = ind[(ind < -size) | (ind >= size)]
        if bad.size:
            raise IndexError(f"index {bad[0]} is out of bounds for axis 0 with size {size}")
        ind = np.where(ind < 0, ind + size, ind)
    elif mode == "wrap":
        ind = ind % size
    else:
        ind = np.clip(ind, 0, size - 1)
    vals = v[np.arange(ind.size) % v.size]
    # The last write to an index is the one NumPy leaves.
    ind, last = np.unique(ind[::-1], return_index=True)
    vals = vals[::-1][last]
    block = _block(a)
    if block is None:
        return None
    box, local = block
    if a.ndim == 0:
        local[()] = vals[-1]
        return None
    where = np.unravel_index(ind, a.shape)
    mine = np.ones(ind.shape, bool)
    for c, s in zip(where, box):
        mine &= (c >= s.start) & (c < s.stop)
    local[tuple(c[mine] - s.start for c, s in zip(where, box))] = vals[mine]
    return None


def _rows_dims(spec):
    """The mesh dims that shard dim 0, outermost first, when every other mesh dim
    replicates (C order then runs rank after rank along them); None otherwise."""
    dims = []
    for m, p in enumerate(spec.placements):
        if p.is_shard() and p.dim == 0:
            dims.append(m)
        elif not p.is_replicate():
            return None
    return dims


@_registry.implements(np.place)
@_views.writes
def place(arr, mask, vals):
    """``np.place`` into a DTensor: the k-th True position of ``mask`` in C order
    takes ``vals[k % len(vals)]``. With a plain mask (the same on every rank) each
    rank counts the Trues before its own positions itself: local, any Shard or
    Replicate layout. With a DTensor mask of the target's shape, for a target cut
    by rows only: the mask laid out as the target, and one exclusive scan of a
    count over the mesh dims that shard the rows. Collective on the mesh then.

    Example: ``np.place(dt, dt > 2, [44.0, 55.0])``.
    """
    name = "numpy.place"
    arr = _target(name, arr)
    if type(vals) is DTensor:
        raise _registry.NoRule(f"{name}: DTensor values have no distributed rule")
    vals = np.asarray(vals).astype(arr.dtype).ravel()
    size = math.prod(arr.shape)
    if type(mask) is DTensor:
        return _place_by_scan(name, arr, mask, vals)
    mask = np.asarray(mask).astype(bool, copy=False)
    if mask.size != size:
        raise ValueError("place: mask and data must be the same size")
    flat = mask.ravel()
    if vals.size == 0:
        if flat.any():
            raise ValueError("Cannot insert from an empty array!")
        return None
    block = _block(arr)
    if block is None:
        return None
    box, local = block
    whole = flat.reshape(arr.shape)
    before = (np.cumsum(flat) - 1).reshape(arr.shape)  # each True's rank in C order
    mine = whole[box]
    local[mine] = vals[before[box][mine] % vals.size]
    return None


def _place_by_scan(name, arr, mask, vals):
    D.same_mesh(name, (arr, mask))
    if mask.shape != arr.shape:
        if math.prod(mask.shape) != math.prod(arr.shape):
            raise ValueError("place: mask and data must be the same size")
        raise _registry.NoRule(f"{name}: a DTensor mask of another shape has no "
                               f"distributed rule")
    spec = arr._spec
    dims = _rows_dims(spec) if arr.ndim else None
    if dims is None:
        raise _registry.NoRule(f"{name}: with a DTensor mask the target must be cut by "
                               f"rows only")
    mask = D.relayout(name, mask, spec.placements)
    mesh = spec.mesh
    coord = mesh.get_coordinate()
    local_mask = mask.to_local().astype(bool, copy=False) if coord is not None else None
    count = 0 if coord is None else int(np.count_nonzero(local_mask))
    if vals.size == 0:
        if not _everywhere(mesh, count == 0):
            raise ValueError("Cannot insert from an empty array!")
        return None
    if coord is None:
        return None
    before = _offsets(mesh, np.array([count], np.int64), dims, coord, CORE.REDUCE_SUM)
    start = 0 if before is None else int(before[0])
    arr.to_local()[local_mask] = vals[(start + np.arange(count)) % vals.size]
    return None
