"""Selection, conversion and comparison on DTensors: ``np.where``, ``np.clip``,
``DTensor.astype``, ``DTensor.copy`` / ``np.copy``, ``np.round``, ``np.isclose``,
``np.allclose``, ``np.array_equal`` and ``np.array_equiv`` (compared locally, then
one all-reduce of a flag), and ``np.take_along_axis``.

``where`` and ``clip`` are elementwise dim maps (DTensor operands right-aligned
with broadcasting, scalars passed to NumPy as they are) that reduce every Partial
first: neither is linear.

``copy`` keeps the placements, Partials included (a copy of each partial value
sums to a copy of the value). ``astype`` keeps them too when casting the partial
values and reducing equals reducing and casting (the executor's rule,
``_dispatch.keeps_partial``): float/complex to an equal or wider float/complex, up
to rounding of the sum; an integer sum to an integer no wider, whose wrapping
commutes with the sum; a max or min to a dtype that keeps their order. Any other
cast of a Partial (integer truncation, a wider integer where the global value
wraps first, float to int, narrowing) is not the cast of the reduced value, so the
Partial is reduced first; Shard and Replicate are always kept.
"""

from __future__ import annotations

import numpy as np

from .. import _C, _dtypes, _registry
from .._clib import CORE
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec
from ..placement_types import Partial
from .._algorithms import _dispatch as D
from . import _deferring, _nonzero
from ._inplace import write_result
from ._strided import is_strided, on_expansion


def _run_elementwise(name, key, operands, func):
    """func(*operands) with the DTensor operands replaced by their local arrays;
    every Partial reduced first. The executor checks the meshes; operands other
    than DTensors and Python numbers are classified here first, for their errors
    (and NoRule for values a DTensor cannot hold)."""
    for o in operands:
        if type(o) is not DTensor and type(o) not in _NUMBERS:
            operands = D.implicit(operands)
            split = D.split_operands(name, operands)
            if split is None:
                raise D.mixed_error(name, next(o for o in operands
                                               if type(o) is not DTensor and not D.is_scalar(o)))
            if not split[0]:
                raise TypeError(f"{name}: expected a DTensor operand")
            break

    def build():
        # On a miss of the mesh's memo only: which operands are tensors, and their shapes.
        inputs = [o for o in operands if type(o) is DTensor]
        tensors = sum(1 << i for i, o in enumerate(operands) if type(o) is DTensor)
        return D.dimmap_elementwise(CORE.ELEMENTWISE_NONE, len(operands), tensors,
                                    [x.shape for x in inputs])
    return D.execute(key, operands, build, func)


# The operands every call passes over by their type alone.
_NUMBERS = frozenset((float, int, bool, complex))


@_registry.implements(np.where)
def where(condition, x=None, y=None):
    if x is None and y is None:
        return _nonzero.nonzero(condition)
    if x is None or y is None:
        raise _registry.NoRule("numpy.where on DTensors needs x and y, or neither")
    deferred = _deferring.where(condition, x, y)
    if deferred is not None:
        return deferred
    return _run_elementwise("numpy.where", "where", (condition, x, y), np.where)




def clip_bounds(a_min, a_max, min, max) -> tuple:
    """(lower, upper) bound of a call of np.clip, None for none, by NumPy's rules:
    ``a_min`` and ``a_max`` together, or ``min``/``max`` alone (the backward reads
    them back the same way)."""
    if a_min is np._NoValue and a_max is np._NoValue:
        return (None if min is np._NoValue else min, None if max is np._NoValue else max)
    if a_min is np._NoValue or a_max is np._NoValue:
        missing = "a_min" if a_min is np._NoValue else "a_max"
        raise TypeError(f"clip() missing 1 required positional argument: '{missing}'")
    if min is not np._NoValue or max is not np._NoValue:
        raise ValueError("Passing `min` or `max` keyword argument when `a_min` and "
                         "`a_max` are provided is forbidden.")
    return a_min, a_max


