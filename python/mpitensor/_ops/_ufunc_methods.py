"""ufunc methods on DTensors as the distributed operations they equal, so that
``np.add.reduce`` costs what ``np.sum`` costs and never gathers the array:

| method | is | placements |
|---|---|---|
| ``reduce`` of add, multiply, maximum, minimum, logical_and, logical_or | ``sum``, ``prod``, ``max``, ``min`` (of the elements cast to ``dtype=`` first, as NumPy's), ``all``, ``any`` (``axis=0`` by default, as ufunc.reduce) | the reduction's: a reduced sharded dim gives a Partial or a merge |
| ``reduce`` of maximum's kin (fmax, fmin, the logical and bitwise ufuncs, gcd, equal and not_equal of booleans, logaddexp, logaddexp2, hypot) along one axis | NumPy's reduce of each block along an unsharded axis, reduceat's one segment along a sharded one | Replicate over the mesh dim that shards the axis |
| ``accumulate`` of add, multiply | ``cumsum``, ``cumprod`` along ``axis`` (0 by default) | the scan's |
| ``accumulate`` of maximum, minimum and the others above | each rank scans its block and combines the totals of the ranks before it (one all-gather of a slice per rank) | ``a``'s |
| float16 results of the float ufuncs above (logaddexp, hypot, ... of float16, uint8 or bool) | never regrouped (NumPy rounds each step to half precision): the fold below, as the result's dtype decides (``_fold.regroups``) | as the fold's |
| ``outer`` of any elementwise ufunc of two operands | the ufunc of the first operand with the second's dims appended, broadcast | the elementwise rule's |
| ``reduceat`` of add, multiply, maximum, minimum, fmax, fmin, the logical and bitwise ufuncs and the others above | each rank's pieces of the segments, all-gathered over the mesh dim that shards the axis and combined (local when none does) | ``len(indices)`` along the axis, Replicate over that mesh dim |
| ``reduce``, ``accumulate``, ``reduceat`` of the ufuncs that may not be regrouped (subtract, divide, fmod, power, arctan2, the comparisons, the shifts, lcm, ...) | NumPy's left fold, continued rank after rank from the carry the rank before sends (_fold.py: one slice, or one per segment, per rank). Where NumPy's reduction is no fold of its steps (float32/64 power and arctan2, half-precision add/subtract/multiply/divide reductions, complex and long double results; the result's dtype decides), a sharded axis gathers, and so does an unsharded one unless the block is the whole array: NumPy's value then depends on how it iterates the whole array | accumulate: ``a``'s; reduce and reduceat: Replicate over the mesh dim that shards the axis |
| ``at`` of any ufunc, with integer indices and a plain or scalar operand | each rank applies the updates that land in its block, in place | the target's; ``add``/``subtract`` keep a Partial max or min target, and an integer Partial sum one (updated on one rank); other Partials or a strided target gather |
| ``at`` with one integer DTensor of row indices | each (row, value) goes to the rank that holds the row, along the mesh dim that cuts dim 0 (_scatter.py) | the target's; a Partial or strided target gathers |

Every other method and ufunc (divmod's, ``initial=``,
``where=``, ...) raises NoRule before anything moves, which hands the
call to the fallback (_fallback.py): NumPy on the gathered arrays.
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _modes, _registry
from .._dtensor import DTensor
from .._dtensor_spec import contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _fold
from .._algorithms import _views
from ._scatter import ufunc_at_rows

_REDUCE = {np.add: np.sum, np.multiply: np.prod, np.maximum: np.max, np.minimum: np.min,
           np.logical_and: np.all, np.logical_or: np.any}
_ACCUMULATE = {np.add: np.cumsum, np.multiply: np.cumprod}
# The keywords the equivalent functions take alike.
_REDUCE_KW = frozenset(("axis", "dtype", "out", "keepdims"))
_ACCUMULATE_KW = frozenset(("axis", "dtype", "out"))


def _no_rule(name: str, why: str):
    return _registry.NoRule(f"{name} has no sharding rule for DTensors in mpitensor "
                            f"({why})")


def method(ufunc, name: str, operands: tuple, kwargs: dict):
    """``ufunc.<name>(*operands, **kwargs)`` through the operation it equals, or
    NoRule. Collective on the mesh when that operation moves data.

    Example: ``method(np.add, "reduce", (dt,), {"axis": 1})`` is ``np.sum(dt, axis=1)``.
    """
    label = f"numpy.{ufunc.__name__}.{name}"
    if name == "reduce":
        return _reduce(ufunc, label, operands, kwargs)
    if name == "accumulate":
        return _accumulate(ufunc, label, operands, kwargs)
    if name == "outer":
        return _outer(ufunc, label, operands, kwargs)
    if name == "reduceat":
        return _reduceat(ufunc, label, operands, kwargs)
    if name == "at":
        if operands and type(operands[0]) is DTensor:
            # into a view basic indexing made, what it changed reaches the base
            return _views.write(operands[0], lambda: _at(ufunc, label, operands, kwargs),
                                region=_views.CHANGED)
        return _at(ufunc, label, operands, kwargs)
    raise _no_rule(label, "no distributed algorithm")


def _one_array(label: str, operands: tuple, kwargs: dict, allowed) -> tuple:
    """(the array, its axis) of a reduce or accumulate call, ufunc.reduce's
    positional order (array, axis, dtype, out) folded into the keywords."""
    names = ("axis", "dtype", "out")
    if not 1 <= len(operands) <= 1 + len(names):
        raise _no_rule(label, "an unusual argument form")
    kw = dict(kwargs)
    for key, value in zip(names, operands[1:]):
        if key in kw:
            raise TypeError(f"{label}: got multiple values for {key}")
        kw[key] = value
    if any(k not in allowed for k in kw) or type(operands[0]) is not DTensor:
        raise _no_rule(label, f"keywords {sorted(set(kw) - allowed)} or a non-DTensor "
                              f"operand")
    out = kw.get("out")
    if isinstance(out, tuple):
        if len(out) != 1:
            raise ValueError(f"{label}: out= takes one array")
        kw["out"] = out[0]
    if kw.get("out") is None:
        kw.pop("out", None)
    kw.setdefault("axis", 0)
    return operands[0], kw


def _reduce(ufunc, label: str, operands: tuple, kwargs: dict):
    func = _REDUCE.get(ufunc)
    if func is None and ufunc not in _fold.REGROUPABLE and not _fold.foldable(ufunc):
        raise _no_rule(label, "no reduction of this ufunc")
    a, kw = _one_array(label, operands, kwargs, _REDUCE_KW)
    if func in (np.sum, np.prod) and not _fold.regroups(
            ufunc, _fold.kind(ufunc, a.dtype, kw.get("dtype"), "reduce")):
        func = None  # float16 results: NumPy's own reduction, as for the ufuncs below
    if func is None:
        # One segment of the whole axis: reduceat's pieces and their combination.
        axis = kw.get("axis")
        if not isinstance(axis, (int, np.integer)) or kw.get("out") is not None:
            raise _no_rule(label, "an axis that is not one int, or out=")
        axis = normalize_axis_index(int(axis), a.ndim)
        if a.shape[axis] == 0:
            got = _reduce_empty(ufunc, label, a, axis, kw.get("dtype"))
        else:
            got = _segmented(ufunc, label, "reduce", a, np.zeros(1, np.intp), axis,
                             kw.get("dtype"))
        return got if kw.get("keepdims") else np.squeeze(got, axis)
    if func in (np.all, np.any):
        if kw.pop("dtype", None) not in (None, bool, np.bool_):
            raise _no_rule(label, "a dtype= other than bool")
    elif func in (np.max, np.min) and kw.get("dtype") is not None:
        # NumPy casts the elements to dtype= first (its error, if any, from its own
        # call on one element, alike on every rank), then takes the extreme.
        cast = ufunc.reduce(np.zeros(1, a.dtype), dtype=kw.pop("dtype")).dtype
        a = a.astype(cast)
    return func(a, **kw)


def _reduce_empty(ufunc, label: str, a, axis: int, dtype):
    """``ufunc.reduce`` of ``a`` over its empty ``axis``, keeping it: NumPy's
    identity in every place, or NumPy's ValueError (a ufunc without one) on every
    rank, from NumPy's own call on an empty block, before anything moves. Local."""
    spec = a._spec
    pl = tuple(spec.placements)
    _axis_dims(label, pl, axis)
    shape = spec.shape[:axis] + (1,) + spec.shape[axis + 1:]
    member = spec.mesh.get_coordinate() is not None
    block = a.to_local() if member else np.zeros(spec.shape, spec.dtype)
    res = ufunc.reduce(block, axis=axis, dtype=dtype, keepdims=True)
    if not member:
        res = np.empty((0,), res.dtype)
    out_pl = tuple(Replicate() if p.is_shard() and p.dim == axis else p for p in pl)
    return DTensor.from_local(np.ascontiguousarray(res), spec.mesh, out_pl, shape=shape,
                              stride=contiguous_strides(shape))


