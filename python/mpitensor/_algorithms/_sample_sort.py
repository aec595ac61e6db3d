"""A distributed sample sort, for the sorts and order statistics whose axis is
sharded and that have no free dim to move the shard to (a 1-D array, or the
flattened array of ``axis=None``).

Along the one mesh dim that shards the array: each rank sorts its elements, picks
``p - 1`` regular samples, and one all-gather of the samples lets every rank pick
the same ``p - 1`` splitters; the ranks cut their sorted elements at the splitters
(the buckets), one all-to-all of variable parts sends bucket ``q`` to rank ``q``,
and each rank merges the sorted runs it received. Regular sampling keeps a bucket
under about ``2n/p`` elements. Elements are ordered by (value, key), the key being
the global (flat) index, so ties follow the index, as a stable sort's do, and a
splitter inside a run of equal values still cuts it evenly.

The sorted buckets are uneven; a sort then moves them to the shards of the usual
layout (``torch.chunk``'s sizes) by one more all-to-all of variable parts, placed
by an exclusive scan of the bucket sizes. The order statistics skip that: the
elements they need are found where they lie.

Bytes per rank: the samples (``p (p - 1)`` records, gathered), about two shards'
worth of elements (one in the bucket exchange, at most one in the rebalance), and
a few numbers per peer; a gather instead receives the whole array on every rank.
A small array is gathered all the same (:data:`GATHER_SORT_BYTES`): one all-gather,
as torch sorts along a sharded dim, where the sample sort's six collectives and
their bookkeeping take longer than moving the whole array.
"""

from __future__ import annotations

import warnings

import numpy as np
# NumPy's own quantile methods (virtual indices, gamma, interpolation), so that
# every ``method=`` gives NumPy's numbers bit for bit.
from numpy.lib import _function_base_impl as _npq

from .. import _C, _clib, _comm, _modes, _trace
from .._bind import core
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import local_shape_and_global_offset
from ..placement_types import Partial, Replicate, Shard
from . import _dispatch as D

__all__ = ["sort_mesh_dim", "sort_flat", "order_statistics", "quantile_flat",
           "median_flat"]

# Arrays of at most this many bytes in all are sorted by gathering them whole: below
# it one all-gather and a NumPy sort beat the sample sort's rounds of collectives
# (benchmarks/vs_heat.py's sort row at its smallest size).
GATHER_SORT_BYTES = 32 << 10

# Keys of values-only sorts: the rank's coordinate above its element's position in
# its sorted elements, which orders equal values across ranks without their global
# indices. They are never stored: a rank's keys are one int, the first (_key_at).
_KEY_SHIFT = 40


def _key_at(keys, at):
    """The keys at positions ``at``: of an array, or counted from an int (implicit
    keys, one per sorted position)."""
    return keys[at] if isinstance(keys, np.ndarray) else keys + np.asarray(at, np.int64)


def sort_mesh_dim(a) -> int | None:
    """The mesh dim along which a sample sort of ``a`` runs: the only mesh dim
    (longer than 1) with a Shard, when every other one is Replicate (or of size 1);
    else None. Local.

    Example: ``sort_mesh_dim(dt)`` is 0 for a ``[Shard(0)]`` DTensor on 2 ranks.
    """
    spec = a._spec
    mesh = spec.mesh
    sharded = [m for m, p in enumerate(spec.placements)
               if p.is_shard() and mesh.shape[m] > 1]
    # A Partial is reduced first (sorting is not linear), and then is Replicate.
    others_ok = all(not p.is_shard() or mesh.shape[m] == 1 or m in sharded
                    for m, p in enumerate(spec.placements))
    if len(sharded) != 1 or not others_ok:
        return None
    return sharded[0]


def _flat_keys(a) -> np.ndarray:
    """The global flat (row-major) index of each local element, in local order."""
    spec = a._spec
    local = a.to_local()
    _, offset = local_shape_and_global_offset(spec.shape, spec.mesh.shape,
                                              spec.mesh._coordinate, spec.placements)
    if local.size == 0:
        return np.zeros((0,), np.int64)
    idx = np.indices(local.shape, dtype=np.int64)
    for k, o in enumerate(offset):
        idx[k] += o
    return np.ravel_multi_index(tuple(idx), spec.shape).astype(np.int64).reshape(-1)


