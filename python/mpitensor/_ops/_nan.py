"""The NaN-ignoring reductions, ``np.ptp`` and ``np.average`` of DTensors, written
as DTensor operations so that the engine places them: ``nanmean``, ``nanvar``,
``nanstd``, ``nanmax``, ``nanmin``, ``nanargmax``, ``nanargmin``, ``nanprod`` and the
scans ``nancumsum`` and ``nancumprod`` (``nansum`` is in _reductions.py).

Each is NumPy's own recipe on the whole array: NaNs replaced by what leaves a
reduction unchanged (zero for sums, the infinity on the other side for extremes)
and a count of the values that are not NaN. So a sharded reduced axis costs what
the reductions underneath cost: Partials and merged records the size of the
result, never the array. Integer arrays have no NaNs and take the plain
reduction, as in NumPy.

Forms with no rule here (``out=``, ``where=``, ``initial=``, weights that are
neither a DTensor of the data's shape nor a 1-D array along one axis) go to the
fallback.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from ..placement_types import Replicate
from .._algorithms import _dispatch as D

__all__ = ["nanmean", "nanvar", "nanstd", "nanmax", "nanmin", "nanargmax", "nanargmin",
           "ptp", "average", "nanprod", "nancumsum", "nancumprod"]


def _check(name, a, out=None, **unsupported):
    if type(a) is not DTensor:
        raise _registry.NoRule(f"{name}: expected a DTensor")
    if out is not None:
        raise _registry.NoRule(f"{name}: out= has no distributed rule")
    for key, value in unsupported.items():
        if value is not np._NoValue:
            raise _registry.NoRule(f"{name}: {key}= has no distributed rule")


def _keep(keepdims):
    return False if keepdims is np._NoValue else bool(keepdims)


def _inexact(a):
    return a.dtype.kind in "fc"


def _reduced(name, x):
    """``x`` with its Partials reduced: a quotient of the whole sum rounds as NumPy's
    does, where a Partial kept through the division would sum rounded quotients."""
    return D.relayout(name, x, [Replicate() if p.is_partial() else p
                                for p in x._spec.placements])


def _count(mask, axis, keepdims):
    return np.sum(np.logical_not(mask), axis=axis, dtype=np.intp, keepdims=keepdims)


@_registry.implements(np.nanmean)
def nanmean(a, axis=None, dtype=None, out=None, keepdims=np._NoValue, *, where=np._NoValue):
    """``np.nanmean`` of a DTensor: the sum of its values that are not NaN over their
    count. Collective on the mesh when a reduced axis is sharded (the two sums,
    each the size of the result).

    Example: ``np.nanmean(dt, axis=0)``.
    """
    _check("numpy.nanmean", a, out, where=where)
    keepdims = _keep(keepdims)
    if not _inexact(a):
        return np.mean(a, axis=axis, dtype=dtype, keepdims=keepdims)
    mask = np.isnan(a)
    total = _reduced("numpy.nanmean", np.sum(np.where(mask, 0, a), axis=axis, dtype=dtype,
                                             keepdims=keepdims))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / _count(mask, axis, keepdims)).astype(total.dtype)


def _nan_moment(name, a, axis, dtype, ddof, keepdims, root):
    keepdims = _keep(keepdims)
    if not _inexact(a):
        func = np.std if root else np.var
        return func(a, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims)
    mask = np.isnan(a)
    total = _reduced(name, np.sum(np.where(mask, 0, a), axis=axis, dtype=dtype, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (total / _count(mask, axis, True)).astype(total.dtype)
        dev = np.where(mask, 0, a - mean)
        square = np.abs(dev) ** 2 if dev.dtype.kind == "c" else dev * dev
        dof = _count(mask, axis, keepdims) - ddof
        var = _reduced(name, np.sum(square, axis=axis, dtype=dtype, keepdims=keepdims))
        var = var / np.maximum(dof, 0)
        var = np.where(dof <= 0, np.nan, var)
    real = np.empty(0, total.dtype).real.dtype
    var = var.astype(real)
    return np.sqrt(var) if root else var


@_registry.implements(np.nanvar)
def nanvar(a, axis=None, dtype=None, out=None, ddof=0, keepdims=np._NoValue, *,
           where=np._NoValue, mean=np._NoValue, correction=np._NoValue):
    """``np.nanvar`` of a DTensor, NumPy's two passes (the mean of the values that
    are not NaN, then their squared deviations) as DTensor reductions. Collective on
    the mesh when a reduced axis is sharded (sums the size of the result).

    Example: ``np.nanvar(dt, axis=1, ddof=1)``.
    """
    _check("numpy.nanvar", a, out, where=where, mean=mean, correction=correction)
    return _nan_moment("numpy.nanvar", a, axis, dtype, ddof, keepdims, False)


@_registry.implements(np.nanstd)
def nanstd(a, axis=None, dtype=None, out=None, ddof=0, keepdims=np._NoValue, *,
           where=np._NoValue, mean=np._NoValue, correction=np._NoValue):
    """``np.nanstd`` of a DTensor: the root of ``np.nanvar``. Collective on the mesh
    when a reduced axis is sharded.

    Example: ``np.nanstd(dt)``.
    """
    _check("numpy.nanstd", a, out, where=where, mean=mean, correction=correction)
    return _nan_moment("numpy.nanstd", a, axis, dtype, ddof, keepdims, True)


def _nan_extreme(name, a, axis, keepdims, largest):
    keepdims = _keep(keepdims)
    func = np.max if largest else np.min
    if not _inexact(a) or a.dtype.kind == "c":
        # Complex values order with their NaNs as NumPy's nanmax does not: left to it.
        if a.dtype.kind == "c":
            raise _registry.NoRule(f"{name}: complex values have no distributed rule")
        return func(a, axis=axis, keepdims=keepdims)
    mask = np.isnan(a)
    best = func(np.where(mask, -np.inf if largest else np.inf, a), axis=axis,
                keepdims=keepdims)
    return np.where(np.all(mask, axis=axis, keepdims=keepdims), np.nan, best)


@_registry.implements(np.nanmax)
def nanmax(a, axis=None, out=None, keepdims=np._NoValue, initial=np._NoValue,
           where=np._NoValue):
    """``np.nanmax`` of a DTensor: the maximum with NaNs as -inf, NaN where a slice is
    all NaN. Collective on the mesh when a reduced axis is sharded (a maximum and a
    flag per result element).

    Example: ``np.nanmax(dt, axis=0)``.
    """
    _check("numpy.nanmax", a, out, initial=initial, where=where)
    return _nan_extreme("numpy.nanmax", a, axis, keepdims, True)


@_registry.implements(np.nanmin)
def nanmin(a, axis=None, out=None, keepdims=np._NoValue, initial=np._NoValue,
           where=np._NoValue):
    """``np.nanmin`` of a DTensor: the minimum with NaNs as +inf, NaN where a slice is
    all NaN. Collective on the mesh when a reduced axis is sharded.

    Example: ``np.nanmin(dt)``.
    """
    _check("numpy.nanmin", a, out, initial=initial, where=where)
    return _nan_extreme("numpy.nanmin", a, axis, keepdims, False)


def _nan_arg(name, a, axis, keepdims, largest):
    keepdims = _keep(keepdims)
    func = np.argmax if largest else np.argmin
    if not _inexact(a) or a.dtype.kind == "c":
        if a.dtype.kind == "c":
            raise _registry.NoRule(f"{name}: complex values have no distributed rule")
        return func(a, axis=axis, keepdims=keepdims)
    mask = np.isnan(a)
    # NumPy refuses a slice of NaNs alone: every rank learns it from one flag.
    if a.size and bool(np.any(np.all(mask, axis=axis)).full_tensor()):
        raise ValueError("All-NaN slice encountered")
    return func(np.where(mask, -np.inf if largest else np.inf, a), axis=axis,
                keepdims=keepdims)


@_registry.implements(np.nanargmax)
def nanargmax(a, axis=None, out=None, *, keepdims=np._NoValue):
    """``np.nanargmax`` of a DTensor: the argmax with NaNs as -inf; a slice of NaNs
    alone is NumPy's ValueError on every rank. Collective on the mesh when the
    input is sharded (a flag, then a value and an index per result element).

    Example: ``np.nanargmax(dt, axis=1)``.
    """
    _check("numpy.nanargmax", a, out)
    return _nan_arg("numpy.nanargmax", a, axis, keepdims, True)


@_registry.implements(np.nanargmin)
def nanargmin(a, axis=None, out=None, *, keepdims=np._NoValue):
    """``np.nanargmin`` of a DTensor: the argmin with NaNs as +inf; a slice of NaNs
    alone is NumPy's ValueError on every rank. Collective on the mesh when the
    input is sharded.

    Example: ``np.nanargmin(dt)``.
    """
    _check("numpy.nanargmin", a, out)
    return _nan_arg("numpy.nanargmin", a, axis, keepdims, False)


@_registry.implements(np.ptp)
def ptp(a, axis=None, out=None, keepdims=np._NoValue):
    """``np.ptp`` of a DTensor: its maximum less its minimum. Collective on the mesh
    when a reduced axis is sharded (two extremes per result element).

    Example: ``np.ptp(dt, axis=0)``.
    """
    _check("numpy.ptp", a, out)
    keepdims = _keep(keepdims)
    return np.max(a, axis=axis, keepdims=keepdims) - np.min(a, axis=axis, keepdims=keepdims)


@_registry.implements(np.average)
def average(a, axis=None, weights=None, returned=False, *, keepdims=np._NoValue):
    """``np.average`` of a DTensor: ``np.mean`` without weights; with weights (a
    DTensor of ``a``'s shape, or a 1-D array or DTensor along one ``axis``, which
    every rank passes alike) the weighted sum over the sum of the weights.
    Collective on the mesh when a reduced axis is sharded (sums the size of the
    result).

    Example: ``np.average(dt, axis=0, weights=w)`` with ``w`` of shape ``(dt.shape[0],)``.
    """
    name = "numpy.average"
    if type(a) is not DTensor and type(weights) is DTensor:
        # Values every rank holds alike beside weights that are a DTensor (the
        # call is agreed): replicated on the weights' mesh.
        mesh = weights.device_mesh
        a = DTensor.from_local(np.ascontiguousarray(a), mesh, [Replicate()] * mesh.ndim)
    _check(name, a)
    keepdims = _keep(keepdims)
    if weights is None:
        avg = np.mean(a, axis=axis, keepdims=keepdims)
        # NumPy's own quotient, ZeroDivisionError of an empty result included.
        count = avg.dtype.type(a.size / avg.size)
        return (avg, np.zeros_like(avg) + count) if returned else avg
    if type(weights) is not DTensor:
        # Every rank passes the same weights, as NumPy's call on each would.
        weights = DTensor.from_local(np.ascontiguousarray(weights), a.device_mesh,
                                     [Replicate()] * a.device_mesh.ndim)
    if weights.shape != a.shape:
        if axis is None or weights.ndim != 1 or not isinstance(axis, (int, np.integer)):
            raise _registry.NoRule(f"{name}: weights of another shape need one int axis")
        axis = normalize_axis_index(int(axis), a.ndim)
        if weights.shape[0] != a.shape[axis]:
            raise _registry.NoRule(f"{name}: weights of another length; NumPy decides")
        weights = weights.reshape(tuple(-1 if d == axis else 1 for d in range(a.ndim)))
    kind = np.result_type(a.dtype, weights.dtype, np.float64 if a.dtype.kind in "iub"
                          else a.dtype)
    wsum = np.sum(np.zeros_like(a, dtype=kind) + weights, axis=axis, keepdims=keepdims)
    if bool(np.any(wsum == 0).full_tensor()):
        raise ZeroDivisionError("Weights sum to zero, can't be normalized")
    avg = _reduced(name, np.sum(np.multiply(a, weights, dtype=kind), axis=axis,
                                keepdims=keepdims)) / wsum
    return (avg, wsum) if returned else avg


def _replace_nan(a, value):
    """``a`` with its NaNs replaced by ``value``, as NumPy's nan functions first do
    (an array of no inexact dtype is left as it is). Local for Shard and Replicate."""
    return np.where(np.isnan(a), value, a) if _inexact(a) else a


@_registry.implements(np.nanprod)
def nanprod(a, axis=None, dtype=None, out=None, keepdims=np._NoValue, initial=np._NoValue,
            where=np._NoValue):
    """``np.nanprod`` of a DTensor: ``np.prod`` with NaNs as one, so a sharded reduced
    axis leaves a Partial(product) the size of the result. Collective on the mesh
    when a reduced axis is sharded and the result is read.

    Example: ``np.nanprod(dt, axis=0)``.
    """
    _check("numpy.nanprod", a, out, initial=initial, where=where)
    return np.prod(_replace_nan(a, 1), axis=axis, dtype=dtype, keepdims=_keep(keepdims))


@_registry.implements(np.nancumsum)
def nancumsum(a, axis=None, dtype=None, out=None):
    """``np.nancumsum`` of a DTensor: ``np.cumsum``'s rule with NaNs as zero (one
    exclusive scan of the shard totals along a sharded axis). Collective on the
    mesh dims that shard the axis.

    Example: ``np.nancumsum(dt, axis=0)``.
    """
    _check("numpy.nancumsum", a, out)
    return np.cumsum(_replace_nan(a, 0), axis=axis, dtype=dtype)


@_registry.implements(np.nancumprod)
def nancumprod(a, axis=None, dtype=None, out=None):
    """``np.nancumprod`` of a DTensor: ``np.cumprod``'s rule with NaNs as one.
    Collective on the mesh dims that shard the axis.

    Example: ``np.nancumprod(dt, axis=1)``.
    """
    _check("numpy.nancumprod", a, out)
    return np.cumprod(_replace_nan(a, 1), axis=axis, dtype=dtype)
