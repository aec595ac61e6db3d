"""Selection and conversion on DTensors: ``np.where``, ``np.clip``,
``DTensor.astype``, ``DTensor.copy`` / ``np.copy``.

``where`` and ``clip`` are elementwise dim maps (DTensor operands right-aligned
with broadcasting, scalars passed to NumPy as they are) that reduce every Partial
first: neither is linear.

``copy`` keeps the placements, Partials included (a copy of each partial value
sums to a copy of the value). ``astype`` keeps them too when the cast is exact on
every value, i.e. float/complex to an equal or wider float/complex: then casting
the partial values and reducing equals reducing and casting, up to rounding of
the sum. Any other cast of a Partial (integer truncation, wrap-around, float to
int, narrowing) is not the cast of the reduced value, so the Partial is reduced
first; Shard and Replicate are always kept.
"""

from __future__ import annotations

import numpy as np

from .. import _C, _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec
from . import _dispatch as D


def _run_elementwise(name, key, operands, func):
    """func(*operands) with the DTensor operands replaced by their local arrays;
    every Partial reduced first."""
    operands = D.implicit(operands)
    split = D.split_operands(name, operands)
    if split is None:
        raise D.mixed_error(name, next(o for o in operands
                                       if type(o) is not DTensor and not D.is_scalar(o)))
    inputs, pattern = split
    if not inputs:
        raise TypeError(f"{name}: expected a DTensor operand")
    mesh = D.same_mesh(name, inputs)
    tensors = sum(1 << i for i, is_dt in enumerate(pattern) if is_dt)
    dec = D.decide(key, operands, lambda: _C.dimmap_elementwise(
        _C.ELEMENTWISE_NONE, len(pattern), tensors, [x.shape for x in inputs]))
    local = iter(D.local_inputs(mesh, inputs, dec))
    args = [next(local) if is_dt else obj for is_dt, obj in zip(pattern, operands)]
    return D.wrap(mesh, dec, func(*args))


@_registry.implements(np.where)
def where(condition, x=None, y=None):
    if x is None or y is None:
        raise TypeError("numpy.where on DTensors needs x and y (the one-argument form, "
                        "nonzero indices, has no sharding rule)")
    return _run_elementwise("numpy.where", "where", (condition, x, y), np.where)


@_registry.implements(np.clip)
def clip(a, a_min=np._NoValue, a_max=np._NoValue, out=None, *, min=np._NoValue,
         max=np._NoValue, **kwargs):
    if out is not None or kwargs:
        raise TypeError("numpy.clip: out= and other keyword arguments are not "
                        "supported on DTensors")
    lo = a_min if a_min is not np._NoValue else (None if min is np._NoValue else min)
    hi = a_max if a_max is not np._NoValue else (None if max is np._NoValue else max)
    for b in (lo, hi):
        if b is not None and not D.is_scalar(b):
            raise TypeError("numpy.clip on DTensors takes scalar bounds (or None); for "
                            "DTensor bounds use numpy.minimum/numpy.maximum")
    return _run_elementwise("numpy.clip", ("clip", lo is None, hi is None), (a,),
                            lambda x: np.clip(x, lo, hi))


def _same_layout(a, local, dtype):
    s = a._spec
    return DTensor(local, DTensorSpec(s.mesh, s.placements, s.shape, np.dtype(dtype),
                                      s.stride))


@_registry.implements(np.copy)
def copy(a, order="K", subok=False):
    """A DTensor with its own copy of the local data, placements kept. Local."""
    if type(a) is not DTensor:
        raise TypeError(f"numpy.copy: expected a DTensor, got {type(a).__name__}")
    return _same_layout(a, a.to_local().copy(), a.dtype)


def exact_cast(src, dst) -> bool:
    """True when casting keeps Partials: float/complex to equal or wider."""
    src, dst = np.dtype(src), np.dtype(dst)
    return src.kind in "fc" and dst.kind in "fc" and np.can_cast(src, dst, "safe")


@_registry.implements(np.ndarray.astype)
def astype(a, dtype, copy=True):
    """DTensor.astype: placements kept, except that a Partial is reduced first unless
    the cast is exact (see the module notes). Local for exact casts and for inputs
    without Partials."""
    dtype = np.dtype(dtype)
    if dtype == a.dtype and not copy:
        return a
    if exact_cast(a.dtype, dtype) or not any(p.is_partial() for p in a.placements):
        return _same_layout(a, a.to_local().astype(dtype), dtype)
    return _run_elementwise("DTensor.astype", ("astype", dtype), (a,),
                            lambda x: x.astype(dtype))
