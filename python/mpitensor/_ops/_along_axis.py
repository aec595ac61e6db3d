"""NumPy functions that work independently along an axis: sort, argsort, partition,
argpartition, cumsum, cumprod, diff, flip, roll, fftshift, the fft family, median,
percentile and quantile (and their nan forms).

One rule (:func:`along_axes`): each 1-D lane along the function's axes is whole
on the rank that holds it whenever no mesh dim shards those axes, so the function
runs on the local array with no communication and every other dim keeps its
placement. A Partial is kept by the linear functions (cumsum, diff without
prepend/append, flip, roll, fftshift, the ffts: the function of the sum is the sum
of the functions) when it is a sum or an average, and reduced first by the others.
Along a sharded axis the shard first moves to another dim the function does not
work along (one all-to-all: the pencil method of distributed FFTs; the output is
then sharded along that dim), or, when there is none, the lanes are gathered
(Replicate, torch's decision for these functions). cumsum and cumprod along an
axis one mesh dim shards instead scan each shard starting from the totals of the
shards before it, found by one exclusive scan. ``axis=None`` means the
flattened array for the functions that flatten (sort, cumsum, roll, median, ...),
so any sharded dim is gathered then. diff (without prepend/append) and roll along
a sharded axis instead move only the overlapping or wrapped rows (``_halo``,
``_roll``).
"""

from __future__ import annotations

import math
import operator
import warnings

import numpy as np
from numpy.lib import _function_base_impl as _npq
from numpy.lib.array_utils import normalize_axis_tuple

from .. import _C, _args, _comm, _dtypes, _factories, _modes, _registry, _trace
from .._clib import CORE
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Partial, Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _flatten, _lanes, _roll
from .._algorithms import _sample_sort as S
from . import _flip, _halo
from ._stats import _all_reduce

__all__ = ["along_axes", "lanes_layout"]


def _ndarray_only(func):
    """NumPy's ``func`` for the local arrays, which are plain: the ndarray method
    it calls on them (cumsum, cumprod, argsort), else the function without its
    __array_function__ dispatch (NEP 18's ``_implementation``), since no other
    type could claim the call."""
    method = _NDARRAY_METHODS.get(func)
    return method if method is not None else getattr(func, "_implementation", func)


def _sort_ndarray(x, axis=-1, kind=None, order=None, *, stable=None):
    """numpy.sort of an ndarray as NumPy's own does it (a copy in the array's
    order, sorted in place; None sorts the flattened array), without its frames."""
    if axis is None:
        x, axis = x.flatten(), -1
    else:
        x = x.copy(order="K")
    x.sort(axis=axis, kind=kind, order=order, stable=stable)
    return x


# NumPy's functions that only hand an ndarray to its method of the same name, and
# sort, which copies it first.
_NDARRAY_METHODS = {np.cumsum: np.ndarray.cumsum, np.cumprod: np.ndarray.cumprod,
                    np.argsort: np.ndarray.argsort, np.sort: _sort_ndarray}


def _check(name, a):
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")


def lanes_layout(a, axes, linear, result=None) -> tuple:
    """The placements under which every lane along ``axes`` (None: all dims) is
    local. A Shard of one of those axes moves to the largest free dim (one no mesh
    dim shards, outside ``axes``, at least as long as the mesh dim): one all-to-all,
    the pencil method, which moves each element at most once; with no such dim it
    becomes Replicate (an all-gather, torch's choice). A Partial becomes Replicate
    unless the function is ``linear``, the Partial a sum or an average and its
    values stay exact in the function's ``result`` dtype (default: ``a``'s;
    ``_dispatch.keeps_partial``). Local.

    Example: ``lanes_layout(dt, (0,), True, np.int64)`` of a float ``[Partial()]``
    DTensor is ``(Replicate(),)``: each rank's part would be truncated first."""
    spec = a._spec
    result = spec.dtype if result is None else result
    sharded = {p.dim for p in spec.placements if p.is_shard()}
    free = sorted((k for k in range(len(spec.shape))
                   if axes is not None and k not in axes and k not in sharded),
                  key=lambda k: -spec.shape[k])
    out = []
    for m, p in enumerate(spec.placements):
        if p.is_shard() and (axes is None or p.dim in axes):
            if free and spec.shape[free[0]] >= spec.mesh.shape[m]:
                out.append(Shard(free.pop(0)))
            else:
                out.append(Replicate())
        elif p.is_partial() and not (linear and p.reduce_op in ("sum", "avg") and
                                     D.keeps_partial(p.reduce_op, spec.dtype, result)):
            out.append(Replicate())
        else:
            out.append(p)
    return tuple(out)


def along_axes(name, a, axes, compute, *, linear, out_dim=None, result=None):
    """``compute(local)`` on every rank's lanes along ``axes`` (a tuple of
    normalised axes, or None for the flattened array); ``out_dim(k)`` is the
    output dim of input dim ``k`` outside ``axes`` (default: k); ``result`` the
    dtype it gives when that is not ``a``'s (a Partial must stay exact in it).
    Local when no mesh dim shards ``axes`` (and no Partial must be reduced); else
    the input moves first to ``lanes_layout``'s placements (one all-to-all to a
    free dim, or a gather when none is free), which is collective on the mesh.

    Example: ``along_axes("numpy.sort", dt, (1,), lambda x: np.sort(x, 1), linear=False)``.
    """
    if type(a) is not DTensor:
        _check(name, a)
    spec = a._spec
    mesh = spec.mesh
    if out_dim is None and _lanes_here(spec, axes):
        out = _on_blocks(name, a, axes, compute)
        if out is not None:
            return out
    target = lanes_layout(a, axes, linear, result)
    a = D.relayout(name, a, target)
    out_dim = out_dim or (lambda k: k)
    kept = [k for k in range(len(spec.shape)) if axes is not None and k not in axes]
    # A stand-in of one lane, whole along ``axes``, gives the output's shape where
    # this rank has no lanes: not a member, or an empty block, of which NumPy may
    # drop dims (nanquantile's q dim), so that this rank's shape would be another.
    stand_in = tuple(n if axes is None or k in axes else 1
                     for k, n in enumerate(spec.shape))
    mine = a.to_local() if mesh.get_coordinate() is not None else None
    if mine is None or any(mine.shape[k] == 0 for k in kept):
        local = np.asarray(compute(np.zeros(stand_in, spec.dtype)))
        if mine is not None:
            lshape = list(local.shape)
            for k in kept:
                lshape[out_dim(k)] = mine.shape[k]
            local = np.empty(lshape, local.dtype)
    else:
        local = np.asarray(compute(mine))
    shape = list(local.shape)
    for k in kept:
        shape[out_dim(k)] = spec.shape[k]
    placements = tuple(Shard(out_dim(p.dim)) if p.is_shard() else p for p in target)
    if _modes.tracing:
        _trace.local(name, [a], placements)
    if mesh.get_coordinate() is None:
        local = np.empty((0,), local.dtype)
    shape = tuple(shape)
    return DTensor(local, DTensorSpec(mesh, placements, shape, local.dtype,
                                      contiguous_strides(shape)))


