"""Reductions on DTensors, as NumPy functions and as DTensor methods.

Each reduction registers its signature with the C dispatch at import: reduced dims
sharded give a Partial of its reduce op (``sum``/``nansum`` -> Partial(sum),
``mean`` -> Partial(avg) for even shards only, ``prod`` -> Partial(product),
``max``/``min`` -> Partial(max/min), ``all``/``any`` -> a bool Partial(min/max)
whatever the input's dtype), or, for the reductions whose partial results do not
combine by a reduce op of the dtype (max/min of bool or complex values, which the
core decides from the dtype), are gathered first; ``std``, ``var``, ``argmax`` and
``argmin`` merge per-rank results instead (_merge.py): the method's door leaves
them to Python when a reduced axis is sharded or a Partial must be reduced, so they
come here. Partial inputs: sum and mean are linear (a Partial(sum|avg) passes
through), max/min keep Partial(max/min), the others reduce it first.

DTensor's methods (``dt.sum(axis=0)``) are the C base's doors into the executor;
what they leave to Python (other keywords, ``out=``, the merged reductions) comes
here (``IMPLS``), as do the NumPy functions (``np.sum(dt)``), and runs through
the executor again.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .. import _C, _registry
from .._dtensor import DTensor
from .._algorithms import _dispatch as D
from .._algorithms import _lanes, _merge
from . import _deferring
from ._inplace import write_result

# name -> (NumPy function, DTensor method or None, reduce op (-1: merged), partial
#          rule, partial ops, even_only, logical: a bool result whatever the input)
_RULES = {
    "sum": (np.sum, "sum", D.R_SUM, D.P_LINEAR_ALL, 0, False, False),
    "nansum": (np.nansum, None, D.R_SUM, D.P_NONE, 0, False, False),
    "mean": (np.mean, "mean", D.R_AVG, D.P_LINEAR_ALL, 0, True, False),
    "prod": (np.prod, "prod", D.R_PRODUCT, D.P_NONE, 0, False, False),
    "max": (np.max, "max", D.R_MAX, D.P_SAME_OP, 1 << D.R_MAX, False, False),
    "amax": (np.amax, None, D.R_MAX, D.P_SAME_OP, 1 << D.R_MAX, False, False),
    "min": (np.min, "min", D.R_MIN, D.P_SAME_OP, 1 << D.R_MIN, False, False),
    "amin": (np.amin, None, D.R_MIN, D.P_SAME_OP, 1 << D.R_MIN, False, False),
    # torch keeps a bool Partial for them: reading one all-reduces a byte an element
    "all": (np.all, "all", D.R_MIN, D.P_NONE, 0, False, True),
    "any": (np.any, "any", D.R_MAX, D.P_NONE, 0, False, True),
    "argmax": (np.argmax, "argmax", -1, D.P_NONE, 0, False, False),
    "argmin": (np.argmin, "argmin", -1, D.P_NONE, 0, False, False),
    "std": (np.std, "std", -1, D.P_NONE, 0, False, False),
    "var": (np.var, "var", -1, D.P_NONE, 0, False, False),
}


def _reduce(name, a, axis, keepdims, out, extra):
    fname = f"numpy.{name}"
    if type(a) is not DTensor:
        raise TypeError(f"{fname}: expected a DTensor, got {type(a).__name__}")
    if out is not None:
        if type(out) is not DTensor:  # NumPy's answer in the caller's ndarray, gathered
            return _registry.gather_call(_RULES[name][0], (a,), dict(
                axis=axis, keepdims=keepdims, out=out, **extra), fname)
        write_result(fname, out, _reduce(name, a, axis, keepdims, None, extra))
        return out
    for k in extra:
        if k not in ("dtype", "ddof"):
            raise _registry.NoRule(f"{fname}: the keyword argument {k}= is not supported "
                                   f"on DTensors")
    ndim = a.ndim
    func = _RULES[name][0]
    if name in ("argmax", "argmin"):
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{fname}: axis must be an int or None, got {axis!r}")
    axes = None if axis is None else normalize_axis_tuple(axis, ndim)
    keepdims = bool(keepdims)
    if name in _EXTREMES and not extra and _extreme_over_empty_shards(a, axes):
        return _merge.extreme(fname, a, tuple(range(ndim)) if axes is None else axes,
                              keepdims, _EXTREMES[name])
    if name in _EXTREMES and not extra:
        fused = _deferring.extreme(func, _LOCAL[name][0], a, axes, keepdims, _EXTREMES[name])
        if fused is not None:
            return fused
    if name in ("argmax", "argmin"):
        return D.execute(func, (a,), axis=None if axes is None else axes[0],
                         keepdims=keepdims)
    return D.execute(func, (a,), kwargs=extra or None, axis=axes, keepdims=keepdims)


# max and min: whether each is the largest; their Partial has no identity in NumPy.
_EXTREMES = {"max": True, "amax": True, "min": False, "amin": False}


def _extreme_over_empty_shards(a, axes) -> bool:
    """Whether max/min must take _merge.extreme's path: a Shard/Replicate input of
    ints or floats (the others have no MPI max here and are gathered) whose reduced
    axis leaves a shard empty, where a rank would have nothing to give its Partial.
    The same on every rank."""
    spec = a._spec
    if spec.dtype.kind not in "iuf" or any(p.is_partial() for p in spec.placements):
        return False
    ndim = len(spec.shape)
    return bool(_merge.empty_shards(spec, tuple(range(ndim)) if axes is None else axes))


def _with_dtype(name):
    def impl(a, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        if dtype is not None:
            kwargs["dtype"] = dtype
        return _reduce(name, a, axis, keepdims, out, kwargs)
    impl.__name__ = name
    return impl


def _no_dtype(name):
    def impl(a, axis=None, out=None, keepdims=False, **kwargs):
        return _reduce(name, a, axis, keepdims, out, kwargs)
    impl.__name__ = name
    return impl


def _check(fname, a, out, extra):
    if type(a) is not DTensor:
        raise TypeError(f"{fname}: expected a DTensor, got {type(a).__name__}")
    if out is not None:
        raise _registry.NoRule(f"{fname}: out= is not supported on DTensors")
    for k in extra:
        raise _registry.NoRule(f"{fname}: the keyword argument {k}= is not supported on "
                               f"DTensors")


def _arg(name):
    def impl(a, axis=None, out=None, *, keepdims=False):
        fname = f"numpy.{name}"
        _check(fname, a, out, ())
        return _merge.arg_extreme(fname, a, axis, bool(keepdims), name == "argmax")
    impl.__name__ = name
    return impl


def _moment(name):
    def impl(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *,
             correction=np._NoValue, **kwargs):
        fname = f"numpy.{name}"
        if correction is not np._NoValue:
            # the array API's name for ddof (NumPy 2 takes either, not both)
            if ddof != 0:
                raise ValueError("ddof and correction can't be provided simultaneously.")
            ddof = correction
        _check(fname, a, out, kwargs)
        return _merge.moment(fname, a, axis, dtype, ddof, bool(keepdims), name == "std")
    impl.__name__ = name
    return impl


IMPLS = {}
for _name in ("sum", "nansum", "mean", "prod"):
    IMPLS[_name] = _with_dtype(_name)


for _name in ("max", "amax", "min", "amin", "all", "any"):
    IMPLS[_name] = _no_dtype(_name)
for _name in ("argmax", "argmin"):
    IMPLS[_name] = _arg(_name)
for _name in ("std", "var"):
    IMPLS[_name] = _moment(_name)
def _keepdim(impl):
    """Accepts torch's ``keepdim=`` where NumPy's ``keepdims=`` is accepted."""
    def entry(*args, keepdim=None, **kwargs):
        if keepdim is not None:
            if "keepdims" in kwargs:
                raise TypeError(f"numpy.{impl.__name__}: give keepdims= or keepdim=, "
                                f"not both")
            kwargs["keepdims"] = keepdim
        return impl(*args, **kwargs)
    entry.__name__ = impl.__name__
    entry.__wrapped__ = impl
    return entry


def _short_last_axis(a, axis, dtype=None) -> bool:
    """Whether a reduction of ``a`` along ``axis`` folds its columns instead: a
    float32/float64 block of many rows whose reduced axis is its last and short.
    NumPy's reduce there loops over each row's few elements (the reduced axis is
    the inner one), several times slower than one binary ufunc per column."""
    if (type(a) is not np.ndarray or a.ndim < 2 or a.dtype.char not in "fd"
            or (dtype is not None and np.dtype(dtype) != a.dtype)):
        return False
    if type(axis) is tuple:
        if len(axis) != 1:
            return False
        axis = axis[0]
    return (type(axis) is int and axis in (-1, a.ndim - 1)
            and 2 <= a.shape[-1] < _FOLD_MAX_COLUMNS and a.size >= _FOLD_MIN_SIZE)


def _fold(ufunc, a, keepdims, start=None):
    """``ufunc.reduce(a, axis=-1)`` as NumPy computes it for a last axis shorter
    than its pairwise sum's block: each row's elements one after the other, from
    ``start`` (the sum's 0.0, which makes a row of -0.0 sum to 0.0) or the first
    element; a column at a time."""
    out = (ufunc(a[..., 0], start, dtype=a.dtype) if start is not None
           else ufunc(a[..., 0], a[..., 1]))
    for j in range(1 if start is not None else 2, a.shape[-1]):
        ufunc(out, a[..., j], out=out)
    return out[..., None] if keepdims else out


def _local_sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=np._NoValue,
               where=True):
    """ndarray.sum on a local array, NumPy's bits: along a short last axis of a tall
    block (scikit-learn's logsumexp and softmax over classes), the columns folded
    (_fold), else NumPy's own reduce."""
    if (out is None and initial is np._NoValue and where is True
            and _short_last_axis(a, axis, dtype)):
        return _fold(np.add, a, keepdims, start=0.0)
    return np.ndarray.sum(a, axis=axis, dtype=dtype, out=out, keepdims=keepdims,
                          initial=initial, where=where)


def _local_extreme(exact):
    """ndarray.min/max on a local array, NumPy's value. Down the rows of a tall
    block of few columns (each column's extreme, as a scaler fits), NumPy's reduce
    walks it one short row at a time, many times slower than the lanes kernel's one
    pass (_lanes.extreme): the extreme of a column is one value whatever the order,
    so the bits are NumPy's wherever it is neither NaN (whose payload follows the
    order) nor zero (the two zeros compare equal); there NumPy's own reduce runs.
    Along a short last axis of a tall block, the columns folded (_fold), on the
    same terms: NumPy's reduce of a short row takes its elements in an order that
    depends on the CPU's vector width. Anything else takes NumPy's own reduce."""
    binary = np.maximum if exact is np.ndarray.max else np.minimum
    largest = exact is np.ndarray.max

    def local(a, axis=None, out=None, keepdims=False, initial=np._NoValue, where=True):
        if out is None and initial is np._NoValue and where is True:
            if _short_last_axis(a, axis):
                r = _fold(binary, a, keepdims)
                if a.dtype.kind != "f" or (np.count_nonzero(r) == r.size
                                           and not np.isnan(r).any()):
                    return r
            if (type(a) is np.ndarray and a.dtype.kind in "fiu" and a.ndim == 2
                    and axis in (0, (0,), -2, (-2,)) and 2 <= a.shape[1] < _LANES_COLUMNS
                    and a.shape[0] >= max(_LANES_MIN_ROWS, 1) and a.flags.c_contiguous
                    and _lanes.kernel_dtype(a.dtype)):
                r = _lanes.extreme(a, 0, largest)
                if a.dtype.kind != "f" or (np.count_nonzero(r) == r.size
                                           and not np.isnan(r).any()):
                    return r[None] if keepdims else r
        return exact(a, axis=axis, out=out, keepdims=keepdims, initial=initial, where=where)
    return local


# NumPy's row walk costs about the same per row whatever the columns: below this
# many rows it is quick enough, from that many columns as fast as the kernel.
_LANES_MIN_ROWS = 1024
_LANES_COLUMNS = 128
# NumPy's pairwise sum adds a row of fewer elements than its block (8) one after
# the other, which the fold repeats; below the size the fold's calls cost more.
_FOLD_MAX_COLUMNS = 8
_FOLD_MIN_SIZE = 1 << 13
# Below this many elements a mask's reduce is as quick as the two flat passes.
_UNIFORM_MIN_SIZE = 1 << 16


def _local_logical(exact):
    """ndarray.all/any on a local array, NumPy's value. A large boolean one that
    holds one value only (the NaN mask of data without NaNs, as scikit-learn's
    nan-aware extremes make it) gives that value everywhere: one flat pass or two
    over its bytes says so, where NumPy's reduce along an outer axis walks it row
    by row, several times slower."""
    def local(a, axis=None, out=None, keepdims=False, *, where=True):
        axes = () if axis is None else normalize_axis_tuple(axis, a.ndim)
        if (out is None and where is True and type(a) is np.ndarray and a.dtype == np.bool_
                and a.size >= max(_UNIFORM_MIN_SIZE, 1) and 0 < len(axes) < a.ndim):
            value = False if not a.any() else True if a.all() else None
            if value is not None:
                shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape)
                              if keepdims or i not in axes)
                return np.full(shape, value)
        return exact(a, axis=axis, out=out, keepdims=keepdims, where=where)
    return local