@_registry.implements(np.clip)
def clip(a, a_min=np._NoValue, a_max=np._NoValue, out=None, *, min=np._NoValue,
         max=np._NoValue, **kwargs):
    """np.clip of DTensors: ``a`` and each bound (None for none) may be a DTensor or
    a scalar, broadcast together as NumPy does; a plain ndarray operand follows the
    executor's rule (replicated when it has one element or under
    ``implicit_replication()``, else a TypeError). Elementwise, Partials reduced
    first; local when the layouts agree.

    Example: ``np.clip(dt, lo, hi)`` of Shard(0) DTensors is Shard(0) and equals
    ``np.clip`` of their full arrays.
    """
    if kwargs:
        raise _registry.NoRule(f"numpy.clip: {', '.join(sorted(kwargs))}= has no "
                               f"distributed rule")
    if out is not None:
        if type(out) is not DTensor:  # NumPy's answer in the caller's ndarray, gathered
            return _registry.gather_call(np.clip, (a, a_min, a_max),
                                         {"out": out, "min": min, "max": max}, "numpy.clip")
        write_result("numpy.clip", out, clip(a, a_min, a_max, min=min, max=max))
        return out
    if min is np._NoValue and max is np._NoValue and a_min is not np._NoValue \
            and a_max is not np._NoValue:
        lo, hi = a_min, a_max  # np.clip(a, lo, hi), the common call
    else:
        lo, hi = clip_bounds(a_min, a_max, min, max)
    given = (lo is not None, hi is not None)
    operands = (a, lo, hi) if lo is not None and hi is not None else (
        (a,) + tuple(b for b in (lo, hi) if b is not None))
    return _run_elementwise("numpy.clip", ("clip", given), operands, _CLIP_LOCAL[given])


# np.clip of the local arrays by which bounds are given: an absent bound is no
# operand, NumPy gets None for it.
_CLIP_LOCAL = {(True, True): np.clip,
               (True, False): lambda x, lo: np.clip(x, lo, None),
               (False, True): lambda x, hi: np.clip(x, None, hi),
               (False, False): lambda x: np.clip(x, None, None)}

# Their common calls, np.where(m, x, y) and np.clip(x, lo, hi) of DTensors and
# scalars, the executor's C door runs as the entries above do (the same dim map,
# Partials reduced first), without entering them.
for _func in (np.where, np.clip):
    _C.register_elementwise(_func, 3, _registry.call_label(_func))
# and DTensor.astype of a bool or number dtype where nothing moves (no Partial).
_C.register_cast(np.ndarray.astype, _registry.call_label(np.ndarray.astype))


def _same_layout(a, local, dtype):
    s = a._spec
    return DTensor(local, DTensorSpec(s.mesh, s.placements, s.shape, np.dtype(dtype),
                                      s.stride))


@_registry.implements(np.copy, takes_strided=True)
def copy(a, order="K", subok=False):
    """A DTensor with its own copy of the local data, placements kept (strided
    shards too). ``order`` is checked as NumPy checks it; every order gives the one
    layout DTensors have (C order on each rank). Local."""
    if type(a) is not DTensor:
        raise TypeError(f"numpy.copy: expected a DTensor, got {type(a).__name__}")
    if order is not None:
        if not isinstance(order, str):
            raise TypeError(f"order must be str, not {type(order).__name__}")
        if order.upper() not in _ORDERS:
            raise ValueError(f"order must be one of 'C', 'F', 'A', or 'K' (got {order!r})")
    return _same_layout(a, a.to_local().copy(), a.dtype)


_ORDERS = ("C", "F", "A", "K")


@_registry.implements(np.ndarray.astype, takes_strided=True)
def astype(a, dtype, copy=True):
    """DTensor.astype: placements kept (strided shards too), except that a Partial
    is reduced first unless the cast is exact (see the module notes). Local for
    exact casts and for inputs without Partials."""
    if not isinstance(dtype, np.dtype):
        dtype = _dtypes.as_dtype(dtype)
    s = a._spec
    if not copy and dtype == s.dtype:
        # a new DTensor on the same local array, not ``a`` itself: the tape records
        # this call's output, and recording it as ``a`` cut ``a`` off its gradient
        return _same_layout(a, a.to_local(), dtype)
    for p in s.placements:
        if type(p) is Partial and not D.keeps_partial(p.reduce_op, s.dtype, dtype):
            break
    else:
        return _same_layout(a, a.to_local().astype(dtype), dtype)
    if is_strided(a):
        return on_expansion(a, lambda e: astype(e, dtype, copy), reduce=True)
    return _run_elementwise("DTensor.astype", ("astype", dtype), (a,),
                            lambda x: x.astype(dtype))