def _accumulate(ufunc, label: str, operands: tuple, kwargs: dict):
    func = _ACCUMULATE.get(ufunc)
    if ufunc is np.subtract:
        try:
            return _subtract_accumulate(label, operands, kwargs)
        except _registry.NoRule:
            pass  # a float one: the fold below
    if func is None and ufunc not in _fold.REGROUPABLE and not _fold.foldable(ufunc):
        raise _no_rule(label, "no scan of this ufunc")
    a, kw = _one_array(label, operands, kwargs, _ACCUMULATE_KW)
    if func is not None and kw["axis"] is not None and not _fold.regroups(
            ufunc, _fold.kind(ufunc, a.dtype, kw.get("dtype"))):
        func = None  # float16 results: NumPy's running sum, step by step, as below
    if func is None:
        if kw.get("out") is not None or kw["axis"] is None:
            raise _no_rule(label, "out= or axis=None")
        axis = normalize_axis_index(operator.index(kw["axis"]), a.ndim)
        if _fold.regroups(ufunc, _fold.kind(ufunc, a.dtype, kw.get("dtype"))):
            return _scan(ufunc, label, a, axis, kw.get("dtype"))
        return _fold_scan(ufunc, label, a, axis, kw.get("dtype"))
    if kw["axis"] is None:
        # ufunc.accumulate has no flattening form: NumPy refuses axis=None.
        raise TypeError(f"{label}: axis=None is not supported by accumulate")
    return func(a, **kw)


