"""``np.unique`` of a sharded DTensor on the distributed sample sort, without a
gather: the values, and ``return_index``, ``return_inverse``, ``return_counts``;
and ``np.union1d``, the unique values of two arrays joined.

The flattened array is sorted by the sample sort (``_sample_sort.sort_flat``,
stable, so its argsort lists equal values in index order) into torch.chunk's
blocks along the one mesh dim that shards it. A sorted position starts a new
value when it differs from the one before; the one before a rank's first element
is the last element of the nearest non-empty rank before it (one all-gather of a
value per rank). Then each rank knows its unique values, the index of their first
occurrence (the argsort at those positions), and where each run of equal values
ends (the next start, on this rank or the first start of a later one: one
all-gather of an int per rank), hence the counts. The outputs are re-chunked into
torch.chunk's blocks of their length by one exchange each (``_row_exchange``),
``Shard(0)`` on that mesh dim. The inverse is each sorted position's value number
sent back to the rank that holds its original position (one all-to-all of index
pairs). NaNs count as one value (``equal_nan=True``). ``axis=``, other dtypes
and arrays sharded along two mesh dims go to the fallback.
"""

from __future__ import annotations

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from . import _dispatch as D
from . import _row_exchange as X
from . import _sample_sort as S

__all__ = ["unique", "union1d"]


def _differs(u, w):
    """Elementwise ``u != w``, NaN equal to NaN."""
    d = u != w
    if u.dtype.kind == "f":
        d &= ~(np.isnan(u) & np.isnan(w))
    return d


def _previous_last(name, vals, m, p, me, sizes):
    """The last sorted value of the nearest non-empty rank before this one on mesh
    dim ``m``, or None. Collective along ``m`` (an all-gather of a value per rank)."""
    mesh = vals._spec.mesh
    local = vals.to_local()
    mine = local[-1:] if len(local) else np.zeros(1, local.dtype)
    pls = [Shard(0) if i == m else Replicate() for i in range(mesh.ndim)]
    lasts = DTensor.from_local(np.ascontiguousarray(mine), mesh, pls, shape=(p,), stride=(1,))
    lasts = D.relayout(name, lasts, [Replicate()] * mesh.ndim, records=True).to_local()
    before = [c for c in range(me) if sizes[c] > 0]
    return lasts[before[-1]] if before else None


def _rechunk(name, spec, m, local, starts, total):
    """This rank's block (torch.chunk's) of a 1-D array whose rank ``c`` holds rows
    ``[starts[c], starts[c + 1])``. Collective along ``m``."""
    p, me = spec.mesh.shape[m], spec.mesh.get_coordinate()[m]
    dst = X.bounds(total, p)
    out = np.empty((int(dst[me + 1] - dst[me]),), local.dtype)
    return X.exchange(name, spec, m, np.ascontiguousarray(local),
                      X.moves(starts, dst, 0, 0, total), out)


def _inverse(name, ar, m, order, ids):
    """The value number of every element of ``ar`` in its shape: the number of each
    sorted position sent to the rank that holds its original (flat) position.
    Collective on the mesh."""
    spec = ar._spec
    mesh = spec.mesh
    n = int(np.prod(spec.shape))
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    at = X.bounds(n, p)
    dest = np.searchsorted(at[1:], order, side="right")
    sort = np.argsort(dest, kind="stable")
    records = np.stack([order, ids], axis=1).astype(np.int64)[sort]
    got, _ = mesh._handle.alltoallv(np.ascontiguousarray(records),
                                    np.bincount(dest, minlength=p).tolist(), m)
    flat = np.empty(int(at[me + 1] - at[me]), np.intp)
    flat[got[:, 0] - at[me]] = got[:, 1]
    pls = tuple(Shard(0) if i == m else Replicate() for i in range(mesh.ndim))
    out = DTensor(flat, DTensorSpec(mesh, pls, (n,), np.dtype(np.intp), (1,)))
    return out if ar.ndim == 1 else np.reshape(out, spec.shape)


