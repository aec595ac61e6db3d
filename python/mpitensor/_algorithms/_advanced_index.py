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
``full_tensor()``). Such an array among slices, None and ``...`` (``dt[:, [2, 0]]``)
picks along its own dim: ``np.take`` there, then the basic key of the rest
(``one_array`` splits the key).
"""

from __future__ import annotations

import numpy as np

from .. import _comm, _modes, _trace
from .._bind import core
from .._dtensor import DTensor, _grad_placements
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from . import _dispatch as D

__all__ = ["is_advanced", "getitem_mask", "getitem_points", "getitem_take", "mask_grad",
           "one_array", "point_arrays", "take_grad"]


def is_advanced(key) -> str | None:
    """"mask" or "take" for the advanced keys handled here, else None. Local."""
    if type(key) is DTensor:
        return "mask" if key.dtype == np.bool_ else None
    if isinstance(key, np.ndarray) and key.ndim >= 1:
        if key.dtype == np.bool_:
            return "mask"
        return "take" if key.dtype.kind in "iu" and key.ndim == 1 else None
    if type(key) is list and key and all(_is_int(k) for k in key):
        return "take"
    return None


def _is_int(k) -> bool:
    """An int index as NumPy reads one: a Python or NumPy integer, not a bool."""
    return isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))


def one_array(key, ndim: int):
    """(dim, indices, the rest of the key, front) of a tuple key that holds one
    integer array (as ``is_advanced`` takes it alone) among ints, slices, None and
    at most one ``...``: the array indexes input dim ``dim``, and the rest of the
    key is the key with ``slice(None)`` in its place, so that ``dt[key]`` is
    ``np.take(dt, indices, axis=dim)[rest]``, the array's dim where the rest puts
    it. That is NumPy's place for it unless ints are advanced indices apart from
    the array (a slice, None or ``...`` between them): NumPy puts its dim first,
    and ``front`` is then the position to move it from (else None). None for any
    other key. Local.

    Example: ``one_array((slice(None), [1, 0, 1]), 2) == (1, [1, 0, 1], (slice(None),
    slice(None)), None)``; ``one_array((0, slice(None), [1]), 3)[3] == 1``.
    """
    if type(key) is not tuple:
        return None
    at = [j for j, k in enumerate(key) if is_advanced(k) == "take"]
    ints = [j for j, k in enumerate(key) if _is_int(k)]
    if len(at) != 1 or not all(j == at[0] or j in ints or k is None or k is Ellipsis
                               or type(k) is slice for j, k in enumerate(key)):
        return None
    used = 1 + len(ints) + sum(type(k) is slice for k in key)
    ellipses = [j for j, k in enumerate(key) if k is Ellipsis]
    if used > ndim or len(ellipses) > 1:
        return None
    j = at[0]
    fill = ndim - used if ellipses and ellipses[0] < j else 0
    dim = sum(type(k) is slice or _is_int(k) for k in key[:j]) + fill
    advanced = sorted(ints + at)
    front = None
    if advanced[-1] - advanced[0] + 1 != len(advanced):
        front = sum(type(k) is slice or k is None for k in key[:j]) + fill
    return dim, key[j], key[:j] + (slice(None),) + key[j + 1:], front


def point_arrays(key, ndim: int):
    """The key as one index per dim when it is a tuple of integer arrays (two at
    least, or one DTensor; DTensors or arrays every rank holds alike) and ints, one
    per dim, as ``a[rows, cols]`` picks points; None for any other key. Local."""
    if type(key) is not tuple or len(key) != ndim:
        return None
    arrays = 0
    for k in key:
        if type(k) is DTensor:
            if k.dtype.kind not in "iu":
                return None
            arrays += 2
        elif isinstance(k, (np.ndarray, list)):
            if np.asarray(k).dtype.kind not in "iu":
                return None
            arrays += 1
        elif not _is_int(k):
            return None
    return key if arrays >= 2 else None


def getitem_points(dt, key):
    """``dt[i, j, ...]`` with an integer array (or int) per dim: the points at the
    broadcast indices, as NumPy picks them. Each index is checked against its dim
    (NumPy's IndexError on every rank), the flat positions are computed where the
    indices lie, and the elements are picked from the flattened array by them
    (rows of a sharded array come from their owners, never a gather). Collective on
    the mesh.

    Example: ``dt[np.argmax(dt, axis=0), np.arange(dt.shape[1])]`` is each
    column's largest element.
    """
    mesh = dt._spec.mesh
    shape = dt.shape
    idx = [k if type(k) is DTensor else np.asarray(k, dtype=np.intp) for k in key]
    for d, i in enumerate(idx):
        n = shape[d]
        bad = (i < -n) | (i >= n)
        if bool(np.any(bad).full_tensor() if type(bad) is DTensor else np.any(bad)):
            first = i[bad]
            first = first.full_tensor() if type(first) is DTensor else first
            raise IndexError(f"index {int(first.reshape(-1)[0])} is out of bounds for "
                             f"axis {d} with size {n}")
    flat, stride = 0, 1
    for d in reversed(range(len(shape))):
        flat = flat + np.where(idx[d] < 0, idx[d] + shape[d], idx[d]) * stride
        stride *= shape[d]
    if type(flat) is not DTensor:
        flat = DTensor.from_local(np.ascontiguousarray(flat, dtype=np.intp), mesh,
                                  [Replicate()] * mesh.ndim)
    return np.take(dt.reshape(-1), flat.astype(np.intp))


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
    p, c = mesh.shape[m], mesh._coordinate[m]
    counts = _comm.allgather_int(mesh, len(rows), m)
    start = int(sum(counts[:c]))
    total = int(sum(counts))
    shape = (total,) + tuple(shape[1:])
    bounds = np.concatenate([[0], np.cumsum(core.chunk_sizes(total, p))])
    lo = np.clip(bounds[:-1], start, start + len(rows))
    hi = np.clip(bounds[1:], start, start + len(rows))
    if _modes.tracing:
        _trace.collective(f"{name}: rows to their shards", mesh, placements, shape,
                          dt._spec.dtype)
    local, _ = _comm.alltoallv(mesh, np.ascontiguousarray(rows),
                                np.maximum(hi - lo, 0).tolist(), m)
    return _wrap(mesh, placements, shape, local, dt._spec.dtype)


class _MaskPlan:
    """How ``dt[mask]`` runs (see the module docstring): the placements ``dt``
    takes for the selection, this rank's part of the mask in them, the output's
    placements, the mesh dim whose ranks' selections are rebalanced (None: none),
    and the selected count when a plain mask tells it. ``dt`` itself is not moved
    here (the backward needs only where it would be). Collective where a DTensor
    mask must move."""

    def __init__(self, name, dt, mask):
        spec = dt._spec
        mesh = spec.mesh
        k = mask.ndim
        if k > len(spec.shape) or tuple(mask.shape) != spec.shape[:k]:
            raise IndexError(f"boolean index of shape {tuple(mask.shape)} does not match "
                             f"the DTensor's leading dims {spec.shape[:k]}")
        m = _row_group(dt)
        masked = [i for i, p in enumerate(spec.placements)
                  if p.is_shard() and p.dim < k and mesh.shape[i] > 1]
        placements = spec.placements
        if m is None or m == -1 or any(i != m for i in masked):
            if masked:
                placements = tuple(Replicate() if i in masked else p
                                   for i, p in enumerate(placements))
                m = None
        mask_pls = tuple(p if p.is_shard() and p.dim < k else Replicate()
                         for p in placements)
        if type(mask) is DTensor:
            if mask._spec.mesh != mesh:
                raise ValueError(f"{name}: the mask lives on another device mesh")
            mask = D.relayout(name, mask, mask_pls, records=True)
            self.local_mask = mask.to_local() if mesh._coordinate is not None else None
            self.count = None
        else:
            self.count = int(np.count_nonzero(mask))
            self.local_mask = None
            if mesh._coordinate is not None:
                lshape, off = local_shape_and_global_offset(mask.shape, mesh.shape,
                                                            mesh._coordinate, mask_pls)
                self.local_mask = mask[tuple(slice(o, o + n) for o, n in zip(off, lshape))]
        # A Shard of a masked dim left here is on a mesh dim of size 1: Replicate.
        out_pls = [(Shard(p.dim - k + 1) if p.dim >= k else Replicate()) if p.is_shard()
                   else p for p in placements]
        if m is not None:
            out_pls[m] = Shard(0)
        self.placements, self.m, self.out_pls, self.rest = placements, m, out_pls, spec.shape[k:]


def getitem_mask(dt, mask):
    """``dt[mask]`` for a bool mask of ``dt``'s leading dims (see the module
    docstring). Collective on the mesh when a masked dim is sharded.

    Example: ``dt[dt > 0]`` of a ``[Shard(0)]`` DTensor is ``[Shard(0)]``, 1-D.
    """
    name = "DTensor.__getitem__ (boolean mask)"
    plan = _MaskPlan(name, dt, mask)
    dt = D.relayout(name, dt, plan.placements)
    m, out_pls, rest = plan.m, plan.out_pls, plan.rest
    spec = dt._spec
    mesh = spec.mesh
    if mesh._coordinate is None:
        n = plan.count if plan.count is not None else 0
        return _wrap(mesh, out_pls, (n,) + rest, None, spec.dtype)
    rows = dt.to_local()[plan.local_mask]
    if m is not None:
        return _rebalance(name, dt, m, rows, out_pls, (0,) + rest)
    # The mask is replicated on every mesh dim: this rank's count is the total.
    return _wrap(mesh, out_pls, (len(rows),) + rest, rows, spec.dtype)


def mask_grad(g, dt, mask):
    """The gradient of ``dt[mask]`` for ``dt``: ``g`` written at the selected
    elements of zeros of ``dt``'s shape, in ``dt``'s placements. Where the forward
    rebalanced the rows, one all-to-all of variable parts sends each row of ``g``
    back to the rank that selected it. Collective where the forward was.

    Example: ``mask_grad(g, x, x.full_tensor() > 0)``.
    """
    name = "the backward of DTensor.__getitem__ (boolean mask)"
    plan = _MaskPlan(name, dt, mask)
    m, mesh = plan.m, dt._spec.mesh
    g = D.relayout(name, g, _grad_placements(plan.out_pls))
    if mesh._coordinate is None:
        gx = None
    else:
        gx = _zeros(dt, plan.placements, g.dtype)
        rows = g.to_local()
        if m is not None:
            rows = _return_rows(name, mesh, m, int(np.count_nonzero(plan.local_mask)),
                                rows, g)
        gx[plan.local_mask] = rows
    return _back(name, plan.placements, gx, g.dtype, dt)


def _return_rows(name, mesh, m, mine, rows, g):
    """The inverse of _rebalance: this rank's ``mine`` selected rows, back from the
    output shards of mesh dim ``m`` that hold them now."""
    p, c = mesh.shape[m], mesh._coordinate[m]
    counts = np.asarray(_comm.allgather_int(mesh, mine, m))
    starts = np.concatenate([[0], np.cumsum(counts)])
    total = int(starts[-1])
    bounds = np.concatenate([[0], np.cumsum(core.chunk_sizes(total, p))])
    lo = np.clip(starts[:-1], bounds[c], bounds[c + 1])
    hi = np.clip(starts[1:], bounds[c], bounds[c + 1])
    if _modes.tracing:
        _trace.collective(f"{name}: rows to the ranks that selected them", mesh,
                          g._spec.placements, g._spec.shape, g._spec.dtype)
    got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(rows), np.maximum(hi - lo, 0).tolist(), m)
    return got


def _zeros(dt, placements, dtype):
    """Zeros of this rank's part of ``dt`` were it laid out by ``placements``."""
    spec = dt._spec
    mesh = spec.mesh
    shape, _ = local_shape_and_global_offset(spec.shape, mesh.shape, mesh._coordinate,
                                             placements)
    return np.zeros(shape, dtype)


