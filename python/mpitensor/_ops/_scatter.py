"""Writes in place at positions that an index or a mask names, on DTensors:
``np.put_along_axis``, ``np.putmask`` and ``ufunc.at`` with a DTensor index.

The target keeps its placements and each write lands on the ranks that hold its
position. Where the positions are plain arrays (the same on every rank, as NumPy's
call on each rank takes them), every rank keeps the writes that fall in its own
block and nothing moves. Where they are a DTensor, the index is laid out beside the
target (the dims they share cut alike), so a rank's writes fall in its own block
except along the one mesh dim ``m`` that shards the axis the index runs along:
there each (position, value) goes to the owner of its row in one all-to-all of
variable parts along ``m``, as _pick.py sends indices to the rows' owners, and
the owner applies what it received in the order of the index, which is NumPy's
(the last write to a position wins; ``ufunc.at`` accumulates in that order). The
target is never gathered.

A Partial or strided target, a DTensor index or mask of a shape that broadcasts
rather than equals, and an axis cut by two mesh dims go to the fallback
(_fallback.py). A target that requires grad is refused in grad mode (a
RuntimeError, as every write in place: the write has no backward, and dropping the
gradient silently is not an answer): by the executor for the functions
(autograd/_rules.py's ``_WRITES``), by _ufunc_methods.py for ``ufunc.at``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _comm, _modes, _registry, _trace
from .._dtensor import DTensor
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _views
from .._algorithms import _row_exchange as X
from ._put import _target

__all__ = ["put_along_axis", "putmask", "ufunc_at_rows"]


def _box(spec):
    """This rank's block of ``spec`` as (sizes, offsets), or None outside the mesh."""
    if spec.mesh.get_coordinate() is None:
        return None
    return compute_local_shape_and_global_offset(spec.shape, spec.mesh, spec.placements)


def _write_mine(local, coords, values, sizes, offsets):
    """``local[coords - offsets] = values`` for the coordinates (global, one array
    per dim, in bounds) that fall in the block at ``offsets`` of ``sizes``, in
    their order."""
    mine = np.ones(coords[0].shape, bool)
    for c, o, s in zip(coords, offsets, sizes):
        mine &= (c >= o) & (c < o + s)
    local[tuple(c[mine] - o for c, o in zip(coords, offsets))] = values[mine]


def _rows_mesh_dim(name, spec, ax):
    """The mesh dim that cuts axis ``ax`` of the target (None when none does);
    NoRule when two do."""
    dims = [m for m, p in enumerate(spec.placements)
            if p.is_shard(ax) and spec.mesh.shape[m] > 1]
    if len(dims) > 1:
        raise _registry.NoRule(f"{name}: an axis cut by two mesh dims has no distributed "
                               f"rule")
    return dims[0] if dims else None


def _route(name, spec, m, ax, pos, values, out_axis):
    """Sends each write (``pos``: the global coordinate along ``ax`` of the target,
    rows of ``values`` its values) to the rank of mesh dim ``m`` that holds that
    coordinate, in order; returns what this rank received, in the index's order:
    (coordinates local to this rank's block, values). ``out_axis`` is the axis of
    ``values`` that ``pos`` runs along. Collective on mesh dim ``m``."""
    mesh = spec.mesh
    at = X.bounds(spec.shape[ax], mesh.shape[m])
    owner = np.searchsorted(at, pos, side="right") - 1
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=mesh.shape[m]).tolist()
    if _modes.tracing:
        _trace.collective(f"{name}: writes to their rows' owners", mesh, spec.placements,
                          spec.shape, spec.dtype)
    got_pos, _ = _comm.alltoallv(mesh, np.ascontiguousarray(pos[order], np.int64),
                                        counts, m)
    rows = np.ascontiguousarray(np.moveaxis(values, out_axis, 0)[order])
    got, _ = _comm.alltoallv(mesh, rows, counts, m)
    return got_pos - int(at[mesh.get_coordinate()[m]]), np.moveaxis(got, 0, out_axis)


def _beside(spec, ax, m):
    """The placements of a DTensor laid out beside the target ``spec``, equal to it
    in every dim but ``ax``: the target's Shards of other dims, Shard(ax) on mesh
    dim ``m``, Replicate elsewhere."""
    return tuple(Shard(ax) if i == m else
                 (p if p.is_shard() and p.dim != ax else Replicate())
                 for i, p in enumerate(spec.placements))