def _records(values, keys):
    """One uint8 row per element: the value's bytes, then the key's."""
    v = np.ascontiguousarray(values)
    k = np.ascontiguousarray(keys, np.int64)
    return np.concatenate([v.view(np.uint8).reshape(len(v), v.itemsize),
                           k.view(np.uint8).reshape(len(k), 8)], axis=1)


def _split(rows, dtype):
    """The values and keys of rows made by _records."""
    isz = np.dtype(dtype).itemsize
    values = np.ascontiguousarray(rows[:, :isz]).view(dtype).reshape(-1)
    keys = np.ascontiguousarray(rows[:, isz:]).view(np.int64).reshape(-1)
    return values, keys


def _splitters(name, a, m, values, keys):
    """The p - 1 splitters (values, keys), the same on every rank: regular samples
    of each rank's sorted elements, gathered along mesh dim ``m``."""
    spec = a._spec
    mesh = spec.mesh
    p = mesh.shape[m]
    n = len(values)
    at = (np.arange(1, p, dtype=np.int64) * n) // p
    if n:
        rows = _records(values[at], _key_at(keys, at))
    else:
        rows = _records(np.zeros((p - 1,), values.dtype), np.full((p - 1,), -1))
    placements = tuple(Shard(0) if i == m else Replicate() for i in range(mesh.ndim))
    shape = (p,) + rows.shape
    parts = DTensor.from_local(rows[None], mesh, placements, shape=shape,
                               stride=contiguous_strides(shape))
    every = D.relayout(name, parts, (Replicate(),) * mesh.ndim,
                       records=True).to_local()
    sv, sk = _split(every.reshape(-1, rows.shape[1]), values.dtype)
    valid = sk >= 0
    sv, sk = sv[valid], sk[valid]
    order = np.lexsort((sk, sv))
    sv, sk = sv[order], sk[order]
    pick = (np.arange(1, p, dtype=np.int64) * len(sv)) // p
    return sv[pick], sk[pick]


def _cuts(values, keys, sv, sk):
    """Where each splitter cuts the sorted (values, keys): elements ordered before
    it go to the buckets before its. Equal values lie in key order."""
    cuts = []
    los = np.searchsorted(values, sv, "left")
    his = np.searchsorted(values, sv, "right")
    for lo, hi, k in zip(los.tolist(), his.tolist(), sk.tolist()):
        if isinstance(keys, np.ndarray):
            cuts.append(lo + int(np.searchsorted(keys[lo:hi], k, "left")))
        else:  # implicit keys: keys + lo, ..., keys + hi - 1 there
            cuts.append(lo + min(max(k - (int(keys) + lo), 0), hi - lo))
    return np.diff(np.concatenate([[0], cuts, [len(values)]])).tolist()


def _buckets(name, a, m, values, keys, with_keys):
    """This rank's bucket: the elements (and keys) of every rank that fall between
    its splitters, sorted by (value, key). ``keys``: an array (argsort's global
    indices) or an int (a values-only sort's implicit keys, _key_at). Collective
    along mesh dim ``m``."""
    if isinstance(keys, np.ndarray):
        # Keys grow in local order, so a stable sort by value orders by (value, key).
        order = np.argsort(values, kind="stable")
        values, keys = values[order], keys[order]
    else:
        # Values alone: NumPy's default (vectorised) sort, no indirect sort and no
        # gather by the order; the keys then number the sorted positions.
        values = np.sort(values)
    sv, sk = _splitters(name, a, m, values, keys)
    counts = _cuts(values, keys, sv, sk)
    mesh = a._spec.mesh
    if _modes.tracing:
        _trace.collective(f"{name}: sample sort bucket exchange", a._spec.mesh,
                          a._spec.placements, a._spec.shape, a._spec.dtype)
    if with_keys:
        rows, _ = _comm.alltoallv(mesh, _records(values, keys), counts, m)
        got_v, got_k = _split(rows, values.dtype)
        order = np.lexsort((got_k, got_v))
        return got_v[order], got_k[order]
    got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(values), counts, m)
    # Sorted runs, one per source rank: a stable sort merges them.
    return np.sort(got, kind="stable"), None


