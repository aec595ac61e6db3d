"""Boolean masks and integer arrays as DTensor keys: ``dt[mask]`` and ``dt[[3, 0, 7]]``.

A mask (a bool DTensor, or a plain bool ndarray the same on every rank) covers the
leading ``k`` dims of ``dt``; the selected elements form the output's dim 0. Each
rank selects from its own shard with its part of the mask (the mask moves to
``dt``'s layout first when its own differs; it is a byte per element):

- no mesh dim shards the masked dims: nothing moves; the other dims keep their
  placements (a Shard of dim ``d >= k`` becomes ``Shard(d - k + 1)``), and a
  Partial stays (selecting is linear);
- one mesh dim shards dim 0 of ``dt``: the selections, in order along that mesh
  dim, are the output's rows; one all-to-all of variable parts moves them to the
  usual (``torch.chunk``) shards of the output's dim 0: ``Shard(0)``;
- a mesh dim shards another masked dim: the masked dims are gathered first.

An integer array (a list or a plain 1-D ndarray of ints, the same on every rank)
picks rows of dim 0: local when dim 0 is not sharded; when one mesh dim shards it,
each rank sends the rows it owns straight to the ranks whose output shard lists
them (one all-to-all of variable parts), so the output is ``Shard(0)`` and the
array is never gathered. A DTensor of ints as key is a TypeError (index with its
``full_tensor()``).
"""

from __future__ import annotations

import numpy as np

from .. import _clib, _modes, _trace
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from . import _dispatch as D

__all__ = ["is_advanced", "getitem_mask", "getitem_take"]


def is_advanced(key) -> str | None:
    """"mask" or "take" for the advanced keys handled here, else None. Local."""
    if type(key) is DTensor:
        return "mask" if key.dtype == np.bool_ else None
    if isinstance(key, np.ndarray) and key.ndim >= 1:
        if key.dtype == np.bool_:
            return "mask"
        return "take" if key.dtype.kind in "iu" and key.ndim == 1 else None
    if type(key) is list and key and all(
            isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))
            for k in key):
        return "take"
    return None


def _row_group(dt):
    """The mesh dim that shards dim 0 of ``dt`` (None: no mesh dim longer than 1)."""
    mesh = dt._spec.mesh
    dims = [m for m, p in enumerate(dt._spec.placements)
            if p.is_shard() and p.dim == 0 and mesh.shape[m] > 1]
    return dims[0] if len(dims) == 1 else (None if not dims else -1)


def _wrap(mesh, placements, shape, local, dtype):
    if mesh._coordinate is None:
        local = np.empty((0,), dtype)
    return DTensor(local, DTensorSpec(mesh, tuple(placements), tuple(shape),
                                      np.dtype(dtype), contiguous_strides(tuple(shape))))


def _rebalance(name, dt, m, rows, placements, shape):
    """Rows selected on each rank, in order along mesh dim ``m``, moved to the usual
    shards of dim 0 of ``shape``: one all-to-all of variable parts."""
    mesh = dt._spec.mesh
    handle = mesh._handle
    p, c = mesh.shape[m], mesh._coordinate[m]
    counts = handle.allgather_int(len(rows), m)
    start = int(sum(counts[:c]))
    total = int(sum(counts))
    shape = (total,) + tuple(shape[1:])
    bounds = np.concatenate([[0], np.cumsum(_clib.chunk_sizes(total, p))])
    lo = np.clip(bounds[:-1], start, start + len(rows))
    hi = np.clip(bounds[1:], start, start + len(rows))
    if _modes.state.tracing:
        _trace.collective(f"{name}: rows to their shards", mesh, placements, shape,
                          dt._spec.dtype)
    local, _ = handle.alltoallv(np.ascontiguousarray(rows),
                                np.maximum(hi - lo, 0).tolist(), m)
    return _wrap(mesh, placements, shape, local, dt._spec.dtype)