def _fold_scan(ufunc, label: str, a, axis: int, dtype):
    """``ufunc.accumulate`` of a ufunc whose results may not be regrouped: NumPy's
    left fold, as a chain over the mesh dim that shards ``axis`` (_fold.py), local
    when none does (NumPy scans along the axis once per position of the other
    dims, so a block whole along it gives its bits whatever the dtype); NoRule
    (the gathered call) along a sharded axis where the chain would not give
    NumPy's bits. Placements as ``a``'s."""
    spec = a._spec
    pl = tuple(spec.placements)
    dims = _axis_dims(label, pl, axis)
    kind = _fold.kind(ufunc, spec.dtype, dtype)
    if dims and not _fold.exact(ufunc, kind, "accumulate"):
        raise _no_rule(label, f"no fold of {kind} that gives NumPy's bits")
    if spec.mesh.get_coordinate() is None:
        res = np.empty((0,), kind)
    elif not dims:
        res = ufunc.accumulate(a.to_local(), axis=axis, dtype=dtype)
    else:
        res = _fold.accumulate(ufunc, a, axis, dtype, dims[0], kind)
    return DTensor.from_local(np.ascontiguousarray(res), spec.mesh, pl, shape=spec.shape,
                              stride=contiguous_strides(spec.shape))


def _subtract_accumulate(label, operands, kwargs):
    """np.subtract.accumulate of an integer DTensor: ``x0 - x1 - ... - xi`` is
    ``2 * x0 - (x0 + ... + xi)`` in the integers' wrapping arithmetic, exactly,
    so it is add's scan and one row of the axis. A float one is not (a regrouped
    sum rounds otherwise than NumPy's running difference): NoRule, and the
    fold (_fold.py)."""
    a, kw = _one_array(label, operands, kwargs, _ACCUMULATE_KW)
    if (a.dtype.kind not in "iu" or kw.get("out") is not None or kw.get("dtype") is not None
            or kw["axis"] is None):
        raise _no_rule(label, "only integers, without out=, dtype= or axis=None")
    ax = normalize_axis_index(operator.index(kw["axis"]), a.ndim)
    total = np.add.accumulate(a, axis=ax, dtype=a.dtype)
    if a.shape[ax] == 0:
        return total
    first = np.take(a, [0], axis=ax)
    # One row, every rank of the axis's mesh dims needs it: its all-gather moves
    # a cross section, not the array.
    first = D.relayout(label, first, [Replicate() if p.is_shard() and p.dim == ax else p
                                      for p in first._spec.placements], records=True)
    return first * 2 - total