def _offset(a, m, size) -> int:
    """The global position of this rank's first bucket element: an exclusive scan
    of the bucket sizes along mesh dim ``m``."""
    box = np.array([size], np.int64)
    _comm.exscan(a._spec.mesh, box, m, _clib.CORE.REDUCE_SUM)
    return int(box[0]) if a._spec.mesh._coordinate[m] > 0 else 0


def _input(name, a, flat_keys):
    """(this rank's elements, their keys) in local order, Partials reduced first;
    without ``flat_keys`` the keys are implicit (an int, _key_at)."""
    if any(p.is_partial() for p in a._spec.placements):
        a = D.relayout(name, a, [Replicate() if p.is_partial() else p
                                 for p in a._spec.placements])
    local = a.to_local().reshape(-1)
    if flat_keys:
        keys = _flat_keys(a)
    else:
        keys = int(a._spec.mesh._coordinate[sort_mesh_dim(a)]) << _KEY_SHIFT
    return a, local, keys


def sort_flat(name, a, indices: bool):
    """np.sort (``indices`` False) or np.argsort (True, flat global indices; ties
    in index order, as ``kind="stable"``) of the flattened ``a``, whose one mesh
    dim ``m`` = sort_mesh_dim(a) shards it: a 1-D DTensor ``Shard(0)`` on ``m``
    (Replicate on the other mesh dims) in the usual layout. Collective on the mesh.

    Example: ``sort_flat("numpy.sort", dt, False)`` equals ``np.sort(full, None)``.
    """
    m = sort_mesh_dim(a)
    spec = a._spec
    mesh = spec.mesh
    n = int(np.prod(spec.shape))
    placements = tuple(Shard(0) if i == m else Replicate() for i in range(mesh.ndim))
    out_dtype = np.dtype(np.intp) if indices else spec.dtype
    out_spec = DTensorSpec(mesh, placements, (n,), out_dtype, contiguous_strides((n,)))
    if mesh._coordinate is None or n == 0:
        return DTensor(np.empty((0,), out_dtype), out_spec)
    if n * spec.dtype.itemsize <= GATHER_SORT_BYTES:
        return _sort_gathered(name, a, m, indices, out_spec)
    a, local, keys = _input(name, a, indices)
    values, keys = _buckets(name, a, m, local, keys, indices)
    data = keys.astype(np.intp) if indices else values
    # The buckets move to the usual shards (torch.chunk's sizes).
    p, c = mesh.shape[m], mesh._coordinate[m]
    start = _offset(a, m, len(data))
    sizes = core.chunk_sizes(n, p)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    lo = np.clip(bounds[:-1], start, start + len(data))
    hi = np.clip(bounds[1:], start, start + len(data))
    counts = np.maximum(hi - lo, 0).tolist()
    if _modes.tracing:
        _trace.collective(f"{name}: sample sort rebalance", mesh, placements, (n,),
                          out_dtype)
    local, got = _comm.alltoallv(mesh, np.ascontiguousarray(data), counts, m)
    assert len(local) == sizes[c]
    return DTensor(local, out_spec)


def _sort_gathered(name, a, m, indices: bool, out_spec):
    """sort_flat of a small ``a``: gathered whole (one all-gather), sorted stably by
    NumPy (NaNs last, ties in index order) and cut to this rank's shard along mesh
    dim ``m``. Collective on the mesh."""
    mesh = out_spec.mesh
    # Not reported as a gather an operation needs: the sample sort would do
    # without it, and a small array costs less this way.
    whole = _C.move(a, (Replicate(),) * mesh.ndim, name).to_local().reshape(-1)
    done = np.argsort(whole, kind="stable") if indices else np.sort(whole, kind="stable")
    sizes = core.chunk_sizes(len(done), mesh.shape[m])
    c = mesh._coordinate[m]
    start = int(np.sum(sizes[:c]))
    return DTensor(done[start:start + sizes[c]].astype(out_spec.dtype), out_spec)