@_registry.implements(np.put_along_axis)
@_views.writes
def put_along_axis(arr, indices, values, axis):
    """``np.put_along_axis`` into a DTensor, in place. Plain indices (the same on
    every rank): each rank writes what falls in its block; local, any layout. A
    DTensor of indices with ``arr``'s shape in the other dims: laid out beside
    ``arr``, and when ``axis`` is sharded each (position, value) goes to the rank
    that holds it; collective on the mesh then. ``values``: a scalar, a plain
    array broadcast to the indices' shape, or a DTensor of that shape.

    ``axis=None`` writes flat positions, as ``np.put`` (plain indices and values).

    Example: ``np.put_along_axis(dt, np.argmax(dt, axis=1, keepdims=True), 0.0, axis=1)``.
    """
    name = "numpy.put_along_axis"
    arr = _target(name, arr)
    if axis is None:
        return _put_flat(name, arr, indices, values)
    ax = normalize_axis_index(axis, arr.ndim)
    if type(indices) is DTensor:
        return _put_along_by_dtensor(name, arr, indices, values, ax)
    if type(values) is DTensor:
        raise _registry.NoRule(f"{name}: DTensor values with plain indices have no "
                               f"distributed rule")
    indices = np.asarray(indices)
    fancy = _along_axis_index(arr.shape, indices, ax)
    try:
        fancy = list(np.broadcast_arrays(*fancy))
    except ValueError as e:
        raise IndexError(f"shape mismatch: indexing arrays could not be broadcast "
                         f"together ({e})") from None
    n = arr.shape[ax]
    i = fancy[ax]
    bad = i[(i < -n) | (i >= n)]
    if bad.size:
        raise IndexError(f"index {int(bad[0])} is out of bounds for axis {ax} with size {n}")
    fancy[ax] = np.where(i < 0, i + n, i)
    values = np.broadcast_to(np.asarray(values).astype(arr.dtype, copy=False), i.shape)
    box = _box(arr._spec)
    if box is not None:
        _write_mine(arr.to_local(), fancy, values, *box)
    return None


def _put_flat(name, arr, indices, values):
    """put_along_axis with ``axis=None``: NumPy's checks, then ``np.put``'s rule on
    the flat positions (plain indices and values only)."""
    if type(indices) is DTensor or type(values) is DTensor:
        raise _registry.NoRule(f"{name}: axis=None with DTensor indices or values has no "
                               f"distributed rule")
    indices = np.asarray(indices)
    if indices.ndim != 1:
        raise ValueError("when axis=None, `indices` must have a single dimension.")
    if indices.dtype.kind not in "iu":
        raise IndexError("`indices` must be an integer array")
    size = math.prod(arr.shape)
    bad = indices[(indices < -size) | (indices >= size)]
    if bad.size:
        raise IndexError(f"index {int(bad[0])} is out of bounds for axis 0 with size {size}")
    values = np.broadcast_to(np.asarray(values).astype(arr.dtype, copy=False), indices.shape)
    return np.put(arr, indices, values)


def _along_axis_index(shape, indices, ax):
    """NumPy's fancy index of put_along_axis (its checks, its errors): ``indices``
    along ``ax``, an arange shaped to broadcast along each other dim."""
    if indices.dtype.kind not in "iu":
        raise IndexError("`indices` must be an integer array")
    if len(shape) != indices.ndim:
        raise ValueError("`indices` and `arr` must have the same number of dimensions")
    nd = len(shape)
    return [indices if d == ax else np.arange(n).reshape((1,) * d + (-1,) + (1,) * (nd - d - 1))
            for d, n in enumerate(shape)]


def _checked_positions(name, mesh, local, n, ax):
    """``local`` (integer positions along an axis of length ``n``) made
    non-negative; NumPy's IndexError on every rank when any rank holds one out of
    bounds. Collective on the mesh."""
    bad = local[(local < -n) | (local >= n)]
    _comm.agree(mesh, not bad.size, 0,
                f"index {int(bad[0]) if bad.size else 0} is out of bounds for axis {ax} "
                f"with size {n}", IndexError)
    return np.where(local < 0, local + n, local)