def _on_blocks(name, a, axes, func, *args):
    """``func(block, *args)`` on this rank's block, where every lane along ``axes``
    (None: the flattened array) is whole on its rank (``_lanes_here``): NumPy on
    the block, nothing moved, the placements kept, the global shape NumPy's along
    the lanes. None where the block holds no lanes (not a member, or empty along
    another axis): then along_axes' stand-in gives the shape. Local."""
    spec = a._spec
    if spec.mesh._coordinate is None:
        return None
    mine = a.to_local() if a._requires_grad else a._data()
    if not mine.size and axes is not None:
        return None
    local = func(mine, *args)
    if type(local) is not np.ndarray:
        local = np.asarray(local)
    if _modes.tracing:
        _trace.local(name, [a], spec.placements)
    if (local.shape == mine.shape and local.dtype == spec.dtype
            and spec.stride == contiguous_strides(spec.shape)):
        return DTensor(local, spec)  # a flip, a sort: the input's layout
    shape = local.shape
    for p in spec.placements:
        if type(p) is Shard:  # of a dim outside the lanes: global there
            shape = list(shape)
            for q in spec.placements:
                if type(q) is Shard:
                    shape[q.dim] = spec.shape[q.dim]
            shape = tuple(shape)
            break
    return DTensor(local, DTensorSpec(spec.mesh, spec.placements, shape, local.dtype,
                                      contiguous_strides(shape)))


def _whole_lanes(a, axis):
    """``(axis,)`` normalised when ``a`` is a DTensor and ``axis`` an int in range
    along which every lane is whole on its rank (``_lanes_here``), else None: the
    common call of an entry along one axis, which then runs ``_on_blocks``
    without its general checks. Local."""
    if type(a) is not DTensor or type(axis) is not int:
        return None
    spec = a._spec
    nd = len(spec.shape)
    if not -nd <= axis < nd:
        return None
    axes = (axis + nd if axis < 0 else axis,)
    return axes if _lanes_here(spec, axes) else None


def _lanes_here(spec, axes) -> bool:
    """Whether every lane along ``axes`` (None: the flattened array) is whole on
    its rank, with nothing to reduce: no Partial, and no mesh dim shards ``axes``
    (any dim, for None). Local."""
    for p in spec.placements:
        kind = type(p)
        if kind is not Replicate and (kind is not Shard or axes is None or p.dim in axes):
            return False
    return True


def _axis(name, a, axis):
    """One axis, or None (the flattened array)."""
    if type(a) is not DTensor:
        _check(name, a)
    if axis is None:
        return None
    return _args.axes(operator.index(axis), len(a._spec.shape))


def _axes(name, a, axis):
    """An int, a tuple of ints, or None (every axis)."""
    _check(name, a)
    return _args.axes(axis, len(a._spec.shape))


def _sharding_one(a, axes):
    """The first mesh dim (of more than one rank) that shards the one axis of
    ``axes``, or None (also for None or several axes). Local."""
    if axes is None or len(axes) != 1:
        return None
    mesh = a._spec.mesh
    for i, p in enumerate(a._spec.placements):
        if p.is_shard() and p.dim == axes[0] and mesh.shape[i] > 1:
            return i
    return None


def _no_out(name, out):
    if out is not None:
        raise _registry.NoRule(f"{name}: out= is not supported on DTensors")


# -- sorting -------------------------------------------------------------------------

def _flat_sample_sort(a, axes) -> bool:
    """Whether a sort along ``axes`` (None: flattened) has no free dim to move the
    shard to and a sample sort can do it: the whole (flattened) array is sorted and
    one mesh dim shards it."""
    return (axes is None or a.ndim == 1) and S.sort_mesh_dim(a) is not None


def _lane_sample_sort(a, axes) -> bool:
    """Whether a sort along one axis of an n-D array is better done lane by lane
    with the sample sort: one mesh dim shards the axis, the others shard nothing,
    and no other dim is long enough to take the shard (so there are fewer than
    p ** (ndim - 1) lanes), where lanes_layout would gather."""
    if axes is None or a.ndim < 2:
        return False
    m = S.sort_mesh_dim(a)
    if m is None or a._spec.placements[m].dim != axes[0]:
        return False
    return lanes_layout(a, axes, False)[m].is_replicate()


def _sort_lanes(name, a, ax, indices):
    """np.sort (or stable np.argsort) along the sharded axis ``ax`` of an n-D
    array, one sample sort per lane (each collective along the sharding mesh dim):
    the output keeps ``Shard(ax)`` in the usual layout. Collective on the mesh."""
    a = D.relayout(name, a, lanes_layout(a, (), False))
    spec = a._spec
    mesh = spec.mesh
    m = S.sort_mesh_dim(a)
    length = spec.shape[ax]
    lane_shape = spec.shape[:ax] + spec.shape[ax + 1:]
    pl1 = tuple(Shard(0) if i == m else Replicate() for i in range(mesh.ndim))
    out_dtype = np.dtype(np.intp) if indices else spec.dtype
    member = mesh.get_coordinate() is not None
    local = np.moveaxis(a.to_local(), ax, -1) if member else None
    outs = []
    for idx in np.ndindex(*lane_shape):
        lane = local[idx] if member else np.empty((0,), spec.dtype)
        one = DTensor(np.ascontiguousarray(lane),
                      DTensorSpec(mesh, pl1, (length,), spec.dtype, (1,)))
        outs.append(S.sort_flat(name, one, indices).to_local())
    if member and not outs:
        # No lanes (another dim has size zero): the block is empty as it is.
        out = np.empty(a.to_local().shape, out_dtype)
    elif member:
        out = np.moveaxis(np.stack(outs).reshape(lane_shape + (-1,)), -1, ax)
        out = np.ascontiguousarray(out, out_dtype)
    else:
        out = np.empty((0,), out_dtype)
    return DTensor(out, DTensorSpec(mesh, spec.placements, spec.shape, out_dtype,
                                    contiguous_strides(spec.shape)))


def _whole_sample_stat(a, axes) -> bool:
    """Whether an order statistic over ``axes`` reduces every dim of an array that
    one mesh dim shards (so a sample sort finds it without a gather)."""
    return len(axes) == a.ndim and a.ndim > 0 and S.sort_mesh_dim(a) is not None


