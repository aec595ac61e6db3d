"""Reductions whose per-rank results merge without gathering the input:
``np.logaddexp.reduce`` / ``np.logaddexp2.reduce`` (log-sum-exp) and
``np.histogram``; and the dense decompositions ``np.linalg.svd`` and ``qr``,
which replicate their input first (as torch's DTensor does).

Log-sum-exp along a sharded axis: each rank reduces its shard, then the mesh dims
that shard the axis merge the per-rank values exactly, with no Partial left behind:
one all-gather of the per-rank values (the size of the result per rank; one per
mesh dim that shards the axis), merged alike on every rank; torch gathers the
whole input instead. Where the time model
prices it cheaper (many ranks, large results), one all-reduce of their maximum M
and one of ``sum(exp(lse_r - M))`` instead. A histogram counts each rank's shard and sums the counts over the
mesh dims that shard the input (one all-reduce; none for a Replicate input, as
torch's histc); with ``bins`` an int and no ``range`` the global minimum and
maximum are found first over the same mesh dims (one all-reduce of two numbers;
an empty shard contributes nothing).
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _layout, _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Partial, Replicate, Shard
from .._algorithms import _dispatch as D, _fold, _lanes
from ._inplace import write_result


def _unpartial(name, a):
    if not any(p.is_partial() for p in a._spec.placements):
        return a
    return D.relayout(name, a, [Replicate() if p.is_partial() else p
                                for p in a._spec.placements])


# (the Partials to reduce, Replicate everywhere) per (mesh dims, op, dims reduced):
# placements are made through their interning, which would be a good part of a
# small reduction's (or count's) time.
_reduced_placements: dict = {}


def _placements(ndim, op, mesh_dims):
    """(Partial(op) on ``mesh_dims`` and Replicate elsewhere, Replicate everywhere)
    for a mesh of ``ndim`` dims, made once per key. Local.

    Example: ``_placements(2, "sum", {0})[0] == (Partial("sum"), Replicate())``.
    """
    key = (ndim, op, frozenset(mesh_dims))
    pls = _reduced_placements.get(key)
    if pls is None:
        if len(_reduced_placements) > 256:
            _reduced_placements.clear()
        pls = _reduced_placements[key] = (
            tuple(Partial(op) if m in mesh_dims else Replicate() for m in range(ndim)),
            (Replicate(),) * ndim)
    return pls


def _sharding(spec):
    """The mesh dims (of more than one rank) whose shards hold different elements:
    the ones along which per-rank counts or extremes combine. Local."""
    shape = spec.mesh._mesh.shape
    return {m for m, p in enumerate(spec.placements) if p.is_shard() and shape[m] > 1}


def _all_reduce(mesh, local, op, mesh_dims):
    """``local`` reduced by ``op`` over ``mesh_dims`` (a Partial(op) there, reduced
    to Replicate); the other mesh dims as ``keep``. Collective on the mesh."""
    local = np.array(local, order="C")  # 0-d stays 0-d (ascontiguousarray makes 1-D)
    if mesh._coordinate is not None:
        pls, replicated = _placements(mesh.ndim, op, mesh_dims)
        # The spec is known whole (every rank holds the result's shape): from_local's
        # checks of a user's shards would be most of a small reduction's time.
        spec = DTensorSpec(mesh, pls, local.shape, local.dtype,
                           contiguous_strides(local.shape))
        return DTensor(local, spec).redistribute(mesh, replicated).to_local()
    pls = [Partial(op) if m in mesh_dims else Replicate() for m in range(mesh.ndim)]
    dt = DTensor.from_local(local, mesh, pls,
                            shape=local.shape, stride=tuple(
                                int(np.prod(local.shape[d + 1:])) for d in range(local.ndim)))
    return dt.redistribute(mesh, [Replicate()] * mesh.ndim).to_local()


def logaddexp_reduce(ufunc, a, axis=0, dtype=None, out=None, keepdims=False, **kwargs):
    """``np.logaddexp.reduce(a, axis, dtype)`` (and logaddexp2) of a DTensor: local
    along an unsharded axis; along a sharded one each rank reduces its shard and
    the ranks merge their values (one all-gather of the size of the result per
    rank, see ``_merge_logaddexp``), where the result's dtype lets a regrouping
    give NumPy's value; float16 results (of float16, uint8 or bool), which NumPy
    rounds at each step, take NumPy's left fold instead (_fold.py, whose
    ``regroups`` decides from the result's dtype). Placements: the Shards of
    other dims follow them, the axis's mesh dims become Replicate; a Partial
    input is reduced first. Other
    keywords (``initial=``, ``where=``) and axes other than one (``axis=None`` of
    a 1-D array is its one axis) have no rule here: NoRule, NumPy's gathered
    call."""
    name = f"numpy.{ufunc.__name__}.reduce"
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")
    if kwargs:
        raise _registry.NoRule(f"{name}: {sorted(kwargs)} have no rule on DTensors")
    if isinstance(axis, tuple) and len(axis) == 1:
        axis = axis[0]
    elif axis is None and a.ndim == 1:
        axis = 0
    if not isinstance(axis, (int, np.integer)):
        raise _registry.NoRule(f"{name}: axis={axis!r} is not one axis")
    axis = normalize_axis_index(int(axis), a.ndim)
    kind = _fold.kind(ufunc, a.dtype, dtype, "reduce")  # NumPy's TypeError, if any
    if out is not None:
        from_out = out[0] if isinstance(out, tuple) else out
        if type(from_out) is not DTensor:  # NumPy's answer in the caller's ndarray
            return _registry.gather_call(ufunc.reduce, (a,), dict(
                axis=axis, dtype=dtype, out=out, keepdims=keepdims), name)
        write_result(name, from_out, logaddexp_reduce(ufunc, a, axis, dtype,
                                                       keepdims=keepdims))
        return from_out
    a = _unpartial(name, a)
    spec = a._spec
    mesh = spec.mesh
    dims = {m for m, p in enumerate(spec.placements)
            if isinstance(p, Shard) and p.dim == axis and mesh.shape[m] > 1}
    fold = bool(dims) and spec.shape[axis] > 0 and not _fold.regroups(ufunc, kind)
    if fold and (len(dims) > 1 or any(p.is_shard() and type(p) is not Shard
                                      for p in spec.placements)):
        raise _registry.NoRule(f"{name}: a float16 fold along an axis cut by several "
                               f"mesh dims or of a strided shard")

    def out_dim(d):
        return d if keepdims else d - (d > axis)

    placements = tuple(
        Replicate() if (isinstance(p, Shard) and p.dim == axis) else
        (Shard(out_dim(p.dim)) if isinstance(p, Shard) else p)
        for p in spec.placements)
    shape = tuple(1 if d == axis else n for d, n in enumerate(spec.shape)
                  if keepdims or d != axis)
    if mesh._coordinate is None:
        local = D.outside_local(shape, kind)
        return DTensor(local, DTensorSpec(mesh, placements, shape, local.dtype,
                                          contiguous_strides(shape)))
    if fold:
        local = _fold.segments(ufunc, a, np.zeros(1, np.intp), axis, dtype,
                               next(iter(dims)), kind, "reduce")
        local = np.array(local if keepdims else np.squeeze(local, axis), order="C")
        return DTensor(local, DTensorSpec(
            mesh, placements, shape, local.dtype, contiguous_strides(shape)))
    local = ufunc.reduce(a.to_local(), axis=axis, dtype=dtype, keepdims=keepdims)
    if dims:
        local = _merge_logaddexp(ufunc, mesh, np.asarray(local), dims, placements, shape)
    local = np.asarray(local)
    return DTensor(local, DTensorSpec(mesh, placements, shape, local.dtype,
                                      contiguous_strides(shape)))


def _merge_logaddexp(ufunc, mesh, local, dims, placements, shape):
    """The log-sum-exp (base e or 2, as ``ufunc``) of the ranks' ``local`` values
    over the mesh dims ``dims``, exactly: shifted by the maximum M, then
    ``M + log(sum(exp(v - M)))``. In one collective, an all-gather of every
    rank's values merged alike on every rank, unless the time model prices two
    all-reduces the size of the result (of M, then of the shifted sum) cheaper,
    as it can for many ranks and large results. ``local`` is this rank's block
    of the result laid out as ``placements`` (``shape`` global): the other mesh
    dims keep their Shards, so that every rank describes the same global array
    even where those cut unevenly or leave a rank empty. Collective on the mesh."""
    exp = np.exp if ufunc is np.logaddexp else np.exp2
    log = np.log if ufunc is np.logaddexp else np.log2
    group = int(np.prod([mesh.shape[m] for m in dims]))
    stacked = (group,) + tuple(shape)
    kept = [Shard(p.dim + 1) if isinstance(p, Shard) else p for p in placements]
    gathered = tuple(Shard(0) if m in dims else kept[m] for m in range(mesh.ndim))
    whole = tuple(Replicate() if m in dims else kept[m] for m in range(mesh.ndim))
    maxed = tuple(Partial("max") if m in dims else p for m, p in enumerate(placements))
    one = _layout.plan(mesh, stacked, gathered, whole, local.dtype).time
    two = 2 * _layout.plan(mesh, tuple(shape), maxed, tuple(placements), local.dtype).time

    def reduced(values, op):
        pls = tuple(Partial(op) if m in dims else p for m, p in enumerate(placements))
        return DTensor.from_local(np.array(values, order="C"), mesh, pls, shape=shape,
                                  stride=contiguous_strides(shape)).redistribute(
            mesh, placements).to_local()

    if one <= two:
        values = DTensor.from_local(np.ascontiguousarray(local[None]), mesh, gathered,
                                    shape=stacked, stride=contiguous_strides(stacked))
        values = values.redistribute(mesh, whole).to_local()
        top = values.max(axis=0)
        finite = np.isfinite(top)
        shift = np.where(finite, top, 0)
        with np.errstate(divide="ignore"):
            total = exp(values - shift).sum(axis=0)
    else:
        top = reduced(local, "max")
        finite = np.isfinite(top)
        shift = np.where(finite, top, 0)
        with np.errstate(divide="ignore"):
            total = reduced(exp(local - shift), "sum")
    with np.errstate(divide="ignore"):
        return np.where(finite, shift + log(total), top).astype(local.dtype)


def _scalar(bins) -> bool:
    """Whether ``bins`` is a number of bins (not edges), an int's answer without
    NumPy's ndim, which is a visible part of a small histogram's time."""
    return type(bins) is int or np.ndim(bins) == 0


# Equal-bin edges by (dtype, bins, range and the types of its ends, which decide
# the edges' dtype): NumPy's making of them is most of a small histogram's time.
_edges: dict = {}


def _bin_edges(dtype, bins, range):
    """np.histogram_bin_edges of no data of ``dtype`` (a copy: the caller's to keep)."""
    key = None
    if _scalar(bins) and range is not None and len(range) == 2:
        key = (dtype.str, bins, type(bins), range[0], type(range[0]), range[1],
               type(range[1]))
        try:
            hit = _edges.get(key)
        except TypeError:  # an unhashable end: NumPy says what it makes of it
            key = hit = None
        if hit is not None:
            return hit.copy()
    edges = np.histogram_bin_edges(np.empty(0, dtype), bins=bins, range=range)
    if key is not None:
        if len(_edges) >= 256:
            _edges.clear()
        _edges[key] = edges.copy()
    return edges


@_registry.implements(np.histogram)
def histogram(a, bins=10, range=None, density=None, weights=None):
    """``np.histogram`` of a DTensor's elements: ``(counts, bin_edges)`` as NumPy
    arrays, the same on every rank of the mesh. Local counts, then one all-reduce
    of the counts over the mesh dims that shard the input (plus, for an int
    ``bins`` without ``range``, one all-reduce of the two extremes); nothing of
    the input moves (a Partial input is reduced first). A Replicate input makes
    no collective; collective on the mesh otherwise. Bins named by an estimator
    ('auto', 'fd', ...) and ``weights=`` have no rule: NumPy's gathered call
    (the fallback), with its GatherWarning."""
    name = "numpy.histogram"
    if type(a) is not DTensor:  # weights= or bins= a DTensor
        raise _registry.NoRule(f"{name}: the data is not a DTensor")
    if weights is not None:
        raise _registry.NoRule(f"{name}: weights= is not supported on DTensors")
    if isinstance(bins, str):
        # An estimator's bins ('auto', 'fd', ...) depend on the whole data (its
        # spread, quartiles, moments): NumPy's own call on the gathered data, warned.
        raise _registry.NoRule(f"{name}: bins given by name ({bins!r}) need the whole "
                               f"data")
    a = _unpartial(name, a)
    spec = a._spec
    mesh = spec.mesh
    # Only the mesh dims that shard the data combine counts (or extremes): along
    # the others every rank holds the same elements already.
    sharding = _sharding(spec)
    if _scalar(bins) and range is None:
        operator.index(bins)
        if spec.shape and 0 in spec.shape:
            range = (0.0, 1.0)
        elif mesh._coordinate is not None:
            # per-rank extremes (an empty shard gives the identity), one number each
            x = a.to_local()
            # negated as floats: the maximum of unsigned ints has no negative
            ext = (np.array([x.min(), x.max()], np.float64) * [1.0, -1.0] if x.size
                   else np.array([np.inf, np.inf]))
            if sharding:
                ext = _all_reduce(mesh, ext, "min", sharding)
            range = (float(ext[0]), float(-ext[1]))
        else:
            range = (0.0, 1.0)  # outside the mesh: no data, nothing is counted
    edges = _bin_edges(spec.dtype, bins, range)
    if mesh._coordinate is None:
        return np.zeros(len(edges) - 1, np.intp), edges
    # Equal bins (a number of bins) count in the one-pass kernel by NumPy's rule;
    # edges given, or a dtype the kernel does not read, count by NumPy.
    local = a.to_local()
    counts = _lanes.uniform_counts(local, edges) if _scalar(bins) else None
    if counts is None:
        counts, _ = np.histogram(local, bins=edges)
    if sharding:
        counts = _all_reduce(mesh, counts, "sum", sharding)
    if density:
        widths = np.diff(edges)
        return counts / widths / counts.sum(), edges
    return counts, edges



# -- decompositions: replicated, then NumPy on every rank ------------------------------

def _replicated(name, a):
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")
    return D.relayout(name, a, [Replicate()] * a._spec.mesh.ndim)


def _wrap_replicate(mesh, results):
    def one(x):
        x = np.array(x, order="C")
        local = x if mesh._coordinate is not None else D.outside_local(x.shape, x.dtype)
        return DTensor(local, DTensorSpec(mesh, (Replicate(),) * mesh.ndim, x.shape,
                                          x.dtype, contiguous_strides(x.shape)))
    if type(results) is tuple:
        return tuple(one(x) for x in results)
    if isinstance(results, tuple):  # NumPy's named results (SVDResult, ...)
        return type(results)(*(one(x) for x in results))
    return one(results)


def _decomposition(func):
    name = f"numpy.linalg.{func.__name__}"

    def impl(a, *args, **kwargs):
        r = _replicated(name, a)
        local = r.to_local() if r._spec.mesh._coordinate is not None else np.zeros(
            r.shape, r.dtype)
        return _wrap_replicate(r._spec.mesh, func(local, *args, **kwargs))
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name} of a DTensor: its input is replicated (one gather, as "
                    f"torch's DTensor does) and every rank runs NumPy; the results are "
                    f"Replicate DTensors. Collective on the mesh.")
    return impl


# eigh and eigvalsh run on ScaLAPACK (_scalapack.py).
for _f in (np.linalg.svd, np.linalg.svdvals if hasattr(np.linalg, "svdvals") else None):
    if _f is not None:
        _registry.implements(_f)(_decomposition(_f))

# np.linalg.qr, and svd/svdvals of tall row-sharded matrices, take TSQR (_tsqr.py),
# which falls back on _decomposition for the others.