def _put_along_by_dtensor(name, arr, indices, values, ax):
    D.same_mesh(name, (arr, indices))
    spec = arr._spec
    if indices.dtype.kind not in "iu":
        raise IndexError("`indices` must be an integer array")
    if indices.ndim != arr.ndim:
        raise ValueError("`indices` and `arr` must have the same number of dimensions")
    if any(indices.shape[d] != arr.shape[d] for d in range(arr.ndim) if d != ax):
        raise _registry.NoRule(f"{name}: DTensor indices that broadcast against arr have "
                               f"no distributed rule")
    X.check_movable(name, spec.dtype)
    m = _rows_mesh_dim(name, spec, ax)
    pls = _beside(spec, ax, m)
    indices = D.relayout(name, indices, pls)
    if type(values) is DTensor:
        if values.shape != indices.shape:
            raise _registry.NoRule(f"{name}: DTensor values of another shape than the "
                                   f"indices have no distributed rule")
        D.same_mesh(name, (arr, values))
        values = D.relayout(name, values, pls)
        local_values = None if _box(spec) is None else values.to_local()
    else:
        whole = np.broadcast_to(np.asarray(values).astype(arr.dtype, copy=False),
                                indices.shape)
        ibox = _box(indices._spec)
        local_values = None if ibox is None else whole[
            tuple(slice(o, o + s) for s, o in zip(*ibox))]
    box = _box(spec)
    if box is None:
        return None
    n = arr.shape[ax]
    pos = _checked_positions(name, spec.mesh, indices.to_local().astype(np.intp), n, ax)
    local_values = local_values.astype(arr.dtype, copy=False)
    if m is not None:
        # The other dims' positions are the block's own: they travel as a flat
        # index of the block's other dims beside the axis position.
        shape = pos.shape[:ax] + (1,) + pos.shape[ax + 1:]
        other = np.indices(pos.shape)
        other[ax] = 0
        flat = np.ravel_multi_index(tuple(other), shape)
        mesh = spec.mesh
        at = X.bounds(n, mesh.shape[m])
        owner = np.searchsorted(at, pos.ravel(), side="right") - 1
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=mesh.shape[m]).tolist()
        if _modes.tracing:
            _trace.collective(f"{name}: writes to their rows' owners", mesh,
                              spec.placements, spec.shape, spec.dtype)
        pairs = np.stack([pos.ravel(), flat.ravel()], axis=1)[order]
        got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(pairs, np.int64), counts, m)
        vals, _ = _comm.alltoallv(mesh,
            np.ascontiguousarray(local_values.ravel()[order]), counts, m)
        local = arr.to_local()
        coords = list(np.unravel_index(got[:, 1], shape)) if got.size else \
            [np.zeros(0, np.intp)] * arr.ndim
        coords[ax] = got[:, 0] - int(at[mesh.get_coordinate()[m]])
        local[tuple(coords)] = vals
        return None
    np.put_along_axis(arr.to_local(), pos, local_values, ax)
    return None


@_registry.implements(np.putmask)
@_views.writes
def putmask(a, mask, values):
    """``np.putmask`` into a DTensor, in place: each True position ``n`` (flat, C
    order) of ``mask`` takes ``values.flat[n % values.size]``. A plain mask and
    values (the same on every rank) are read at the block's positions: local. A
    DTensor mask or values of ``a``'s shape are laid out as ``a`` first
    (collective on the mesh when they move).

    Example: ``np.putmask(dt, dt < 0, 0.0)``.
    """
    name = "numpy.putmask"
    a = _target(name, a)
    spec = a._spec
    if type(mask) is DTensor:
        if mask.shape != a.shape:
            raise ValueError("putmask: mask and data must be the same size")
        D.same_mesh(name, (a, mask))
        mask = D.relayout(name, mask, spec.placements)
        local_mask = lambda box: mask.to_local().astype(bool, copy=False)  # noqa: E731
    else:
        whole_mask = np.asarray(mask).astype(bool, copy=False)
        if whole_mask.size != math.prod(a.shape):
            raise ValueError("putmask: mask and data must be the same size")
        whole_mask = whole_mask.reshape(a.shape)
        local_mask = lambda box: whole_mask[box]  # noqa: E731
    if type(values) is DTensor:
        if values.shape != a.shape:
            raise _registry.NoRule(f"{name}: DTensor values of another shape than the "
                                   f"target have no distributed rule")
        D.same_mesh(name, (a, values))
        values = D.relayout(name, values, spec.placements)
        pick = lambda box, where, flat: values.to_local()[where]  # noqa: E731
    else:
        flat_values = np.asarray(values).astype(a.dtype).ravel()
        if flat_values.size == 0:
            return None
        pick = lambda box, where, flat: flat_values[flat % flat_values.size]  # noqa: E731
    sizes_offsets = _box(spec)
    if sizes_offsets is None:
        return None
    sizes, offsets = sizes_offsets
    box = tuple(slice(o, o + s) for s, o in zip(sizes, offsets))
    local = a.to_local()
    if a.ndim == 0:
        if local_mask(box):
            local[()] = pick(box, (), np.intp(0))
        return None
    where = np.nonzero(local_mask(box))
    flat = np.ravel_multi_index(tuple(w + o for w, o in zip(where, offsets)), a.shape)
    local[where] = pick(box, where, flat)
    return None