def _sorting(func):
    name = f"numpy.{func.__name__}"
    local = _ndarray_only(func)

    def impl(a, axis=-1, kind=None, order=None, **kwargs):
        here = None if order is not None or kwargs else _whole_lanes(a, axis)
        if here is not None:
            out = _on_blocks(name, a, here, local, axis, kind)
            if out is not None:
                return out
        if order is not None:
            raise _registry.NoRule(f"{name}: order= (structured fields) is not supported on "
                                   f"DTensors")
        axes = _axis(name, a, axis)
        # Lanes whole on their ranks sort where they are; else a sample sort may
        # keep the axis sharded.
        if axes is None or not _lanes_here(a._spec, axes):
            if _flat_sample_sort(a, axes):
                return S.sort_flat(name, a, func is np.argsort)
            if _lane_sample_sort(a, axes):
                return _sort_lanes(name, a, axes[0], func is np.argsort)
        if kwargs:
            return along_axes(name, a, axes,
                              lambda x: local(x, axis=axis, kind=kind, **kwargs), linear=False)
        return along_axes(name, a, axes, lambda x: local(x, axis, kind), linear=False)
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name} along an axis: local when the axis is not sharded, the "
                    f"output placed as the input; a sharded axis moves to a free dim first "
                    f"(one all-to-all). With no free dim, when one mesh dim shards the "
                    f"array, a distributed sample sort (lane by lane; ties in index "
                    f"order, as ``kind='stable'``) keeps the axis sharded (``axis=None``: "
                    f"a 1-D ``Shard(0)``); else gathered. Collective when anything "
                    f"moves.\n\n"
                    f"Example: ``{name}(dt, axis=1)`` of a "
                    f"``[Shard(0)]`` DTensor stays ``[Shard(0)]``.")
    return impl


for _f in (np.sort, np.argsort):
    _registry.implements(_f)(_sorting(_f))


def _partitioning(func):
    name = f"numpy.{func.__name__}"

    def impl(a, kth, axis=-1, kind="introselect", order=None):
        if order is not None:
            raise _registry.NoRule(f"{name}: order= is not supported on DTensors")
        if isinstance(kth, DTensor):
            raise TypeError(f"{name}: kth must be an int or a sequence of ints")
        axes = _axis(name, a, axis)
        return along_axes(name, a, axes, lambda x: func(x, kth, axis=axis, kind=kind),
                          linear=False)
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name} along an axis, local when it is not sharded (see "
                    f"numpy.sort on DTensors).\n\nExample: ``{name}(dt, 2, axis=1)``.")
    return impl


for _f in (np.partition, np.argpartition):
    _registry.implements(_f)(_partitioning(_f))


# -- differences, flips, rolls -------------------------------------------------------

@_registry.implements(np.diff)
def diff(a, n=1, axis=-1, prepend=np._NoValue, append=np._NoValue):
    """numpy.diff along an axis, local when it is not sharded; linear (a Partial sum
    is kept) without prepend/append. Array prepend/append values are joined to
    ``a`` along the axis first (np.concatenate), as NumPy does. Along an axis one mesh
    dim shards (and no prepend/append), each rank takes the n following rows from
    its neighbours in one exchange (``_halo``) and the output stays sharded.

    Example: ``np.diff(dt, axis=1).shape == (dt.shape[0], dt.shape[1] - 1)``.
    """
    name = "numpy.diff"
    if type(a) is not DTensor:  # a DTensor prepend= or append= called the rule
        a = D.implicit((a, prepend, append))[0]
    axes = _axis(name, a, axis)
    plain = prepend is np._NoValue and append is np._NoValue
    if not plain and axes is not None and any(
            extra is not np._NoValue and (isinstance(extra, DTensor) or np.ndim(extra))
            for extra in (prepend, append)):
        # NumPy's own way: the arrays joined along the axis, then differenced.
        parts = [_diff_part(v, a, axes[0]) for v in (prepend, a, append)
                 if v is not np._NoValue]
        return diff(np.concatenate(parts, axis=axes[0]), n, axes[0])
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"order must be non-negative but got {n!r}")
    m = _sharding_one(a, axes)
    if plain and m is not None:
        # A halo of n rows from the next ranks, not a move of the whole axis.
        return _halo.diff_sharded(a, n, axes[0], m)
    if plain and n > 0 and axes is not None:
        cut = _diff_slices(len(a._spec.shape), axes[0])
        return along_axes(name, a, axes, lambda x: _diff_cut(x, n, cut), linear=True)
    return along_axes(name, a, axes, lambda x: _diff_ndarray(x, n, axis, prepend, append),
                      linear=plain)


_diff_ndarray = _ndarray_only(np.diff)


def _diff_slices(ndim, axis) -> tuple:
    """(all but the first, all but the last) along ``axis`` of ``ndim`` dims, as
    keys; made once per pair."""
    cut = _DIFF_SLICES.get((ndim, axis))
    if cut is None:
        head = (slice(None),) * axis
        cut = _DIFF_SLICES[(ndim, axis)] = (head + (slice(1, None),), head + (slice(None, -1),))
    return cut


_DIFF_SLICES: dict = {}


def _diff_cut(x, n, cut):
    """numpy.diff of an ndarray (``n`` >= 1, no prepend/append) as NumPy computes it,
    the later elements less the earlier ``n`` times (not_equal for bools), without
    its checks, which the DTensor's passed."""
    op = np.not_equal if x.dtype == np.bool_ else np.subtract
    later, earlier = cut
    for _ in range(n):
        x = op(x[later], x[earlier])
    return x


def _diff_block(x, n, axis):
    """numpy.diff of one block along a normalised ``axis`` (``n`` >= 1): the
    executor's local function for np.diff (_C.register_differences below)."""
    return _diff_cut(x, n, _DIFF_SLICES.get((x.ndim, axis)) or _diff_slices(x.ndim, axis))


# np.diff along one int axis that no mesh dim shards, of a DTensor without
# Partials, is the executor's, taken in C before the entry runs: every block holds
# whole lanes, so each rank differences its own; the dim map is the core's
# mt_dimmap_lanes (the axis n shorter, the placements kept).
_C.register_differences(np.diff, _diff_block, _registry.call_label(np.diff))


def _diff_part(v, a, axis):
    """A prepend= or append= value of np.diff as a DTensor on ``a``'s mesh: a
    scalar broadcast to one row along ``axis``, an ndarray (alike on every rank)
    replicated. Local."""
    if type(v) is DTensor:
        return v
    v = np.asarray(v)
    if v.ndim == 0:
        shape = list(a.shape)
        shape[axis] = 1
        v = np.broadcast_to(v, tuple(shape))
    mesh = a.device_mesh
    return DTensor.from_local(np.ascontiguousarray(v), mesh, [Replicate()] * mesh.ndim)