@_registry.implements(np.round, np.around, takes_strided=True)
def round_(a, decimals=0, out=None):
    """np.round / np.around, elementwise, placements kept (strided shards too); a
    Partial is reduced first (rounding the parts is not rounding the sum). Local
    otherwise.

    Example: ``np.round(dt, 2)`` of a Shard(0) DTensor stays Shard(0).
    """
    if out is not None:
        raise _registry.NoRule("numpy.round: out= is not supported on DTensors")
    decimals = int(decimals)
    if is_strided(a):
        return on_expansion(a, lambda e: round_(e, decimals), reduce=True)
    return _run_elementwise("numpy.round", ("round", decimals), (a,),
                            lambda x: np.round(x, decimals))


@_registry.implements(np.isclose)
def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """np.isclose of DTensors (and scalars): an elementwise bool DTensor, placed as
    the decision for two operands places it. Local when the layouts agree.

    Example: ``np.isclose(dt, dt + 1e-12).all()`` is true.
    """
    rtol, atol, equal_nan = float(rtol), float(atol), bool(equal_nan)
    return _run_elementwise(
        "numpy.isclose", ("isclose", rtol, atol, equal_nan), (a, b),
        lambda x, y: np.isclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan))


def _everywhere(mesh, flag: bool) -> bool:
    """True on every rank of ``mesh`` when ``flag`` is true on every rank: one
    all-reduce (min) of an int32 per mesh dim, counted as any other. Collective."""
    local = np.array(1 if flag else 0, np.int32)
    parts = DTensor.from_local(local, mesh, [Partial("min")] * mesh.ndim)
    result = parts.full_tensor()
    if mesh.get_coordinate() is None:
        raise RuntimeError("a comparison of DTensors on a rank outside their mesh: this "
                           "rank holds no data")
    return bool(result)


@_registry.implements(np.allclose)
def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """np.allclose of DTensors: compared locally, then one all-reduce of a flag;
    the same bool on every rank. Collective on the mesh.

    Example: ``np.allclose(dt, dt * (1 + 1e-9))`` is True on every rank.
    """
    close = isclose(a, b, rtol, atol, equal_nan)
    return _everywhere(close.device_mesh, bool(close.to_local().all()))


@_registry.implements(np.array_equal)
def array_equal(a1, a2, equal_nan=False):
    """np.array_equal of DTensors: False at once (no communication) when the
    global shapes differ, else compared locally and one all-reduce of a flag.
    Collective on the mesh.

    Example: ``np.array_equal(dt, dt.copy())`` is True on every rank.
    """
    shape1, shape2 = (np.shape(x) if type(x) is not DTensor else x.shape
                      for x in (a1, a2))
    if shape1 != shape2:
        return False
    equal_nan = bool(equal_nan)

    def compare(x, y):
        if equal_nan and np.result_type(x, y).kind in "fc":
            return np.asarray((x == y) | (np.isnan(x) & np.isnan(y)))
        return np.asarray(x == y)
    same = _run_elementwise("numpy.array_equal", ("array_equal", equal_nan), (a1, a2),
                            compare)
    return _everywhere(same.device_mesh, bool(same.to_local().all()))