def ufunc_at_rows(ufunc, label, a, idx, b):
    """``ufunc.at(a, idx[, b])`` in place for an integer DTensor ``idx`` naming
    rows (dim 0) of the DTensor ``a``: ``b`` None (a one-operand ufunc), a scalar,
    a plain array (the same on every rank) or a DTensor, broadcast to
    ``idx.shape + a.shape[1:]``. Each (row, value) goes to the rank that holds the
    row, along the mesh dim that cuts dim 0 (one all-to-all of the rows' indices,
    one of the values); nothing moves otherwise. NumPy's IndexError on every rank
    for an index out of bounds. Collective on the mesh.

    Example: ``ufunc_at_rows(np.add, "numpy.add.at", dt, idx, 1.0)``.
    """
    D.same_mesh(label, (a, idx))
    spec = a._spec
    if idx.dtype.kind not in "iu":
        raise _registry.NoRule(f"{label}: a DTensor index that is not integers has no "
                               f"distributed rule")
    if a.ndim == 0:
        raise IndexError("too many indices for array: array is 0-dimensional, but 1 "
                         "were indexed")
    X.check_movable(label, spec.dtype)
    m = _rows_mesh_dim(label, spec, 0)
    flat = np.ravel(idx)
    k = flat.shape[0]
    vshape = (k,) + tuple(spec.shape[1:])
    # The index (and the values' rows) cut along m, the values' other dims as a's.
    ipls = tuple(Shard(0) if i == m else Replicate() for i in range(spec.mesh.ndim))
    vpls = _beside(spec, 0, m)
    flat = D.relayout(label, flat, ipls)
    local_b, scalar = None, b is not None and type(b) is not DTensor and np.ndim(b) == 0
    if scalar:
        # A scalar stays as given (NumPy's casting of a Python scalar is its own).
        b, scalar = None, (b,)
    if type(b) is DTensor:
        D.same_mesh(label, (a, b))
        if b.shape != idx.shape + tuple(spec.shape[1:]):
            raise _registry.NoRule(f"{label}: DTensor values of another shape than the "
                                   f"index's rows have no distributed rule")
        b = D.relayout(label, np.reshape(b, vshape), vpls)
    ibox, box = _box(flat._spec), _box(spec)
    if box is None:
        return None
    if type(b) is DTensor:
        local_b = b.to_local()
    elif b is not None:
        whole = np.broadcast_to(np.asarray(b), vshape)
        rows = slice(ibox[1][0], ibox[1][0] + ibox[0][0])
        local_b = whole[(rows,) + tuple(slice(o, o + s) for s, o in
                                        zip(box[0][1:], box[1][1:]))]
    n = spec.shape[0]
    pos = _checked_positions(label, spec.mesh, flat.to_local().astype(np.intp), n, 0)
    local = a.to_local()
    if m is None:
        rows = pos
    else:
        carried = np.zeros((pos.shape[0], 0), local.dtype) if local_b is None else local_b
        rows, got = _route(label, spec, m, 0, pos, carried, 0)
        local_b = None if local_b is None else got
    if scalar:
        ufunc.at(local, rows, *scalar)
    elif local_b is None:
        ufunc.at(local, rows)
    else:
        ufunc.at(local, rows, local_b)
    return None