@_registry.implements(np.flip, views=True)
def flip(m, axis=None):
    """numpy.flip: local along unsharded axes; a sharded axis moves first
    (see lanes_layout), or, when no dim can take its shard, flips by one exchange
    of reversed runs of rows (``_flip``).

    Example: ``np.flip(dt, 1)`` of a ``[Shard(0)]`` DTensor stays ``[Shard(0)]``.
    """
    if type(m) is not DTensor:
        _check("numpy.flip", m)
    spec = m._spec
    nd = len(spec.shape)
    axes = (axis,) if type(axis) is int and 0 <= axis < nd else _args.axes(axis, nd)
    if _lanes_here(spec, axes) and spec.mesh._coordinate is not None:
        # Each block flipped where it is, an empty one too: NumPy's view of it on
        # every rank, so no rank needs to hear whether another's elements moved,
        # and the views of it are filed under the same memory on every rank; a
        # program's call and mpitensor's alike.
        if _modes.tracing:
            _trace.local("numpy.flip", [m], spec.placements)
        strides = contiguous_strides(spec.shape)
        if spec.stride != strides:
            spec = DTensorSpec(spec.mesh, spec.placements, spec.shape, spec.dtype, strides)
        out = _flip_ndarray(m._data(), axes)
        # NumPy's flip of a 0-d array is a scalar: a DTensor holds an array.
        return DTensor(out if type(out) is np.ndarray else np.asarray(out), spec)
    program = _registry.program_call(np.flip)
    out = _flipped(m, axis)
    return _flip.as_view(m, out, axis, lambda p: _flipped(p, axis)) if program else out


_flip_ndarray = _ndarray_only(np.flip)


def _flipped(m, axis):
    """:func:`flip` itself: a view of the local array where no element moves."""
    axes = _axes("numpy.flip", m, axis)
    if axis is None and m.ndim > 1 and _flatten.sharding_dim(m) is not None:
        # Every axis reversed is the flattened array reversed: one exchange to
        # flat order, one to the flipped rows, one back, never a gather.
        flat, md, pls = _flatten.flatten("numpy.flip", m)
        return _flatten.unflatten("numpy.flip", _flip.flip_sharded(flat, 0), m.shape, md, pls)
    mesh_dim = _sharding_one(m, axes)
    if mesh_dim is not None and lanes_layout(m, axes, True)[mesh_dim].is_replicate():
        # No dim can take the shard: reversed runs of rows move, not the axis.
        return _flip.flip_sharded(m, axes[0])
    return along_axes("numpy.flip", m, axes, lambda x: np.flip(x, axes), linear=True)


@_registry.implements(np.roll)
def roll(a, shift, axis=None):
    """numpy.roll: local along unsharded axes; along a sharded axis (and a 1-D
    array's ``axis=None``) one exchange of the rows that change owner
    (``_roll``), placed as the input; ``axis=None`` of a sharded n-D array rolls
    the flattened array, reached and left by one exchange each (``_flatten``).

    Example: ``np.roll(dt, 2, axis=1)`` of a ``[Shard(0)]`` DTensor moves nothing.
    """
    _check("numpy.roll", a)
    if axis is None and a.ndim == 1:
        axis = 0
    if axis is None and a.ndim > 1 and _flatten.sharding_dim(a) is not None:
        # NumPy rolls the flattened array: flattened by one exchange, rolled by
        # one and put back by one, never a gather.
        pairs = np.broadcast(shift, 0)
        if pairs.ndim > 1:
            raise ValueError("'shift' and 'axis' should be scalars or 1D sequences")
        # NumPy's int() of each shift, which truncates a float one.
        total = sum(int(sh) for sh, _ in pairs)
        flat, md, pls = _flatten.flatten("numpy.roll", a)
        return _flatten.unflatten("numpy.roll", _roll.roll_sharded(flat, total, 0, md),
                                  a.shape, md, pls)
    if axis is not None:
        shifts: dict = {}
        for sh, ax in np.broadcast(shift, axis):
            ax = normalize_axis_tuple(int(ax), a.ndim)[0]
            shifts[ax] = shifts.get(ax, 0) + operator.index(sh)
        cut = [ax for ax in shifts if _sharding_one(a, (ax,)) is not None]
        if cut:
            # Each sharded axis rolls by one exchange of the rows that change
            # owner; the others roll locally.
            rest = tuple(ax for ax in shifts if ax not in cut)
            if rest:
                a = along_axes("numpy.roll", a, rest,
                               lambda x: np.roll(x, [shifts[k] for k in rest], rest),
                               linear=True)
            for ax in cut:
                a = _roll.roll_sharded(a, shifts[ax], ax, _sharding_one(a, (ax,)))
            return a
    axes = None if axis is None else normalize_axis_tuple(axis, a.ndim)
    return along_axes("numpy.roll", a, axes, lambda x: np.roll(x, shift, axis),
                      linear=True)


def _shift(func):
    name = f"numpy.fft.{func.__name__}"

    def impl(x, axes=None):
        ax = _axes(name, x, axes)
        return along_axes(name, x, ax, lambda y: func(y, axes), linear=True)
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name}: a roll along ``axes``, local where they are not "
                    f"sharded.\n\nExample: ``{name}(dt, axes=1)``.")
    return impl


for _f in (np.fft.fftshift, np.fft.ifftshift):
    _registry.implements(_f)(_shift(_f))


# -- the fft family ------------------------------------------------------------------