def _reduceat(ufunc, label: str, operands: tuple, kwargs: dict):
    """``ufunc.reduceat(a, indices, axis, dtype)``: see :func:`_segmented`."""
    kw = dict(kwargs)
    for key, value in zip(("indices", "axis", "dtype", "out"), operands[1:]):
        kw[key] = value
    a = operands[0]
    if (type(a) is not DTensor or not (ufunc in _fold.REGROUPABLE or _fold.foldable(ufunc))
            or len(operands) > 4
            or kw.get("out") is not None or "indices" not in kw
            or set(kw) - {"indices", "axis", "dtype", "out"}
            or isinstance(kw["indices"], DTensor)):
        raise _no_rule(label, "an operand, keyword or ufunc without a distributed form")
    axis = normalize_axis_index(operator.index(kw.get("axis", 0)), a.ndim)
    n = a._spec.shape[axis]
    idx = np.asarray(kw["indices"])
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        raise _no_rule(label, "indices that are not a 1-D integer array")
    for i in idx.tolist():
        if not 0 <= i < n:
            raise IndexError(f"index {i} out-of-bounds in {ufunc.__name__}.reduceat "
                             f"[0, {n})")
    return _segmented(ufunc, label, "reduceat", a, idx, axis, kw.get("dtype"))


def _segmented(ufunc, label: str, method: str, a, idx, axis: int, dtype):
    """``ufunc.reduceat(a, idx, axis, dtype)``, or ``ufunc.reduce(a, axis, dtype,
    keepdims=True)`` (``method`` "reduce", ``idx`` ``[0]``), by NumPy's rule for
    the result's dtype on every path:

    - no mesh dim shards ``axis``: NumPy's own ``method`` on each rank's block.
      Where the results are neither regrouped (``_fold.regroups``) nor an exact
      fold (_fold.exact: float power and arctan2, half-precision sums, complex),
      NumPy's value depends on how it iterates the whole array (which loop runs
      along the axis), so only a block that is the whole array gives it; any
      other layout gathers (NoRule);
    - a sharded ``axis``: each rank reduces its piece of every segment and the
      pieces (one record per segment) are all-gathered over the mesh dim that
      shards ``axis`` and combined in rank order where the results regroup, else
      folded rank after rank (_fold.py) where that is exact, else gathered.

    The result has ``len(idx)`` along ``axis``, Replicate over that mesh dim, the
    other dims as ``a``'s. Collective on that mesh dim when it exists."""
    spec = a._spec
    pl = tuple(spec.placements)
    dims = _axis_dims(label, pl, axis)
    kind = _fold.kind(ufunc, spec.dtype, dtype, method)
    regroup = _fold.regroups(ufunc, kind)
    folds = not regroup and _fold.exact(ufunc, kind, method)
    whole = all(not p.is_shard() or n == 1 for p, n in zip(pl, spec.mesh.shape))
    if not (regroup or folds or (whole and not dims)):
        raise _no_rule(label, f"no {method} of {kind} results in this layout that gives "
                              f"NumPy's bits")
    mesh = spec.mesh
    out_shape = spec.shape[:axis] + (len(idx),) + spec.shape[axis + 1:]
    out_pl = tuple(Replicate() if m in dims else p for m, p in enumerate(pl))
    if mesh.get_coordinate() is None:
        res = np.empty((0,), kind)
    elif not dims and method == "reduce":
        res = ufunc.reduce(a.to_local(), axis=axis, dtype=dtype, keepdims=True)
    elif not dims:
        res = ufunc.reduceat(a.to_local(), idx, axis=axis, dtype=dtype)
    elif regroup:
        res = _segments_across(ufunc, a, idx, axis, dtype, dims[0], method)
    else:
        res = _fold.segments(ufunc, a, idx, axis, dtype, dims[0], kind, method)
    return DTensor.from_local(np.ascontiguousarray(res), mesh, out_pl, shape=out_shape,
                              stride=contiguous_strides(out_shape))