def _back(name, placements, gx, dtype, dt):
    """The local gradient ``gx`` of ``dt`` laid out by ``placements`` (where the
    forward took it), moved to ``dt``'s own placements (a Partial's: Replicate)."""
    spec = dt._spec
    out = _wrap(spec.mesh, _grad_placements(placements), spec.shape, gx, dtype)
    want = _grad_placements(spec.placements)
    return out if out._spec.placements == want else D.relayout(name, out, want)


class _TakePlan:
    """How ``dt[key]`` runs for an integer array ``key`` (see the module docstring):
    the indices (in range, non-negative), ``dt`` in the layout the pick uses, and
    the mesh dim that shards its dim 0 (None: none). Collective when ``dt`` must
    move."""

    def __init__(self, name, dt, key):
        spec = dt._spec
        if not spec.shape:
            raise IndexError("too many indices for DTensor: it is 0-dimensional")
        size = spec.shape[0]
        idx = np.asarray(key, np.int64)
        bad = (idx < -size) | (idx >= size)
        if bad.any():
            raise IndexError(f"index {int(idx[bad][0])} is out of bounds for axis 0 with "
                             f"size {size}")
        self.idx = idx % size if size else idx
        m = _row_group(dt)
        self.placements = spec.placements
        if m == -1:
            self.placements = tuple(Replicate() if p.is_shard() and p.dim == 0 else p
                                    for p in spec.placements)
            m = None
        self.m = m
        self.shape = (len(idx),) + spec.shape[1:]
        if m is not None and spec.mesh._coordinate is not None:
            mesh = spec.mesh
            p, c = mesh.shape[m], mesh._coordinate[m]
            own = np.concatenate([[0], np.cumsum(core.chunk_sizes(size, p))])
            owner = np.searchsorted(own, self.idx, "right") - 1
            out = np.concatenate([[0], np.cumsum(core.chunk_sizes(len(idx), p))])
            dest = np.searchsorted(out, np.arange(len(idx)), "right") - 1
            # The picked rows this rank owns (in output order: grouped by
            # destination), and the output rows it holds with their owners.
            self.mine = np.flatnonzero(owner == c)
            self.first = own[c]
            self.counts = np.bincount(dest[self.mine], minlength=p).tolist()
            self.here_owner = owner[out[c]:out[c + 1]]

    def out_placements(self):
        pls = list(self.placements)
        if self.m is not None:
            pls[self.m] = Shard(0)
        return pls