def order_statistics(name, a, positions_of, nan_policy):
    """The sorted flattened ``a`` at the positions ``positions_of(n)`` asks for (an
    int array, any shape; n the count of values that take part), the same array on
    every rank, found without sorting into the usual shards: each rank contributes
    the positions its bucket holds and one all-reduce (max of bytes) combines them.
    ``nan_policy``: "propagate" (NumPy's quantile: a NaN anywhere makes every
    result NaN; returned as the flag), "omit" (the nan* functions: NaNs, last in
    the order, do not count). Returns (values, n, has_nan). Collective on the mesh.

    Example: ``order_statistics("numpy.median", dt, lambda n: np.array([n // 2]), "propagate")``.
    """
    m = sort_mesh_dim(a)
    spec = a._spec
    mesh = spec.mesh
    if not np.prod(spec.shape):
        return np.zeros((0,), spec.dtype), 0, False
    a, local, keys = _input(name, a, False)
    values, _ = _buckets(name, a, m, local, keys, False)
    inexact = values.dtype.kind in "fc"
    nans = int(np.count_nonzero(np.isnan(values))) if inexact else 0
    # (bucket size, NaNs in it) of every rank along m: offsets and the NaN count.
    rows = np.array([[len(values), nans]], np.int64).view(np.uint8)
    placements = tuple(Shard(0) if i == m else Replicate() for i in range(mesh.ndim))
    p = mesh.shape[m]
    parts = DTensor.from_local(rows[None], mesh, placements, shape=(p,) + rows.shape,
                               stride=contiguous_strides((p,) + rows.shape))
    every = D.relayout(name, parts, (Replicate(),) * mesh.ndim, records=True)
    counts = np.ascontiguousarray(every.to_local()).view(np.int64).reshape(p, 2)
    total_nan = int(counts[:, 1].sum())
    total = int(counts[:, 0].sum())
    n = total - total_nan if nan_policy == "omit" else total
    pos = np.asarray(positions_of(n), np.int64)
    start = int(counts[:mesh._coordinate[m], 0].sum())
    mine = (pos >= start) & (pos < start + len(values))
    picked = np.zeros(pos.shape, values.dtype)
    picked[mine] = values[pos[mine] - start]
    raw = np.ascontiguousarray(picked).view(np.uint8).reshape(
        pos.shape + (values.dtype.itemsize,))
    # The owner's bytes against zeros elsewhere: a max of bytes is exact for any dtype.
    part = DTensor.from_local(raw, mesh, tuple(Partial("max") if i == m else Replicate()
                                               for i in range(mesh.ndim)),
                              shape=raw.shape, stride=contiguous_strides(raw.shape))
    full = D.relayout(name, part, (Replicate(),) * mesh.ndim, records=True).to_local()
    out = np.ascontiguousarray(full).view(values.dtype).reshape(pos.shape)
    return out, n, total_nan > 0


def _output(mesh, local, placements_ndim):
    shape = local.shape
    return DTensor(local if mesh._coordinate is not None else np.empty((0,), local.dtype),
                   DTensorSpec(mesh, (Replicate(),) * placements_ndim, shape, local.dtype,
                               contiguous_strides(shape)))


def _keep(result, ndim, keepdims):
    result = np.asarray(result)
    return result.reshape(result.shape + (1,) * ndim) if keepdims else result