def _axis_dims(label: str, pl: tuple, axis: int) -> list:
    """The mesh dim that shards ``axis`` (a list of at most one), for the methods
    that combine per-rank pieces along it; NoRule for a layout they do not take."""
    dims = [m for m, p in enumerate(pl) if p.is_shard() and p.dim == axis]
    if any(p.is_partial() or (p.is_shard() and type(p) is not Shard) for p in pl) \
            or len(dims) > 1:
        raise _no_rule(label, "a Partial, a strided shard or an axis cut by several "
                              "mesh dims")
    return dims


def _scan(ufunc, label: str, a, axis: int, dtype):
    """``ufunc.accumulate`` along ``axis``: each rank scans its block, the blocks'
    totals (one slice each) are all-gathered over the mesh dim that shards
    ``axis``, and each rank combines the totals of the ranks before it into its
    block. Placements as ``a``'s."""
    spec = a._spec
    pl = tuple(spec.placements)
    dims = _axis_dims(label, pl, axis)
    kind = ufunc.accumulate(np.zeros((1,), spec.dtype), dtype=dtype).dtype
    mesh = spec.mesh
    if mesh.get_coordinate() is None:
        res = np.empty((0,), kind)
    else:
        local = a.to_local()
        res = ufunc.accumulate(local, axis=axis, dtype=dtype) if local.size else \
            np.zeros(local.shape, kind)
        if dims:
            m = dims[0]
            last = np.take(res, [-1], axis=axis) if local.shape[axis] else \
                np.zeros(local.shape[:axis] + (1,) + local.shape[axis + 1:], kind)
            have = np.array([local.shape[axis] > 0])
            every, flags = _gather_line(spec.mesh, m, last, have)
            prefix, seen = None, False
            for r in range(spec.mesh.get_coordinate()[m]):  # the ranks before this one
                if flags[r, 0]:
                    prefix = every[r] if not seen else ufunc(prefix, every[r]).astype(kind)
                    seen = True
            if seen and local.size:
                res = ufunc(prefix, res).astype(kind, copy=False)
    return DTensor.from_local(np.ascontiguousarray(res), mesh, pl, shape=spec.shape,
                              stride=contiguous_strides(spec.shape))


def _gather_line(mesh, m: int, *arrays):
    """Each of ``arrays`` (the same shape on every rank of the line) from every rank
    along mesh dim ``m``, stacked in rank order. One all-gather each."""
    line = mesh if mesh.ndim == 1 else mesh._slice([m])
    n = line.size()
    return tuple(DTensor.from_local(x[None], line, [Shard(0)], shape=(n,) + x.shape,
                                    stride=contiguous_strides((n,) + x.shape))
                 .redistribute(line, [Replicate()]).to_local() for x in arrays)