def getitem_mask(dt, mask):
    """``dt[mask]`` for a bool mask of ``dt``'s leading dims (see the module
    docstring). Collective on the mesh when a masked dim is sharded.

    Example: ``dt[dt > 0]`` of a ``[Shard(0)]`` DTensor is ``[Shard(0)]``, 1-D.
    """
    name = "DTensor.__getitem__ (boolean mask)"
    spec = dt._spec
    mesh = spec.mesh
    k = mask.ndim
    if k > len(spec.shape) or tuple(mask.shape) != spec.shape[:k]:
        raise IndexError(f"boolean index of shape {tuple(mask.shape)} does not match "
                         f"the DTensor's leading dims {spec.shape[:k]}")
    m = _row_group(dt)
    masked = [i for i, p in enumerate(spec.placements)
              if p.is_shard() and p.dim < k and mesh.shape[i] > 1]
    if m is None or m == -1 or any(i != m for i in masked):
        if masked:
            dt = D.relayout(name, dt, [Replicate() if i in masked else p
                                       for i, p in enumerate(spec.placements)])
            spec = dt._spec
            m = None
    mask_pls = tuple(p if p.is_shard() and p.dim < k else Replicate()
                     for p in spec.placements)
    if type(mask) is DTensor:
        if mask._spec.mesh != mesh:
            raise ValueError(f"{name}: the mask lives on another device mesh")
        mask = D.relayout(name, mask, mask_pls, records=True)
        local_mask = mask.to_local() if mesh._coordinate is not None else None
        count = None
    else:
        count = int(np.count_nonzero(mask))
        local_mask = None
        if mesh._coordinate is not None:
            lshape, off = local_shape_and_global_offset(mask.shape, mesh.shape,
                                                        mesh._coordinate, mask_pls)
            local_mask = mask[tuple(slice(o, o + n) for o, n in zip(off, lshape))]
    rest = spec.shape[k:]
    # A Shard of a masked dim left here is on a mesh dim of size 1: Replicate.
    out_pls = [(Shard(p.dim - k + 1) if p.dim >= k else Replicate()) if p.is_shard()
               else p for p in spec.placements]
    if m is not None:
        out_pls[m] = Shard(0)
    if mesh._coordinate is None:
        n = count if count is not None else 0
        return _wrap(mesh, out_pls, (n,) + rest, None, spec.dtype)
    rows = dt.to_local()[local_mask]
    if m is not None:
        return _rebalance(name, dt, m, rows, out_pls, (0,) + rest)
    # The mask is replicated on every mesh dim: this rank's count is the total.
    return _wrap(mesh, out_pls, (len(rows),) + rest, rows, spec.dtype)


def getitem_take(dt, key):
    """``dt[[i, j, ...]]``: rows of dim 0 by an integer array the same on every rank
    (see the module docstring). Collective along the mesh dim that shards dim 0.

    Example: ``dt[[3, 0, 3]]`` of a ``[Shard(0)]`` DTensor is ``[Shard(0)]``.
    """
    name = "DTensor.__getitem__ (integer array)"
    spec = dt._spec
    mesh = spec.mesh
    if not spec.shape:
        raise IndexError("too many indices for DTensor: it is 0-dimensional")
    size = spec.shape[0]
    idx = np.asarray(key, np.int64)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise IndexError(f"index {int(idx[bad][0])} is out of bounds for axis 0 with "
                         f"size {size}")
    idx = idx % size if size else idx
    shape = (len(idx),) + spec.shape[1:]
    m = _row_group(dt)
    if m == -1:
        dt = D.relayout(name, dt, [Replicate() if p.is_shard() and p.dim == 0 else p
                                   for p in spec.placements])
        spec, m = dt._spec, None
    out_pls = list(spec.placements)
    if mesh._coordinate is None:
        return _wrap(mesh, out_pls, shape, None, spec.dtype)
    local = dt.to_local()
    if m is None:
        return _wrap(mesh, out_pls, shape, local[idx], spec.dtype)
    p, c = mesh.shape[m], mesh._coordinate[m]
    own = np.concatenate([[0], np.cumsum(_clib.chunk_sizes(size, p))])
    owner = np.searchsorted(own, idx, "right") - 1
    out = np.concatenate([[0], np.cumsum(_clib.chunk_sizes(len(idx), p))])
    dest = np.searchsorted(out, np.arange(len(idx)), "right") - 1
    # Rows this rank owns, by destination, in output order within each.
    mine = np.flatnonzero(owner == c)
    send = local[idx[mine] - own[c]]
    counts = np.bincount(dest[mine], minlength=p).tolist()
    if _modes.state.tracing:
        _trace.collective(f"{name}: rows to their shards", mesh, spec.placements,
                          shape, spec.dtype)
    got, _ = mesh._handle.alltoallv(np.ascontiguousarray(send), counts, m)
    # Received by source rank, each in output order: place them.
    here = np.arange(out[c], out[c + 1])
    order = np.argsort(owner[here], kind="stable")
    result = np.empty((len(here),) + got.shape[1:], spec.dtype)
    result[order] = got
    out_pls[m] = Shard(0)
    return _wrap(mesh, out_pls, shape, result, spec.dtype)