def quantile_flat(name, a, q, method, weak_q, omit_nan, keepdims):
    """np.quantile (``q`` already in [0, 1]) of the flattened ``a`` (or np.nanquantile
    with ``omit_nan``), by :func:`order_statistics` and NumPy's own method tables:
    every ``method=`` NumPy has, equal to NumPy. Output Replicate. Collective on
    the mesh.

    Example: ``quantile_flat("numpy.quantile", dt, np.asarray(0.5), "linear", True, False, False)``.
    """
    spec = a._spec
    try:
        props = _npq._QuantileMethods[method]
    except KeyError:
        raise ValueError(f"{method!r} is not a valid method. Use one of: "
                         f"{_npq._QuantileMethods.keys()}") from None
    plan = {}

    def positions(n):
        if n == 0:
            return np.zeros((0,), np.int64)
        vi = np.asanyarray(props["get_virtual_index"](n, q))
        ints = props["fix_gamma"] is None or (
            method == "linear" and np.issubdtype(vi.dtype, np.integer))
        plan["vi"], plan["ints"] = vi, ints
        if ints:
            return np.asarray(vi, np.int64).reshape(-1)
        prev, nxt = _npq._get_indexes(np.empty((0,), spec.dtype), vi, n)
        plan["prev"] = prev
        # NumPy's -1 (the last value) as a position.
        return np.concatenate([np.asarray(prev, np.int64).reshape(-1) % n,
                               np.asarray(nxt, np.int64).reshape(-1) % n])

    mesh = spec.mesh
    if mesh._coordinate is None:
        stand_in = np.quantile(np.zeros((1,), spec.dtype), q, method=method)
        return _output(mesh, _keep(np.zeros(np.shape(stand_in), np.asarray(stand_in).dtype),
                                   len(spec.shape), keepdims), mesh.ndim)
    values, n, has_nan = order_statistics(name, a, positions,
                                          "omit" if omit_nan else "propagate")
    if n == 0:
        if omit_nan:
            warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=4)
            result = np.full(q.shape, np.nan, spec.dtype)
        else:
            raise IndexError("index -1 is out of bounds for axis 0 with size 0")
    else:
        vi = plan["vi"]
        if plan["ints"]:
            result = values.reshape(vi.shape)
        else:
            k = values.size // 2
            previous, nxt = values[:k].reshape(vi.shape), values[k:].reshape(vi.shape)
            gamma = _npq._get_gamma(vi, plan["prev"], props)
            gamma = float(gamma) if weak_q else gamma.reshape(vi.shape)
            result = _npq._lerp(previous, nxt, gamma)
        if has_nan and not omit_nan:
            result = np.full(np.shape(result), np.nan, np.asarray(result).dtype)
    return _output(mesh, _keep(result, len(spec.shape), keepdims), mesh.ndim)


def median_flat(name, a, omit_nan, keepdims):
    """np.median of the flattened ``a`` (np.nanmedian with ``omit_nan``): the middle
    one or two values by :func:`order_statistics`, averaged as NumPy does. Output
    Replicate. Collective on the mesh.

    Example: ``median_flat("numpy.median", dt, False, False)``.
    """
    spec = a._spec
    mesh = spec.mesh
    if mesh._coordinate is None:
        out = np.median(np.zeros((1,), spec.dtype))
        return _output(mesh, _keep(np.zeros((), np.asarray(out).dtype), len(spec.shape),
                                   keepdims), mesh.ndim)

    def positions(n):
        if n == 0:
            return np.zeros((0,), np.int64)
        return np.arange((n - 1) // 2, n // 2 + 1, dtype=np.int64)

    values, n, has_nan = order_statistics(name, a, positions,
                                          "omit" if omit_nan else "propagate")
    if n == 0:
        if omit_nan:
            warnings.warn("All-NaN slice encountered", RuntimeWarning, stacklevel=4)
            result = np.asarray(np.nan, np.median(np.zeros((1,), spec.dtype)).dtype)
        else:
            # NumPy's mean of an empty slice: NaN with its warning.
            result = np.asarray(np.mean(np.zeros((0,), spec.dtype)))
    else:
        result = np.asarray(np.mean(values))
        if has_nan and not omit_nan:
            result = np.asarray(np.nan, result.dtype)
    return _output(mesh, _keep(result, len(spec.shape), keepdims), mesh.ndim)
