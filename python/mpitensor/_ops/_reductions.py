"""Reductions on DTensors, as NumPy functions and as DTensor methods.

Dim map: reduced dims are REDUCE labels where sharding them gives a Partial
(``sum``/``nansum`` -> Partial(sum), ``mean`` -> Partial(avg) for even shards only,
``prod`` -> Partial(product), ``max``/``min`` -> Partial(max/min)), and REPLICATE
labels for the reductions whose partial results do not combine (``all``, ``any``,
``argmax``, ``argmin``, ``std``, ``var``, and max/min of bool or complex values,
which have no MPI max/min here). Kept dims are KEEP; with ``keepdims`` each reduced
dim becomes a new size-1 REPLICATE output label. Partial inputs: sum and mean are
linear (a Partial(sum|avg) passes through), max/min keep Partial(max/min), the
others reduce it first.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .. import _C, _registry
from .._dtensor import DTensor
from . import _dispatch as D

_DDOF_0 = {"ddof": 0}  # std/var's default, which the ndarray methods also use

# name -> (NumPy function, reduce op or None for REPLICATE, partial rule,
#          partial ops, even_only)
_RULES = {
    "sum": (np.sum, D.R_SUM, D.P_LINEAR_ALL, 0, False),
    "nansum": (np.nansum, D.R_SUM, D.P_NONE, 0, False),
    "mean": (np.mean, D.R_AVG, D.P_LINEAR_ALL, 0, True),
    "prod": (np.prod, D.R_PRODUCT, D.P_NONE, 0, False),
    "max": (np.max, D.R_MAX, D.P_SAME_OP, 1 << D.R_MAX, False),
    "amax": (np.amax, D.R_MAX, D.P_SAME_OP, 1 << D.R_MAX, False),
    "min": (np.min, D.R_MIN, D.P_SAME_OP, 1 << D.R_MIN, False),
    "amin": (np.amin, D.R_MIN, D.P_SAME_OP, 1 << D.R_MIN, False),
    "all": (np.all, None, D.P_NONE, 0, False),
    "any": (np.any, None, D.P_NONE, 0, False),
    "argmax": (np.argmax, None, D.P_NONE, 0, False),
    "argmin": (np.argmin, None, D.P_NONE, 0, False),
    "std": (np.std, None, D.P_NONE, 0, False),
    "var": (np.var, None, D.P_NONE, 0, False),
}


def _reduce_map(name, ndim, axes, keepdims, dtype):
    _, op, rule, pops, even = _RULES[name]
    if op in (D.R_MAX, D.R_MIN) and dtype.kind in "bc":
        op, rule, pops = None, D.P_NONE, 0
    kinds, reduce_ops, sizes, out = [], {}, {}, []
    for d in range(ndim):
        if d not in axes:
            kinds.append(D.KEEP)
        elif op is None:
            kinds.append(D.REPLICATE)
        else:
            kinds.append(D.REDUCE)
            reduce_ops[d] = op
    for d in range(ndim):
        if d not in axes:
            out.append(d)
        elif keepdims:
            sizes[len(kinds)] = 1
            out.append(len(kinds))
            kinds.append(D.REPLICATE)
    even_only = sum(1 << d for d in axes) if even and op is not None else 0
    return D.dimmap([range(ndim)], out, kinds, reduce_ops=reduce_ops,
                    even_only=even_only, partial_rule=rule, partial_ops=pops,
                    sizes=sizes)


def _reduce(name, a, axis, keepdims, out, extra):
    fname = f"numpy.{name}"
    if type(a) is not DTensor:
        raise TypeError(f"{fname}: expected a DTensor, got {type(a).__name__}")
    if out is not None:
        raise TypeError(f"{fname}: out= is not supported on DTensors")
    for k in extra:
        if k not in ("dtype", "ddof"):
            raise TypeError(f"{fname}: the keyword argument {k}= is not supported on DTensors")
    ndim = a.ndim
    if name in ("argmax", "argmin"):
        if axis is not None and not isinstance(axis, (int, np.integer)):
            raise TypeError(f"{fname}: axis must be an int or None, got {axis!r}")
    axes = tuple(range(ndim)) if axis is None else normalize_axis_tuple(axis, ndim)
    keepdims = bool(keepdims)
    mesh = a._spec.mesh
    key = D.input_key((name, axes, keepdims), (a,))
    dec = D.decide(key, mesh, (a,),
                   lambda: _reduce_map(name, ndim, axes, keepdims, a._spec.dtype))
    (local,) = D.local_inputs(mesh, (a,), dec)
    func = _RULES[name][0]
    if name in ("argmax", "argmin"):
        ax = None if axis is None else axes[0]
        result = func(local, axis=ax, keepdims=keepdims)
        if axis is None and not keepdims:
            result = np.asarray(result)
    else:
        result = func(local, axis=axes, keepdims=keepdims, **extra)
    out = D.wrap(mesh, dec, result)
    if (dec.local_only and mesh._coordinate is not None
            and (not extra or extra == _DDOF_0)):
        _C.dispatch_record_reduction(name, a, axis, keepdims, axes, out)
    return out


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


def _arg(name):
    def impl(a, axis=None, out=None, *, keepdims=False):
        return _reduce(name, a, axis, keepdims, out, {})
    impl.__name__ = name
    return impl


def _moment(name):
    def impl(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kwargs):
        if dtype is not None:
            kwargs["dtype"] = dtype
        kwargs["ddof"] = ddof
        return _reduce(name, a, axis, keepdims, out, kwargs)
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
for _name, _impl in IMPLS.items():
    _registry.implements(_RULES[_name][0])(_impl)
