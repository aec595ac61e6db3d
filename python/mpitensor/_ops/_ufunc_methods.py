"""ufunc methods on DTensors as the distributed operations they equal, so that
``np.add.reduce`` costs what ``np.sum`` costs and never gathers the array:

| method | is | placements |
|---|---|---|
| ``reduce`` of add, multiply, maximum, minimum, logical_and, logical_or | ``sum``, ``prod``, ``max``, ``min``, ``all``, ``any`` (``axis=0`` by default, as ufunc.reduce) | the reduction's: a reduced sharded dim gives a Partial or a merge |
| ``accumulate`` of add, multiply | ``cumsum``, ``cumprod`` along ``axis`` (0 by default) | the scan's |
| ``outer`` of any elementwise ufunc of two operands | the ufunc of the first operand with the second's dims appended, broadcast | the elementwise rule's |

Every other method and ufunc (``reduceat``, ``at``, ``maximum.accumulate``,
``initial=``, ``where=``, ...) raises NoRule before anything moves, which hands the
call to the fallback (_fallback.py): NumPy on the gathered arrays.
"""

from __future__ import annotations

import numpy as np

from .. import _registry
from .._dtensor import DTensor

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
    if func is None:
        raise _no_rule(label, "no reduction of this ufunc")
    a, kw = _one_array(label, operands, kwargs, _REDUCE_KW)
    if func in (np.all, np.any):
        if kw.pop("dtype", None) not in (None, bool, np.bool_):
            raise _no_rule(label, "a dtype= other than bool")
    return func(a, **kw)


def _accumulate(ufunc, label: str, operands: tuple, kwargs: dict):
    func = _ACCUMULATE.get(ufunc)
    if func is None:
        raise _no_rule(label, "no scan of this ufunc")
    a, kw = _one_array(label, operands, kwargs, _ACCUMULATE_KW)
    if kw["axis"] is None:
        # ufunc.accumulate has no flattening form: NumPy refuses axis=None.
        raise TypeError(f"{label}: axis=None is not supported by accumulate")
    return func(a, **kw)


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
