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
pairs). NaNs count as one value (``equal_nan=True``) or one each
(``equal_nan=False``). ``axis=``, other dtypes and arrays sharded along two mesh
dims go to the fallback.

The array API's ``unique_counts``, ``unique_inverse`` and ``unique_all`` are
NumPy's sorted ``unique`` without ``equal_nan``, so they run on the same steps;
one form does not: NumPy's ``unique_inverse`` numbers the NaNs of a float array
in the order of its unstable sort, which no other sort reproduces, so a float
array with a NaN (known after one all-reduce of a count) goes to the fallback.
``unique_values`` is sorted too, for every dtype: NumPy lists integers in the
order of a hash set, which depends on how the array was laid out in one
process, while the standard leaves the order open and the libraries written on
it (scikit-learn's label encoders above all) expect ``np.unique``'s order.
"""

from __future__ import annotations

import numpy as np
from numpy.lib._arraysetops_impl import UniqueAllResult as _UniqueAll
from numpy.lib._arraysetops_impl import UniqueCountsResult as _UniqueCounts
from numpy.lib._arraysetops_impl import UniqueInverseResult as _UniqueInverse

from .. import _comm, _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X
from .._algorithms import _sample_sort as S

__all__ = ["unique", "union1d", "unique_values", "unique_counts", "unique_inverse",
           "unique_all"]


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
    got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(records),
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
    if ar._spec.dtype.kind not in "biuf":
        raise _registry.NoRule(f"{name}: dtype {ar._spec.dtype} has no distributed rule")
    if any(p.is_partial() for p in ar._spec.placements):
        # Equality is not linear: the values are summed first.
        ar = D.relayout(name, ar, [Replicate() if p.is_partial() else p
                                   for p in ar._spec.placements])
    spec = ar._spec
    mesh = spec.mesh
    want = (return_index, return_inverse, return_counts)
    if not any(p.is_shard() and mesh.shape[i] > 1 for i, p in enumerate(spec.placements)):
        return _replicated(ar, want, equal_nan)
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
        # Without equal_nan every NaN is a value of its own, as NumPy's != says.
        differs = _differs if equal_nan else np.not_equal
        flag[1:] = differs(x[1:], x[:-1])
        if prev is not None:
            flag[0] = differs(x[:1], np.asarray([prev], x.dtype))[0]
    here = np.flatnonzero(flag) + int(at[me])
    k = len(here)
    counts_of = _comm.allgather_int(mesh, k, m)
    firsts = _comm.allgather_int(mesh, int(here[0]) if k else n, m)
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


def _replicated(ar, want, equal_nan=True):
    """np.unique on each rank's whole copy: Replicate results (a Replicate input's
    other mesh dims hold the whole array too). Local."""
    mesh = ar._spec.mesh
    local = ar.to_local() if mesh.get_coordinate() is not None else np.zeros(0, ar.dtype)
    got = np.unique(local, *want, equal_nan=equal_nan)
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


def _dtensor_arg(name, x):
    if type(x) is not DTensor:
        raise _registry.NoRule(f"{name}: expected a DTensor, got {type(x).__name__}")
    return x


@_registry.implements(np.unique_values)
def unique_values(x):
    """``np.unique_values`` of a DTensor, sorted as ``np.unique`` sorts (each NaN
    its own value), by the sample sort; no gather. NumPy itself lists integers in
    the order of a hash set, but the standard leaves the order open and its
    clients (scikit-learn's label encoding, array-api-compat, array-api-strict,
    ``torch.unique``) take the values sorted, so a sorted answer is the one every
    rank and every client agrees on. Result ``Shard(0)`` along the mesh dim that
    shards ``x``. Collective on the mesh.

    Example: ``np.unique_values(dt).full_tensor()`` equals
    ``np.unique(dt.full_tensor(), equal_nan=False)``.
    """
    x = _dtensor_arg("numpy.unique_values", x)
    try:
        return unique(x, equal_nan=False)
    except _registry.NoRule as e:
        # NumPy's own unique_values on the gathered array would list integers in
        # its hash set's order: np.unique's gather keeps the sorted answer.
        return _registry.gather_call(np.unique, (x,), {"equal_nan": False},
                                     "numpy.unique_values", cause=e)


@_registry.implements(np.unique_counts)
def unique_counts(x):
    """``np.unique_counts`` of a DTensor: ``np.unique(x, return_counts=True,
    equal_nan=False)``, sorted as NumPy's, by the sample sort; no gather.
    Collective on the mesh.

    Example: ``np.unique_counts(dt).counts``.
    """
    x = _dtensor_arg("numpy.unique_counts", x)
    return _UniqueCounts(*unique(x, return_counts=True, equal_nan=False))


@_registry.implements(np.unique_inverse)
def unique_inverse(x):
    """``np.unique_inverse`` of a DTensor: ``np.unique(x, return_inverse=True,
    equal_nan=False)`` by the sample sort, no gather; a float array holding a NaN
    goes to the fallback (NumPy numbers its NaNs in the order of an unstable
    sort). Collective on the mesh.

    Example: ``np.unique_inverse(dt).inverse_indices``.
    """
    name = "numpy.unique_inverse"
    x = _dtensor_arg(name, x)
    if x._spec.dtype.kind == "f" and bool(np.any(np.isnan(x)).full_tensor()):
        raise _registry.NoRule(f"{name}: NumPy numbers the NaNs of a float array in the "
                               f"order of its unstable sort")
    values, inverse = unique(x, return_inverse=True, equal_nan=False)
    # NumPy gives the inverse the input's shape (a 0-d one too)
    return _UniqueInverse(values, np.reshape(inverse, x.shape))


@_registry.implements(np.unique_all)
def unique_all(x):
    """``np.unique_all`` of a DTensor: ``np.unique(x, return_index=True,
    return_inverse=True, return_counts=True, equal_nan=False)`` by the sample
    sort, no gather. Collective on the mesh.

    Example: ``np.unique_all(dt).indices``.
    """
    x = _dtensor_arg("numpy.unique_all", x)
    values, index, inverse, counts = unique(x, True, True, True, equal_nan=False)
    return _UniqueAll(values, index, np.reshape(inverse, x.shape), counts)