def _segments_across(ufunc, a, idx, axis: int, dtype, m: int, method: str) -> np.ndarray:
    """This rank's block of ``ufunc.reduceat`` (or of ``ufunc.reduce``, ``method``
    "reduce" and ``idx`` ``[0]``) along ``axis``, which mesh dim ``m`` shards: its
    pieces of the segments, each NumPy's ``method`` of it (reduce starts from the
    identity: gcd's reduce of ``[-4]`` is 4, its reduceat -4), all-gathered over
    ``m`` and combined."""
    spec, local = a._spec, a.to_local()
    n = spec.shape[axis]
    _, offsets = compute_local_shape_and_global_offset(spec.shape, spec.mesh, spec.placements)
    lo, hi = offsets[axis], offsets[axis] + local.shape[axis]
    rest = local.shape[:axis] + local.shape[axis + 1:]
    kind = ufunc.reduceat(np.zeros((1,), spec.dtype), [0], dtype=dtype).dtype
    pieces = np.zeros((len(idx),) + rest, kind)
    have = np.zeros(len(idx), bool)
    for i, (s, e) in enumerate(zip(idx.tolist(), idx[1:].tolist() + [n])):
        b, c = max(s, lo), min(e if e > s else s + 1, hi)  # e <= s: the segment is a[s]
        if b < c:
            part = np.take(local, np.arange(b - lo, c - lo), axis=axis)
            pieces[i] = (ufunc.reduce(part, axis=axis, dtype=dtype) if method == "reduce"
                         else np.take(ufunc.reduceat(part, [0], axis=axis, dtype=dtype), 0,
                                      axis=axis))
            have[i] = True
    every, flags = _gather_line(spec.mesh, m, pieces, have)
    acc, seen = pieces.copy(), np.zeros(len(idx), bool)
    for r in range(every.shape[0]):
        here = flags[r].reshape((-1,) + (1,) * len(rest))
        first = here & ~seen.reshape(here.shape)
        combined = ufunc(acc, every[r]).astype(kind, copy=False)
        acc = np.where(first, every[r], np.where(here, combined, acc))
        seen |= flags[r]
    return np.moveaxis(acc, 0, axis)


def _shifts_partial(ufunc, spec, b) -> bool:
    """Whether ``ufunc.at`` may update the parts of ``spec``'s Partials where they
    lie and give NumPy's value once reduced (True when there are none): adding
    or subtracting ``b`` shifts a max or min of the parts alike (rounding is
    monotone), and an integer sum when made on one rank only (wrapping
    arithmetic regroups exactly; a float sum would round otherwise). ``b``'s
    dtype must cast to the target's, so that no rank alone raises. Local."""
    ops = {p.reduce_op for p in spec.placements if p.is_partial()}
    if not ops:
        return True
    if ufunc not in (np.add, np.subtract) or b is None:
        return False
    if not np.can_cast(np.asarray(b).dtype, spec.dtype, "same_kind"):
        return False
    return ops <= {"max", "min"} or (ops <= {"sum", "max", "min"} and
                                     spec.dtype.kind in "iu" and len(ops) == 1)


def _at(ufunc, label: str, operands: tuple, kwargs: dict):
    """``ufunc.at(a, indices[, b])`` in place, with integer indices (an int, an
    integer array, or a tuple of them, one per leading dim) and ``b`` a scalar or a
    plain array, the same on every rank: each rank applies the updates that land
    in its own block, so nothing moves. Returns None, as NumPy's. NumPy's errors
    in NumPy's order, alike on every rank: no loop for the dtypes (before any
    index is read), then an index out of bounds."""
    if kwargs or len(operands) not in (2, 3) or type(operands[0]) is not DTensor:
        raise _no_rule(label, "keywords or a non-DTensor target")
    a, indices = operands[0], operands[1]
    b = operands[2] if len(operands) == 3 else None
    if (b is None) == (ufunc.nin == 1):
        _at_loop(ufunc, a.dtype, b)
    keys = indices if isinstance(indices, tuple) else (indices,)
    if type(indices) is DTensor and (b is None) == (ufunc.nin == 1):
        return _at_dtensor_index(ufunc, label, a, indices, b)
    if (isinstance(b, DTensor) or any(isinstance(k, DTensor) for k in keys)
            or (b is None) != (ufunc.nin == 1)):
        raise _no_rule(label, "a DTensor index or operand")
    keys = tuple(np.asarray(k) for k in keys)
    spec = a._spec
    if (len(keys) > a.ndim or any(k.dtype.kind not in "iu" for k in keys)
            or any(p.is_shard() and type(p) is not Shard for p in spec.placements)
            or not _shifts_partial(ufunc, spec, b)
            or _writes_grad(label, a)):
        raise _no_rule(label, "an index that is not integers, a Partial or strided "
                              "target, or one that requires grad")
    shape = spec.shape
    keys = np.broadcast_arrays(*keys)
    for d, k in enumerate(keys):
        if k.size and (k.min() < -shape[d] or k.max() >= shape[d]):
            bad = k.min() if k.min() < -shape[d] else k.max()
            raise IndexError(f"index {bad} is out of bounds for axis {d} with size "
                             f"{shape[d]}")
    keys = [np.where(k < 0, k + shape[d], k) for d, k in enumerate(keys)]
    coord = spec.mesh.get_coordinate()
    if coord is None or any(p.is_partial("sum") and coord[i] for i, p in
                            enumerate(spec.placements)):
        # A sum's update is made once: on the first rank of each Partial(sum) dim.
        return None
    sizes, offsets = compute_local_shape_and_global_offset(shape, spec.mesh,
                                                           spec.placements)
    mine = np.ones(keys[0].shape, bool)
    for d, k in enumerate(keys):
        mine &= (k >= offsets[d]) & (k < offsets[d] + sizes[d])
    local_keys = tuple(k[mine] - offsets[d] for d, k in enumerate(keys))
    rest = tuple(slice(o, o + s) for o, s in zip(offsets[len(keys):], sizes[len(keys):]))
    local = a.to_local()
    if b is None:
        ufunc.at(local, local_keys)
        return None
    whole = np.broadcast_to(b, keys[0].shape + shape[len(keys):])
    ufunc.at(local, local_keys, whole[mine][(slice(None),) + rest])
    return None