@_registry.implements(np.array_equiv)
def array_equiv(a1, a2):
    """np.array_equiv of DTensors: False at once (no communication) when their
    global shapes do not broadcast together, else compared elementwise with
    broadcasting and one all-reduce of a flag. Collective on the mesh.

    Example: ``np.array_equiv(dt, dt[:1])`` is True when every row of ``dt`` is
    its first.
    """
    shapes = [np.shape(x) if type(x) is not DTensor else x.shape for x in (a1, a2)]
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        return False
    same = _run_elementwise("numpy.array_equiv", "array_equiv", (a1, a2),
                            lambda x, y: np.asarray(x == y))
    return _everywhere(same.device_mesh, bool(same.to_local().all()))


def _part(name, a, func):
    """``func`` (np.real or np.imag) of a DTensor, as NumPy's ``a.real`` and
    ``a.imag``: of a complex DTensor, a view of its local array in the same layout
    (strided placements too: an element's parts are that element's), so a write
    into either reaches the other, and a Partial(sum|avg) stays (the parts are
    linear; complex values have no Partial(max|min)). Of a real one, real is the
    DTensor itself and imag read-only zeros of its layout, as NumPy's. Local:
    nothing moves, so reading the attributes in any order on each rank is safe."""
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")
    if a.dtype.kind != "c":
        if func is np.real:
            return a
        zeros = np.zeros_like(a._data())
        zeros.setflags(write=False)
        return _same_layout(a, zeros, a.dtype)
    part = func(a._data())
    return _same_layout(a, part, part.dtype)


@_registry.implements(np.real, takes_strided=True)
def real(val):
    return _part("numpy.real", val, np.real)


@_registry.implements(np.imag, takes_strided=True)
def imag(val):
    return _part("numpy.imag", val, np.imag)


@_registry.implements(np.take_along_axis)
def take_along_axis(arr, indices, axis=-1):
    """numpy.take_along_axis of DTensors of equal ndim whose other dims have equal
    lengths (torch.gather's case): the array is made whole along ``axis`` (its
    Shard there moves or is gathered), the indices keep every Shard, their one
    along ``axis`` included, and the output takes the indices' placements there;
    the other dims are sharded alike. A Partial(sum|avg) array stays Partial
    (picking is linear) when the indices are Replicate on that mesh dim.
    Collective on the mesh when an input must move.

    Example (``mpiexec -n 2``)::

        >>> a = distribute_tensor(np.arange(8.0).reshape(2, 4), mesh, [Replicate()])
        >>> i = distribute_tensor(np.array([[3, 0], [1, 1]]), mesh, [Shard(1)])
        >>> np.take_along_axis(a, i, axis=1).placements
        (Shard(dim=1),)
    """
    name = "numpy.take_along_axis"
    arr, indices = D.implicit((arr, indices))
    if type(arr) is not DTensor or type(indices) is not DTensor:
        bad = indices if type(arr) is DTensor else arr
        if isinstance(bad, np.ndarray):
            raise D.mixed_error(name, bad)
        raise TypeError(f"{name}: expected DTensors, got {type(bad).__name__}")
    if axis is None:
        raise _registry.NoRule(f"{name}: axis=None (flattening) is not supported on DTensors")
    if indices.dtype.kind not in "iu":
        raise IndexError(f"{name}: indices must be integers, got {indices.dtype}")
    n = arr.ndim
    if indices.ndim != n:
        raise ValueError(f"{name}: indices and arr must have the same number of "
                         f"dimensions, got {indices.ndim} and {n}")
    ax = np.lib.array_utils.normalize_axis_index(axis, n)
    if any(arr.shape[d] != indices.shape[d] for d in range(n) if d != ax):
        raise TypeError(f"{name}: on DTensors the dims other than axis must have equal "
                        f"lengths (no broadcasting), got {arr.shape} and {indices.shape}")
    D.same_mesh(name, (arr, indices))

    def build():
        # Label ax is the indices' (and output's) axis; label n is the array's.
        kinds = [D.KEEP] * n + [D.REPLICATE]
        arr_labels = [n if d == ax else d for d in range(n)]
        return D.dimmap([arr_labels, range(n)], range(n), kinds,
                        partial_rule=D.P_LINEAR_ONE, partial_inputs=1)

    return D.execute(("take_along_axis", ax), (arr, indices), build,
                     lambda a, i: np.take_along_axis(a, i, axis=ax))

