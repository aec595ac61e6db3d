"""Counts of a DTensor's values that need no gather: ``np.bincount``,
``np.histogram_bin_edges``, ``np.histogram2d`` and ``np.histogramdd``
(``np.histogram`` is in _stats.py).

Each rank counts its own elements into bins that every rank knows alike, and the
counts, not the data, are summed over the mesh dims that shard the input. What
the bins depend on is agreed in one all-reduce of a few numbers: the longest
local count for ``bincount`` (its length, the counts made first), the extremes
of each coordinate for histograms whose bins are a number without a range
(their edges, as NumPy places them).

``bincount`` leaves its counts a Partial(sum) over the sharding mesh dims, as
``np.sum`` leaves a sum: the all-reduce runs when they are read. The histograms
return NumPy arrays, as ``np.histogram`` does here, the same on every rank.

Forms with no rule here (weights of the histograms, bins named by an estimator,
a bincount of more than one dim or of a dtype NumPy does not cast to intp) go to
the fallback, which gives NumPy's answer or its exception.
"""

from __future__ import annotations

import operator

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Shard
from .._algorithms import _dispatch as D, _lanes
from ._stats import _all_reduce, _placements, _sharding, _unpartial

__all__ = ["bincount", "histogram_bin_edges", "histogram2d", "histogramdd"]


# Whether NumPy's bincount takes a dtype (casts it safely to intp), per dtype.
_to_intp: dict = {}


def _counted_dtype(dtype) -> bool:
    ok = _to_intp.get(dtype)
    if ok is None:
        if len(_to_intp) > 256:
            _to_intp.clear()
        ok = _to_intp[dtype] = bool(np.can_cast(dtype, np.intp, "safe"))
    return ok


@_registry.implements(np.bincount)
def bincount(x, weights=None, minlength=0):
    """``np.bincount`` of a 1-D DTensor of non-negative ints (``weights``: a DTensor
    of its length, moved to its layout): a DTensor of NumPy's length and dtype,
    Partial(sum) over the mesh dims that shard ``x``, Replicate elsewhere.
    Collective on the mesh when ``x`` is sharded: one all-reduce of two numbers
    (the longest local count and whether a value is negative), then nothing until
    the counts are read.

    Example: ``np.bincount(dt).full_tensor()`` equals ``np.bincount(dt.full_tensor())``.
    """
    name = "numpy.bincount"
    if type(x) is not DTensor:
        raise _registry.NoRule(f"{name}: the data must be a DTensor")
    minlength = operator.index(minlength)
    if x.ndim != 1 or not _counted_dtype(x.dtype) or minlength < 0:
        raise _registry.NoRule(f"{name}: no rule for this form; NumPy decides")
    if weights is not None and (type(weights) is not DTensor or weights.shape != x.shape):
        raise _registry.NoRule(f"{name}: weights= must be a DTensor of the data's shape")
    x = _unpartial(name, x)
    spec = x._spec
    mesh = spec.mesh
    sharding = _sharding(spec)
    pls = _placements(mesh.ndim, "sum", sharding)[0]
    if weights is not None:
        weights = D.relayout(name, _unpartial(name, weights), spec.placements)
    # NumPy counts an empty input in intp, weights or not.
    dtype = np.dtype(np.intp if weights is None or not x.shape[0] else np.float64)
    if mesh.get_coordinate() is None:
        return DTensor(D.outside_local((0,), dtype),
                       DTensorSpec(mesh, pls, (0,), dtype, contiguous_strides((0,))))
    local = x.to_local().astype(np.intp, copy=False)
    # Counted first, in one pass that tracks the largest value, so the length
    # every rank agrees on is the longest local count and no pass of our own looks
    # for the extremes first. A negative value is flagged so that it fails on every
    # rank.
    try:
        counts = _lanes.bincount(local, None if weights is None else weights.to_local(),
                                 minlength)
        ext = np.array([-len(counts), 0], np.int64)
    except ValueError:
        counts, ext = None, np.array([0, -1], np.int64)
    if sharding:
        ext = _all_reduce(mesh, ext, "min", sharding)
    if ext[1] < 0:
        raise ValueError("'list' argument must have no negative elements")
    n = int(-ext[0])
    if len(counts) < n:
        counts = np.concatenate([counts, np.zeros(n - len(counts), counts.dtype)])
    return DTensor(np.ascontiguousarray(counts, dtype),
                   DTensorSpec(mesh, pls, (n,), dtype, contiguous_strides((n,))))