def _factors(n, p):
    """(n1, n2) with n1 * n2 == n, both multiples of p and n1 as near sqrt(n) as such
    a pair allows; None when n is not a multiple of p * p."""
    if n % (p * p):
        return None
    m = n // (p * p)
    u = max(d for d in range(1, int(m ** 0.5) + 1) if m % d == 0)
    return p * u, p * (m // u)


def _vector_fft(name, a, inverse, norm):
    """The fft (or ifft) of a 1-D DTensor that one mesh dim shards evenly in
    blocks of whole rows of an (n1, n2) matrix (n = n1 * n2, both multiples of
    the mesh dim's size), by the four-step method: the transform along the rows
    (after one all-to-all makes them whole), a twiddle factor, the transform along
    the columns (one all-to-all back), and one all-to-all that lays the result out
    in order. Output ``Shard(0)`` on that mesh dim. Collective on it."""
    spec = a._spec
    mesh = spec.mesh
    m = S.sort_mesh_dim(a)
    p = mesh.shape[m]
    n = spec.shape[0]
    n1, n2 = _factors(n, p)
    one = np.fft.ifft if inverse else np.fft.fft
    sign = 1.0 if inverse else -1.0
    pls = spec.placements
    other = tuple(Replicate() if i != m else None for i in range(mesh.ndim))

    def layout(dim):
        return tuple(Shard(dim) if q is None else q for q in other)

    def matrix(local, shape, placements):
        return DTensor(local, DTensorSpec(mesh, placements, shape, local.dtype,
                                          contiguous_strides(shape)))

    member = mesh.get_coordinate() is not None
    work = np.result_type(spec.dtype, np.complex64)
    if member:
        local = a.to_local().reshape(-1, n2)
    else:
        local = np.empty((0, n2), spec.dtype)
    rows = matrix(local, (n1, n2), layout(0))
    cols = D.relayout(name, rows, layout(1)).to_local()
    if member:
        f = one(cols, axis=0, norm=norm)
        f *= _twiddles(n1, n2, p, mesh.get_coordinate()[m], sign, f.dtype)
    else:
        f = np.empty((0, n2 // p), work)
    back = D.relayout(name, matrix(f, (n1, n2), layout(1)), layout(0)).to_local()
    g = one(back, axis=1, norm=norm) if member else np.empty((0, n2), work)
    # X[k1 + n1 k2] = g[k1, k2]: the transpose of g, row-major, is the result.
    t = D.relayout(name, matrix(g, (n1, n2), layout(0)), layout(1)).to_local()
    out = np.ascontiguousarray(t.T).reshape(-1) if member else np.empty((0,), g.dtype)
    if _modes.tracing:
        _trace.local(name, [a], pls)
    return DTensor(out, DTensorSpec(mesh, pls, (n,), out.dtype, contiguous_strides((n,))))


# (n1, n2, p, coordinate, sign, dtype) -> this rank's twiddle factors. Computing
# them costs a complex exp per element, as much as the transforms themselves, and a
# program transforms the same length again and again; a few lengths are kept.
_TWIDDLES: dict = {}
_TWIDDLES_KEPT = 4


def _twiddles(n1, n2, p, c, sign, dtype):
    """exp(sign 2 pi i k1 j2 / n) for k1 < n1 and this rank's columns j2 of n2."""
    key = (n1, n2, p, c, sign, np.dtype(dtype))
    t = _TWIDDLES.pop(key, None)
    if t is None:
        n = n1 * n2
        k1 = np.arange(n1, dtype=np.int64)[:, None]
        j2 = np.arange(c * (n2 // p), (c + 1) * (n2 // p), dtype=np.int64)[None, :]
        t = np.exp(sign * 2j * np.pi * ((k1 * j2) % n) / n).astype(dtype)
        t.flags.writeable = False
        while len(_TWIDDLES) >= _TWIDDLES_KEPT:
            del _TWIDDLES[next(iter(_TWIDDLES))]
    _TWIDDLES[key] = t
    return t


def _vector_fft_fits(a, axes, n) -> bool:
    """Whether the four-step fft applies: a 1-D array, n not given, sharded by one
    mesh dim (Partials reduced first) into blocks the method can use."""
    if a.ndim != 1 or n is not None or axes is None:
        return False
    m = S.sort_mesh_dim(a)
    if m is None or any(p.is_partial() for p in a._spec.placements):
        return False
    return _factors(a._spec.shape[0], a._spec.mesh.shape[m]) is not None


def _fft1(func):
    name = f"numpy.fft.{func.__name__}"

    def impl(a, n=None, axis=-1, norm=None, out=None):
        _no_out(name, out)
        axes = _axis(name, a, axis)
        if func in (np.fft.fft, np.fft.ifft, np.fft.rfft) and _vector_fft_fits(a, axes, n):
            if func is np.fft.rfft and a.dtype.kind == "c":
                raise TypeError(f"{name}: the input must be real")
            x = _vector_fft(name, a, func is np.fft.ifft, norm)
            if func is np.fft.rfft:
                # The non-negative frequencies: rows picked where they lie.
                x = x[np.arange(a.shape[0] // 2 + 1)]
            return x
        return along_axes(name, a, axes, lambda x: func(x, n, axis, norm), linear=True)
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name} along one axis: local when it is not sharded, the output "
                    f"placed as the input (a Partial sum kept: the transform is "
                    f"linear); a sharded axis moves to a free dim first. fft, ifft and "
                    f"rfft of a 1-D array whose length is a multiple of p * p (p ranks "
                    f"shard it) run the four-step method (three all-to-alls, output "
                    f"``Shard(0)``); otherwise a 1-D array is gathered."
                    f"\n\nExample: ``{name}(dt, axis=1)`` of a ``[Shard(0)]`` "
                    f"DTensor moves nothing.")
    return impl


def _stages(func, ax, norm):
    """NumPy's order of 1-D transforms for ``func`` over the axes ``ax``: groups of
    (axes, transform(x, axes), length rule); transforms within a group commute."""
    fft = np.fft
    kind = func.__name__.rstrip("2n")
    if kind in ("fft", "ifft"):
        many = fft.fftn if kind == "fft" else fft.ifftn
        return [(ax, lambda x, a: many(x, axes=a, norm=norm), "same")]
    if kind == "rfft":
        return [(ax[-1:], lambda x, a: fft.rfft(x, axis=a[0], norm=norm), "half"),
                (ax[:-1], lambda x, a: fft.fftn(x, axes=a, norm=norm), "same")]
    return [(ax[:-1], lambda x, a: fft.ifftn(x, axes=a, norm=norm), "same"),
            (ax[-1:], lambda x, a: fft.irfft(x, axis=a[0], norm=norm), "double")]


def _sharded_dims(spec) -> dict:
    """Tensor dim -> the mesh dims (longer than 1) that shard it."""
    out: dict = {}
    for m, p in enumerate(spec.placements):
        if p.is_shard() and spec.mesh.shape[m] > 1:
            out.setdefault(p.dim, []).append(m)
    return out


def _transform(name, a, func, axes, rule):
    """``func`` on the local array along ``axes``, which are whole on every rank;
    placements kept. Local."""
    spec = a._spec
    mesh = spec.mesh
    shape = list(spec.shape)
    for k in axes:
        shape[k] = {"same": shape[k], "half": shape[k] // 2 + 1,
                    "double": 2 * (shape[k] - 1)}[rule]
    if mesh.get_coordinate() is None:
        local = np.asarray(func(np.zeros((2,) * len(shape), spec.dtype), axes))
        local = np.empty((0,), local.dtype)
    else:
        local = np.asarray(func(a.to_local(), axes))
    if _modes.tracing:
        _trace.local(name, [a], spec.placements)
    shape = tuple(shape)
    return DTensor(local, DTensorSpec(mesh, spec.placements, shape, local.dtype,
                                      contiguous_strides(shape)))


def _pencil(name, a, stages):
    """The transforms of ``stages`` by the pencil method: each group runs first
    along its axes that are local, then the shards of its other axes move (one
    all-to-all) to dims it is done with or does not touch, preferring those no
    later group transforms, and it runs along them. A sharded axis with nowhere to
    go is gathered (reported). Collective on the mesh when anything moves."""
    a = D.relayout(name, a, lanes_layout(a, (), True))
    for i, (axes, func, rule) in enumerate(stages):
        if not axes:
            continue
        sharded = _sharded_dims(a._spec)
        here = tuple(k for k in axes if k not in sharded)
        if here:
            a = _transform(name, a, func, here, rule)
        rest = tuple(k for k in axes if k in sharded)
        if not rest:
            continue
        spec = a._spec
        later = {k for g in stages[i + 1:] for k in g[0]}
        taken = {k for k in sharded if k not in rest}
        target = list(spec.placements)
        for m, p in enumerate(spec.placements):
            if not (p.is_shard() and p.dim in rest and spec.mesh.shape[m] > 1):
                continue
            fits = [k for k in range(len(spec.shape)) if k not in rest and k not in taken
                    and spec.shape[k] >= spec.mesh.shape[m]]
            fits.sort(key=lambda k: (k in later, -spec.shape[k]))
            if fits:
                target[m] = Shard(fits[0])
                taken.add(fits[0])
            else:
                target[m] = Replicate()
        a = D.relayout(name, a, target)
        a = _transform(name, a, func, rest, rule)
    return a


def _fftn(func, default_axes):
    name = f"numpy.fft.{func.__name__}"

    def impl(a, s=None, axes=default_axes, norm=None, out=None):
        _no_out(name, out)
        _check(name, a)
        if axes is None:
            axes_ = tuple(range(a.ndim)) if s is None else tuple(range(-len(s), 0))
        else:
            axes_ = axes
        ax = normalize_axis_tuple(axes_, a.ndim, allow_duplicate=True)
        gathers = any(p.is_replicate() and q.is_shard() for p, q in
                      zip(lanes_layout(a, tuple(sorted(set(ax))), True),
                          a._spec.placements))
        if s is None and len(set(ax)) == len(ax) and ax and gathers:
            return _pencil(name, a, _stages(func, ax, norm))
        return along_axes(name, a, tuple(sorted(set(ax))),
                          lambda x: func(x, s, axes, norm), linear=True)
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name} over several axes: local when none is sharded, the other "
                    f"dims keep their placements; sharded axes move first to a free dim "
                    f"(see lanes_layout), or, with none free, by the pencil method: the "
                    f"local axes are transformed, one all-to-all moves the shard onto "
                    f"one of them, and the rest are transformed (the output is sharded "
                    f"there)."
                    f"\n\nExample: ``{name}(dt, axes=(1, 2))`` of a ``[Shard(0)]`` "
                    f"DTensor moves nothing.")
    return impl


for _f in (np.fft.fft, np.fft.ifft, np.fft.rfft, np.fft.irfft, np.fft.hfft, np.fft.ihfft):
    _registry.implements(_f)(_fft1(_f))
for _f in (np.fft.fftn, np.fft.ifftn, np.fft.rfftn, np.fft.irfftn):
    _registry.implements(_f)(_fftn(_f, None))
for _f in (np.fft.fft2, np.fft.ifft2, np.fft.rfft2, np.fft.irfft2):
    _registry.implements(_f)(_fftn(_f, (-2, -1)))


# -- order statistics ------------------------------------------------------------------

def _reduced_dim(axes, keepdims, lead):
    """Output dim of a kept input dim of a reduction over ``axes`` with ``lead``
    new leading dims (percentile's q)."""
    def out_dim(k):
        return lead + (k if keepdims else k - sum(1 for j in axes if j < k))
    return out_dim


def _empty_error(a, axes, call) -> None:
    """NumPy's own error, if any, for an order statistic over ``axes`` of ``a`` with
    an empty kept dim: ``call`` on an empty array of ``a``'s global shape (its
    result is empty too, so this costs nothing), alike on every rank. NumPy merges
    several reduced axes into one by a reshape that an empty kept dim leaves
    undetermined, a ValueError the lanes would not meet. Local."""
    if axes is not None and any(n == 0 for k, n in enumerate(a.shape) if k not in axes):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call(np.empty(a.shape, a.dtype))


def _median(func):
    name = f"numpy.{func.__name__}"

    def impl(a, axis=None, out=None, overwrite_input=False, keepdims=False):
        _no_out(name, out)
        axes = _axes(name, a, axis)
        _empty_error(a, axes, lambda x: func(x, axis=axes, keepdims=keepdims))
        if _whole_sample_stat(a, axes):
            return S.median_flat(name, a, func is np.nanmedian, keepdims)
        return along_axes(name, a, axes,
                          lambda x: func(x, axis=axes, keepdims=keepdims),
                          linear=False, out_dim=_reduced_dim(axes, keepdims, 0))
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name} over ``axis``: local when no mesh dim shards the reduced "
                    f"axes, the kept dims keep their placements; sharded reduced axes "
                    f"move first (see lanes_layout).\n\n"
                    f"Example: ``{name}(dt, axis=1)`` of a "
                    f"``[Shard(0)]`` DTensor is ``[Shard(0)]``.")
    return impl


for _f in (np.median, np.nanmedian):
    _registry.implements(_f)(_median(_f))


def _quantile(func):
    name = f"numpy.{func.__name__}"

    def impl(a, q, axis=None, out=None, overwrite_input=False, method="linear",
             keepdims=False, *, weights=None):
        _no_out(name, out)
        if weights is not None:
            raise _registry.NoRule(f"{name}: weights= is not supported on DTensors")
        if isinstance(q, DTensor):
            raise TypeError(f"{name}: q must be a scalar or a plain array (the same on "
                            f"every rank), not a DTensor")
        weak_q = type(q) in (int, float)
        axes = _axes(name, a, axis)
        _empty_error(a, axes, lambda x: func(x, q, axis=axes, method=method,
                                             keepdims=keepdims))
        nan = func in (np.nanpercentile, np.nanquantile)
        if _whole_sample_stat(a, axes) or (nan and 0 in a.shape):
            percent = func in (np.percentile, np.nanpercentile)
            qq = np.asanyarray(np.true_divide(q, 100) if percent else q)
            if a.dtype.kind == "c":
                raise TypeError("a must be an array of real numbers")
            if not _npq._quantile_is_valid(qq):
                raise ValueError("Percentiles must be in the range [0, 100]" if percent
                                 else "Quantiles must be in the range [0, 1]")
            if nan and 0 in a.shape:
                # NumPy's rule for an empty array: its nanmean (q's dims dropped).
                return np.nanmean(a, axis=axis, keepdims=keepdims)
            return S.quantile_flat(name, a, qq, method, weak_q, nan, keepdims)
        # q as given: a Python float is weak in NumPy's promotion (a float32 array
        # keeps float32).
        return along_axes(name, a, axes,
                          lambda x: func(x, q, axis=axes, method=method,
                                         keepdims=keepdims),
                          linear=False, out_dim=_reduced_dim(axes, keepdims, np.ndim(q)))
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name} over ``axis`` (q the same on every rank): local when no "
                    f"mesh dim shards the reduced axes; the kept dims keep their "
                    f"placements after q's dims. An empty array's nanpercentile and "
                    f"nanquantile are its nanmean, without q's dims, as NumPy's."
                    f"\n\nExample: ``{name}(dt, [0.5, 0.9], "
                    f"axis=1)`` of a ``[Shard(0)]`` DTensor is ``[Shard(1)]``.")
    return impl