def _at_loop(ufunc, dtype, b) -> None:
    """NumPy's own error, if any, for ``ufunc.at`` into ``dtype`` with ``b``: its
    call with no index on one element (a scalar ``b`` as given, NumPy's weak
    scalar; an array's dtype), alike on every rank. NumPy resolves the loop
    before it reads an index (bool subtract's TypeError comes before an index's
    IndexError), and a rank whose block no index reaches would not raise it at
    all. Local."""
    nothing = np.zeros(0, np.intp)
    if b is None:
        ufunc.at(np.zeros(1, dtype), nothing)
        return
    if type(b) is DTensor or not D.is_scalar(b):
        b = np.zeros(0, b.dtype if type(b) is DTensor else np.asarray(b).dtype)
    with np.errstate(all="ignore"):
        ufunc.at(np.zeros(1, dtype), nothing, b)


def _writes_grad(label, a) -> bool:
    """RuntimeError, as for every write in place, when ``a`` requires grad in grad
    mode: the executor runs a recorded call's rule with grad mode off
    (``grad_priced`` on), and ``ufunc.at`` has no backward to record."""
    if a.requires_grad and (_modes.state.grad_enabled or _modes.state.grad_priced):
        raise RuntimeError(
            f"{label}: a DTensor that requires grad cannot be written in place while "
            "grad mode is on (the write would not be recorded and a gradient would be "
            "lost); write under mpitensor.no_grad(), or build a new DTensor")
    return False


def _at_dtensor_index(ufunc, label, a, idx, b):
    """``ufunc.at`` with one DTensor of row indices: each update goes to the rank
    that holds its row (_scatter.py)."""
    spec = a._spec
    if any(p.is_partial() or (p.is_shard() and type(p) is not Shard)
           for p in spec.placements) or _writes_grad(label, a):
        raise _no_rule(label, "a Partial or strided target, or one that requires grad, "
                              "with a DTensor index")
    return ufunc_at_rows(ufunc, label, a, idx, b)


def _outer(ufunc, label: str, operands: tuple, kwargs: dict):
    if ufunc.nin != 2 or ufunc.signature is not None or len(operands) != 2:
        raise _no_rule(label, "not an elementwise ufunc of two operands")
    a, b = operands
    if any(k not in ("dtype", "out") for k in kwargs):
        raise _no_rule(label, f"keywords {sorted(kwargs)}")
    if any(type(x) is not DTensor and np.ndim(x) for x in (a, b)):
        raise _no_rule(label, "a plain ndarray operand")
    if type(a) is DTensor and np.ndim(b):
        a = np.expand_dims(a, tuple(range(a.ndim, a.ndim + np.ndim(b))))
    return ufunc(a, b, **kwargs)