def _extremes(mesh, sharding, local, dims):
    """Per column of the (n, dims) ``local``: its (min, max) over the ranks, None
    for no elements anywhere, (nan, nan) where one is NaN. Collective along
    ``sharding``."""
    if local.shape[0]:
        lo, hi = local.min(axis=0), local.max(axis=0)
        nan = np.isnan(lo) | np.isnan(hi)
        lo, hi = np.where(nan, np.inf, lo), np.where(nan, np.inf, -hi)
        rows = np.concatenate([lo, hi, -nan.astype(np.float64), [-1.0]])
    else:
        rows = np.concatenate([np.full(2 * dims, np.inf), np.zeros(dims), [0.0]])
    rows = rows.astype(np.float64)
    if sharding:
        rows = _all_reduce(mesh, rows, "min", sharding)
    if rows[-1] == 0:
        return [None] * dims
    # In the data's dtype, as NumPy's extremes are, so that the edges are NumPy's
    # to the last bit.
    kind = local.dtype.type
    return [(np.nan, np.nan) if rows[2 * dims + i] < 0 else
            (kind(rows[i]), kind(-rows[dims + i])) for i in range(dims)]


def _edges(name, mesh, sharding, local, bins, range):
    """The bin edges of every column of the (n, dims) ``local`` sample, as NumPy's
    histogramdd places them for the whole sample. Collective along ``sharding``
    when a column's bins are a number and its range is not given."""
    dims = local.shape[1]
    try:
        if len(bins) != dims:
            raise ValueError("The dimension of bins must be equal to the dimension of "
                             "the sample x.")
        per_dim = list(bins)
    except TypeError:
        per_dim = [bins] * dims
    if isinstance(bins, str) or any(isinstance(b, str) for b in per_dim):
        raise _registry.NoRule(f"{name}: bins named by an estimator need the whole data")
    if range is not None and len(range) != dims:
        raise ValueError("range argument must have one entry per dimension")
    ranges = list(range) if range is not None else [None] * dims
    if any(np.ndim(b) == 0 and r is None for b, r in zip(per_dim, ranges)):
        found = _extremes(mesh, sharding, local, dims)
        ranges = [found[i] if r is None else r for i, r in enumerate(ranges)]
        if all(f is None for f in found):
            ranges = list(range) if range is not None else None
    return np.histogramdd(np.empty((0, dims)), bins=per_dim, range=ranges)[1]


def _counted(mesh, sharding, local, edges, density):
    """NumPy's histogramdd counts (float) of the whole sample from each rank's
    ``local`` one: counted here, summed over ``sharding``. Collective there."""
    hist = np.histogramdd(local, bins=edges)[0]
    if sharding:
        hist = _all_reduce(mesh, hist, "sum", sharding)
    if density:
        s = hist.sum()
        for i, e in enumerate(edges):
            shape = np.ones(len(edges), int)
            shape[i] = len(e) - 1
            hist = hist / np.diff(e).reshape(shape)
        hist /= s
    return hist


def _sample(name, sample):
    """(the sample DTensor laid out by rows, whole along its coordinates; its
    local (n, dims) rows)."""
    sample = _unpartial(name, sample)
    spec = sample._spec
    if sample.ndim == 2 and any(p == Shard(1) and spec.mesh.shape[m] > 1
                                for m, p in enumerate(spec.placements)):
        # Each sample's coordinates come together: an all-to-all, not a gather.
        sample = D.relayout(name, sample, [Shard(0) if p == Shard(1) else p
                                           for p in spec.placements])
    dims = sample.shape[1] if sample.ndim == 2 else 1
    local = sample.to_local() if spec.mesh.get_coordinate() is not None else \
        np.empty((0, dims), spec.dtype)
    return sample, local.reshape(local.shape[0], dims)