for _f in (np.percentile, np.quantile, np.nanpercentile, np.nanquantile):
    _registry.implements(_f)(_quantile(_f))


# -- scans -----------------------------------------------------------------------------

def _scan(name, a, ax, func, linear, op, result):
    """``func`` along the sharded axis ``ax``: an exclusive scan (MPI_Exscan) of the
    lanes' totals over each mesh dim that shards it gives what the ranks before
    each one add (or multiply) in (``_offsets``); ``result`` is the dtype ``func``
    gives. Collective on those mesh dims (and on the mesh when a Partial must be
    reduced first)."""
    a = D.relayout(name, a, lanes_layout(a, (), linear, result))
    spec = a._spec
    mesh = spec.mesh
    dims = [m for m, p in enumerate(spec.placements) if p.is_shard() and p.dim == ax]
    coord = mesh.get_coordinate()
    if coord is None:
        local = np.asarray(func(np.zeros((1,) * len(spec.shape), spec.dtype)))
        local = np.empty((0,), local.dtype)
    else:
        out_dtype = np.asarray(func(np.zeros((1,) * len(spec.shape), spec.dtype))).dtype
        x = np.ascontiguousarray(a.to_local(), out_dtype)
        # Every rank sums its lanes first (a read-only pass), so that the exclusive
        # scan never waits on another rank's scan, then scans once with the offset
        # folded in: each lane starts from what the ranks before it hold, in
        # NumPy's order, and no second pass adds the offsets to the output.
        totals = _lane_totals(x, ax, op)
        if _modes.tracing:
            # The global shape: the checks compare this text across ranks.
            _trace.collective(f"{name}: exclusive scan of the shard totals", mesh,
                              spec.placements, spec.shape, totals.dtype)
        local, _ = _lanes.scan(x, ax, op,
                               init=_offsets(mesh, totals, dims, coord, op, (spec, ax)))
    return DTensor(local, DTensorSpec(mesh, spec.placements, spec.shape, local.dtype,
                                      contiguous_strides(spec.shape)))