def getitem_take(dt, key):
    """``dt[[i, j, ...]]``: rows of dim 0 by an integer array the same on every rank
    (see the module docstring). Collective along the mesh dim that shards dim 0.

    Example: ``dt[[3, 0, 3]]`` of a ``[Shard(0)]`` DTensor is ``[Shard(0)]``.
    """
    name = "DTensor.__getitem__ (integer array)"
    plan = _TakePlan(name, dt, key)
    dt = D.relayout(name, dt, plan.placements)
    m, idx, shape = plan.m, plan.idx, plan.shape
    spec = dt._spec
    mesh = spec.mesh
    out_pls = plan.out_placements()
    if mesh._coordinate is None:
        return _wrap(mesh, out_pls, shape, None, spec.dtype)
    local = dt.to_local()
    if m is None:
        return _wrap(mesh, out_pls, shape, local[idx], spec.dtype)
    send = local[idx[plan.mine] - plan.first]
    if _modes.tracing:
        _trace.collective(f"{name}: rows to their shards", mesh, spec.placements,
                          shape, spec.dtype)
    got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(send), plan.counts, m)
    # Received by source rank, each in output order: place them.
    order = np.argsort(plan.here_owner, kind="stable")
    result = np.empty((len(order),) + got.shape[1:], spec.dtype)
    result[order] = got
    return _wrap(mesh, out_pls, shape, result, spec.dtype)