@_registry.implements(np.histogramdd)
def histogramdd(sample, bins=10, range=None, density=None, weights=None):
    """``np.histogramdd`` of an (n, dims) (or (n,)) DTensor sample: (counts, edges)
    as NumPy arrays, the same on every rank. Each rank counts its rows and the
    counts are summed (one all-reduce of the counts; one of two numbers per
    column first when a column's bins are a number without a range); a sample
    sharded along its coordinates is moved to rows first (an all-to-all).
    Collective on the mesh when the sample is sharded.

    Example: ``np.histogramdd(dt, bins=(4, 3))``.
    """
    name = "numpy.histogramdd"
    if type(sample) is not DTensor or sample.ndim not in (1, 2):
        raise _registry.NoRule(f"{name}: the sample must be a 1-D or 2-D DTensor")
    if weights is not None:
        raise _registry.NoRule(f"{name}: weights= has no distributed rule")
    sample, local = _sample(name, sample)
    mesh, sharding = sample._spec.mesh, _sharding(sample._spec)
    edges = _edges(name, mesh, sharding, local, bins, range)
    return _counted(mesh, sharding, local, edges, density), edges


@_registry.implements(np.histogram2d)
def histogram2d(x, y, bins=10, range=None, density=None, weights=None):
    """``np.histogram2d`` of two 1-D DTensors of one length (``y`` moved to ``x``'s
    layout): (counts, x edges, y edges) as NumPy arrays, the same on every rank,
    counted as ``np.histogramdd``. Collective on the mesh when ``x`` is sharded.

    Example: ``h, ex, ey = np.histogram2d(dx, dy, bins=8)``.
    """
    name = "numpy.histogram2d"
    if type(x) is not DTensor or type(y) is not DTensor or x.ndim != 1 or \
            x.shape != y.shape or weights is not None:
        raise _registry.NoRule(f"{name}: x and y must be 1-D DTensors of one length, "
                               f"without weights=")
    x = _unpartial(name, x)
    y = D.relayout(name, _unpartial(name, y), x._spec.placements)
    mesh, sharding = x._spec.mesh, _sharding(x._spec)
    if mesh.get_coordinate() is None:
        local = np.empty((0, 2), np.result_type(x.dtype, y.dtype))
    else:
        local = np.stack([x.to_local(), y.to_local()], axis=1)
    try:
        n = len(bins)
    except TypeError:
        n = 1
    if n not in (1, 2):
        bins = [np.asarray(bins)] * 2
    edges = _edges(name, mesh, sharding, local, bins, range)
    return (_counted(mesh, sharding, local, edges, density),) + tuple(edges)


@_registry.implements(np.histogram_bin_edges)
def histogram_bin_edges(a, bins=10, range=None, weights=None):
    """``np.histogram_bin_edges`` of a DTensor: a NumPy array, the same on every
    rank. Collective on the mesh (one all-reduce of two numbers) when ``bins`` is a
    number without ``range`` and ``a`` is sharded; local otherwise.

    Example: ``np.histogram_bin_edges(dt, bins=5)``.
    """
    name = "numpy.histogram_bin_edges"
    if type(a) is not DTensor:
        raise _registry.NoRule(f"{name}: the data must be the DTensor")
    if isinstance(bins, str) or weights is not None:
        raise _registry.NoRule(f"{name}: bins named by an estimator need the whole data")
    if np.ndim(bins) != 0 or range is not None:
        return np.histogram_bin_edges(np.empty(0, a.dtype), bins=bins, range=range)
    a = _unpartial(name, a)
    mesh = a._spec.mesh
    local = a.to_local().reshape(-1, 1) if mesh.get_coordinate() is not None else \
        np.empty((0, 1), a.dtype)
    found = _extremes(mesh, _sharding(a._spec), local, 1)[0]
    return np.histogram_bin_edges(np.empty(0, a.dtype), bins=bins, range=found)