def _offsets(mesh, totals, dims, coord, op, lanes=None):
    """What the ranks before this one along the axis hold of each lane (their sum,
    or product, as ``op``), given each rank's lane ``totals``; None on the first
    rank. The axis is cut by the mesh dims ``dims`` nested, the first outermost:
    innermost first, an exclusive scan over the mesh dim, then the group's totals
    reduced over it for the next mesh dim out. ``lanes`` is (spec, axis) when the
    totals are the lanes of that tensor along that axis, whose other dims may be
    cut unevenly; None when every rank's totals have one shape. Collective on
    ``dims``."""
    if totals.dtype == np.bool_:
        combine = np.logical_or if op == CORE.REDUCE_SUM else np.logical_and
    else:
        combine = np.add if op == CORE.REDUCE_SUM else np.multiply
    offset = None
    for i in range(len(dims) - 1, -1, -1):
        m = dims[i]
        before = np.array(totals, order="C")  # the scan writes in place
        _comm.exscan(mesh, before, m, op)
        if coord[m] > 0:
            offset = before if offset is None else combine(before, offset)
        if i > 0:
            totals = (_all_reduce(mesh, totals, CORE.REDUCE_OPS[op], (m,)) if lanes is None
                      else _lanes_reduced(totals, *lanes, dims[:i + 1], op))
    return offset


def _lanes_reduced(totals, spec, ax, unreduced, op):
    """The lane ``totals`` of the tensor of ``spec`` along ``ax``, combined by ``op``
    over the last of the mesh dims ``unreduced`` (which cut ``ax`` and whose groups'
    totals differ): the totals as the DTensor they are, the tensor's shape without
    ``ax`` cut as its other dims are (unevenly, too), Partial on ``unreduced``,
    redistributed to Replicate on that one mesh dim; a Partial the scan kept stays.
    Collective on the mesh."""
    name = CORE.REDUCE_OPS[op]
    shape = spec.shape[:ax] + spec.shape[ax + 1:]
    pls = [Partial(name) if k in unreduced
           else Replicate() if p.is_shard() and p.dim == ax
           else Shard(p.dim - (p.dim > ax)) if p.is_shard()
           else p for k, p in enumerate(spec.placements)]
    # A 1-D tensor's one lane total comes as shape (1,); its DTensor is 0-d.
    local = np.array(totals, order="C").reshape(totals.shape if shape else ())
    t = DTensor(local, DTensorSpec(spec.mesh, tuple(pls), shape, totals.dtype,
                                   contiguous_strides(shape)))
    pls[unreduced[-1]] = Replicate()
    return t.redistribute(spec.mesh, pls).to_local().reshape(totals.shape)


def _lane_totals(x, ax, op):
    """The sum (``op`` REDUCE_SUM) or product of each lane of C-contiguous ``x`` along
    ``ax``, in ``x``'s dtype, C-contiguous. Lanes of whole rows are summed row by
    row in the scan's own order (a row's elements side by side in vectors); lanes
    of single elements by NumPy's reduction, whose vectors a serial sum lacks
    (sums of floats then round as numpy.sum does). Local."""
    if math.prod(x.shape[ax + 1:]) > 1 or (x.dtype.itemsize == 2 and _dtypes.is_inexact(x.dtype)):
        # 2-byte floats round every step: NumPy's reduction would round differently.
        return _lanes.scan(x, ax, op, out=False)[1]
    if x.dtype == np.bool_:
        ufunc = np.logical_or if op == CORE.REDUCE_SUM else np.logical_and
    else:
        ufunc = np.add if op == CORE.REDUCE_SUM else np.multiply
    return np.ascontiguousarray(ufunc.reduce(x, axis=ax, dtype=x.dtype))