# name -> (the local function, ndarray's method for the blocks it leaves alone).
_LOCAL = {"sum": (_local_sum, np.ndarray.sum),
          "max": (_local_extreme(np.ndarray.max), np.ndarray.max),
          "amax": (_local_extreme(np.ndarray.max), np.ndarray.max),
          "min": (_local_extreme(np.ndarray.min), np.ndarray.min),
          "amin": (_local_extreme(np.ndarray.min), np.ndarray.min),
          "all": (_local_logical(np.ndarray.all), np.ndarray.all),
          "any": (_local_logical(np.ndarray.any), np.ndarray.any)}


def register_locals() -> None:
    """Hands the C executor each local function of _LOCAL, with the smallest block
    it takes a path of its own on (the fold's, or the lanes' of two columns):
    smaller ones go to ndarray's method directly, without the function's call
    around it. Again after a change of the sizes above (the tests lower them to
    reach those paths on small blocks). Local.

    Example: ``register_locals()``.
    """
    extreme = min(_FOLD_MIN_SIZE, 2 * max(_LANES_MIN_ROWS, 1))
    smallest = {"sum": _FOLD_MIN_SIZE, "all": _UNIFORM_MIN_SIZE, "any": _UNIFORM_MIN_SIZE}
    for name, (local, method) in _LOCAL.items():
        _C.set_reduction_local(_RULES[name][0], local, method, smallest.get(name, extreme))


for _name, (_func, _method, _op, _rule, _ops, _even, _logical) in _RULES.items():
    _registry.implements(_func)(_keepdim(IMPLS[_name]))
    _C.register_reduction(_func, _method, _op, _rule, _ops, _even, _logical,
                          _registry.call_label(_func))
register_locals()
_registry.implements(np.linalg.norm)(_merge.norm)