@_registry.implements(np.unique)
def unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None,
           *, equal_nan=True, sorted=True):
    """``np.unique`` of a DTensor (``axis=None``): on a sharded one, the sample sort
    and a few all-gathers of one number per rank find the values, the first
    indices and the counts where they lie; each comes out ``Shard(0)`` along the
    mesh dim that shards the input, re-chunked by one exchange; the inverse takes
    one all-to-all of index pairs. A replicated input runs NumPy locally.
    Collective on the mesh.

    Example: ``vals, counts = np.unique(dt, return_counts=True)``.
    """
    name = "numpy.unique"
    if type(ar) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(ar).__name__}")
    if axis is not None or not sorted:
        # sorted=False lets NumPy choose an order, which only NumPy can reproduce.
        raise _registry.NoRule(f"{name}: axis= and sorted=False have no distributed rule")
    if ar._spec.dtype.kind not in "biuf" or not equal_nan:
        raise _registry.NoRule(f"{name}: dtype {ar._spec.dtype} (or equal_nan=False) has "
                               f"no distributed rule")
    if any(p.is_partial() for p in ar._spec.placements):
        # Equality is not linear: the values are summed first.
        ar = D.relayout(name, ar, [Replicate() if p.is_partial() else p
                                   for p in ar._spec.placements])
    spec = ar._spec
    mesh = spec.mesh
    want = (return_index, return_inverse, return_counts)
    if not any(p.is_shard() and mesh.shape[i] > 1 for i, p in enumerate(spec.placements)):
        return _replicated(ar, want)
    m = S.sort_mesh_dim(ar)
    if m is None or mesh.get_coordinate() is None:
        raise _registry.NoRule(f"{name}: an array sharded along two mesh dims has no "
                               f"distributed rule")
    n = int(np.prod(spec.shape))
    vals = S.sort_flat(name, ar, False)
    order = S.sort_flat(name, ar, True).to_local() if (return_index or return_inverse) \
        else None
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    at = X.bounds(n, p)
    sizes = np.diff(at)
    x = vals.to_local()
    prev = _previous_last(name, vals, m, p, me, sizes)
    flag = np.ones(len(x), bool)
    if len(x):
        flag[1:] = _differs(x[1:], x[:-1])
        if prev is not None:
            flag[0] = _differs(x[:1], np.asarray([prev], x.dtype))[0]
    here = np.flatnonzero(flag) + int(at[me])
    k = len(here)
    counts_of = mesh._handle.allgather_int(k, m)
    firsts = mesh._handle.allgather_int(int(here[0]) if k else n, m)
    starts = np.concatenate([[0], np.cumsum(counts_of)]).astype(np.int64)
    total = int(starts[-1])
    pls = tuple(Shard(0) if i == m else Replicate() for i in range(mesh.ndim))

    def wrap(local, dtype):
        return DTensor(np.ascontiguousarray(local, dtype),
                       DTensorSpec(mesh, pls, (total,), np.dtype(dtype), (1,)))

    out = [wrap(_rechunk(name, vals._spec, m, x[flag], starts, total), spec.dtype)]
    if return_index:
        out.append(wrap(_rechunk(name, vals._spec, m, order[flag].astype(np.intp), starts,
                                 total), np.intp))
    if return_inverse:
        ids = int(starts[me]) + np.cumsum(flag) - 1
        out.append(_inverse(name, ar, m, order.astype(np.int64), ids))
    if return_counts:
        end = min([f for f in firsts[me + 1:]] + [n])
        counts = np.diff(np.append(here, end)).astype(np.intp)
        out.append(wrap(_rechunk(name, vals._spec, m, counts, starts, total), np.intp))
    return out[0] if len(out) == 1 else tuple(out)


def _replicated(ar, want):
    """np.unique on each rank's whole copy: Replicate results (a Replicate input's
    other mesh dims hold the whole array too). Local."""
    mesh = ar._spec.mesh
    local = ar.to_local() if mesh.get_coordinate() is not None else np.zeros(0, ar.dtype)
    got = np.unique(local, *want)
    got = got if isinstance(got, tuple) else (got,)
    out = []
    for g in got:
        g = np.ascontiguousarray(g)
        out.append(DTensor(g, DTensorSpec(mesh, (Replicate(),) * mesh.ndim, g.shape, g.dtype,
                                          contiguous_strides(g.shape))))
    return out[0] if len(out) == 1 else tuple(out)


@_registry.implements(np.union1d)
def union1d(ar1, ar2):
    """``np.union1d`` with a DTensor: ``np.unique`` of both flattened and joined
    (``np.append``: one exchange of rows when sharded), so nothing is gathered; a
    plain array beside the DTensor is taken as the same on every rank. Collective
    on the mesh.

    Example: ``np.union1d(dt, [0, 99])`` of a ``[Shard(0)]`` DTensor is ``[Shard(0)]``.
    """
    return np.unique(np.append(ar1, ar2))