def _result_dtype(func, dtype, given):
    """The dtype ``func`` (cumsum, cumprod) gives for elements of ``dtype`` and its
    ``dtype=`` argument ``given``, asked of NumPy once per kind of call."""
    try:
        key = (func, dtype, given)
        hit = _RESULT_DTYPES.get(key)
    except TypeError:  # an unhashable dtype= argument: NumPy judges it
        return func(np.zeros(1, dtype), dtype=given).dtype
    if hit is None:
        hit = _RESULT_DTYPES[key] = func(np.zeros(1, dtype), dtype=given).dtype
    return hit


_RESULT_DTYPES: dict = {}


def _cumulative(func, linear, op):
    name = f"numpy.{func.__name__}"
    local = _ndarray_only(func)

    def impl(a, axis=None, dtype=None, out=None):
        here = None if out is not None else _whole_lanes(a, axis)
        if here is not None:
            got = _on_blocks(name, a, here, local, axis, dtype)
            if got is not None:
                return got
        if out is not None:
            _no_out(name, out)
        axes = _axis(name, a, axis)
        if axes is None and _rows_only(a) and _even_rows(a):
            # Flattening rows sharded by mesh dims keeps them sharded (C order):
            # the flattened array is scanned as a 1-D one, without a gather.
            a, axis, axes = a if a.ndim == 1 else np.reshape(a, -1), 0, (0,)
        elif axes is None and _flatten.sharding_dim(a) is not None:
            # Any other sharded layout reaches flat order by one exchange.
            a, axis, axes = _flatten.flatten(name, a)[0], 0, (0,)
        # An int8 sum accumulates in int64, a float one cast by dtype= truncates:
        # a Partial passes only when each rank's part converts exactly.
        result = _result_dtype(func, a._spec.dtype, dtype)
        if axes is not None:
            for p in a._spec.placements:
                if p.is_shard() and p.dim == axes[0]:
                    return _scan(name, a, axes[0], lambda x: local(x, axis=axis, dtype=dtype),
                                 linear, op, result)
        return along_axes(name, a, axes, lambda x: local(x, axis=axis, dtype=dtype),
                          linear=linear, result=result)
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name} along an axis: local when it is not sharded, the output "
                    f"placed as the input; along a sharded axis, one exclusive scan "
                    f"of the shard totals per mesh dim that shards it, and where "
                    f"several do, an all-reduce of each inner group's totals (bytes: "
                    f"one lane's cross section each); ``axis=None`` scans the "
                    f"flattened array: by the same scans when mesh dims shard dim 0, "
                    f"nothing else is sharded or Partial and the rows split evenly "
                    f"(flattening then moves nothing; the result is sharded so "
                    f"there), else after one exchange to the flat blocks "
                    f"(``_flatten``), never a gather.\n\nExample: ``{name}(dt, axis=0)`` "
                    f"of a ``[Shard(0)]`` DTensor stays ``[Shard(0)]``; so does "
                    f"``{name}(dt)``, and of a ``[Shard(0), Shard(0)]`` one.")
    return impl


def _even_rows(a) -> bool:
    """Whether the mesh dims that shard ``a``'s rows cut them into equal blocks
    (a reshape to the flat array then moves nothing). Local."""
    mesh = a._spec.mesh
    k = int(np.prod([mesh.shape[i] for i, p in enumerate(a._spec.placements)
                     if p.is_shard()]))
    return a.ndim == 1 or (a.shape[0] % k == 0 and a.size > 0)


def _rows_only(a) -> bool:
    """Whether some mesh dims shard ``a`` on dim 0 and every other mesh dim
    replicates it (its flattened array is then sharded the same way where the
    rows split evenly)."""
    pls = a._spec.placements
    return (a.ndim >= 1 and all(p.is_replicate() or (p.is_shard() and p.dim == 0)
                                for p in pls)
            and any(p.is_shard() for p in pls))


_registry.implements(np.cumsum)(_cumulative(np.cumsum, True, CORE.REDUCE_SUM))

# A call along one int axis that no mesh dim shards, without Partials, is the
# executor's, taken in C before any Python entry runs: every block holds whole
# lanes, so NumPy's function runs on it, nothing moves and the placements stay
# (the entries above give the same on every other call). np.sort's axis defaults
# to the last, the others' to the flattened array, which is the entry's.
for _f, _local, _axis_default in ((np.sort, _sort_ndarray, -1),
                                  (np.cumsum, np.ndarray.cumsum, None),
                                  (np.flip, _flip_ndarray, None)):
    _C.register_lanes(_f, _local, _axis_default, _registry.call_label(_f))
_registry.implements(np.cumprod)(_cumulative(np.cumprod, False, CORE.REDUCE_PRODUCT))


def _identity_slab(res, ax, value):
    """A DTensor of ``res``'s shape with length one along ``ax``, filled with
    ``value``, laid out as ``res`` except that ``ax`` and Partials are replicated,
    made on every rank without communicating."""
    shape = tuple(1 if d == ax else n for d, n in enumerate(res.shape))
    pls = [Replicate() if p.is_partial() or (p.is_shard() and p.dim == ax) else p
           for p in res._spec.placements]
    return _factories.full(shape, value, res.dtype, device_mesh=res.device_mesh,
                           placements=pls)


def _array_api_cumulative(func, scan, identity):
    name = f"numpy.{func.__name__}"

    def impl(x, /, *, axis=None, dtype=None, out=None, include_initial=False):
        _check(name, x)
        _no_out(name, out)
        if x.ndim == 0:
            x = np.reshape(x, (1,))
        if axis is None:
            if x.ndim >= 2:
                raise ValueError("For arrays which have more than one dimension "
                                 "``axis`` argument is required.")
            axis = 0
        ax = normalize_axis_tuple(operator.index(axis), x.ndim)[0]
        # NumPy's own dtype for x's (the accumulate's), given to the scan explicitly.
        dtype = func(np.zeros((1,) * x.ndim, x.dtype), axis=ax, dtype=dtype).dtype
        res = scan(x, axis=ax, dtype=dtype)
        if not include_initial:
            return res
        return np.concatenate([_identity_slab(res, ax, identity), res], axis=ax)
    impl.__name__ = func.__name__
    impl.__doc__ = (f"{name} of a DTensor: ``{scan.__name__}``'s rule along ``axis`` (a "
                    f"scan of each shard from the totals of the shards before it when "
                    f"the axis is sharded), with ``include_initial`` the identity "
                    f"prepended along the axis by numpy.concatenate's rule (rows move "
                    f"only where the longer axis cuts the shards elsewhere). Collective "
                    f"on the mesh dims that shard the axis.\n\nExample: "
                    f"``{name}(dt, axis=0, include_initial=True)``.")
    return impl


_registry.implements(np.cumulative_sum)(
    _array_api_cumulative(np.cumulative_sum, _registry.functions[np.cumsum], 0))
_registry.implements(np.cumulative_prod)(
    _array_api_cumulative(np.cumulative_prod, _registry.functions[np.cumprod], 1))