def take_grad(g, dt, key):
    """The gradient of ``dt[key]`` for ``dt`` (``key`` an integer array): the rows
    of ``g`` added into zeros of ``dt``'s shape at the rows ``key`` picked (a
    repeated index adds up, as np.add.at), in ``dt``'s placements. Where a mesh dim
    shards dim 0, one all-to-all of variable parts sends each row of ``g`` back to
    the rank that owns its row: the forward's exchange reversed. Collective where
    the forward was.

    Example: ``take_grad(g, x, [3, 0, 3])`` adds rows 0 and 2 of ``g`` into row 3.
    """
    name = "the backward of DTensor.__getitem__ (integer array)"
    plan = _TakePlan(name, dt, key)
    m, idx, mesh = plan.m, plan.idx, dt._spec.mesh
    g = D.relayout(name, g, _grad_placements(plan.out_placements()))
    if mesh._coordinate is None:
        gx = None
    else:
        gx = _zeros(dt, plan.placements, g.dtype)
        rows = g.to_local()
        if m is None:
            np.add.at(gx, idx, rows)
        else:
            order = np.argsort(plan.here_owner, kind="stable")
            counts = np.bincount(plan.here_owner, minlength=mesh.shape[m]).tolist()
            if _modes.tracing:
                _trace.collective(f"{name}: rows back to their owners", mesh,
                                  g._spec.placements, g._spec.shape, g._spec.dtype)
            got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(rows[order]), counts, m)
            np.add.at(gx, idx[plan.mine] - plan.first, got)
    return _back(name, plan.placements, gx, g.dtype, dt)
