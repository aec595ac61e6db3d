"""NumPy ufuncs on DTensors: every elementwise ufunc, with broadcasting, scalars,
NumPy's own dtype promotion and ``out=``, and matmul.

Each ufunc is registered with the C dispatch at import with its family and the
way it treats Partial inputs (prop.h's mt_elementwise_kind): ``P + P``, ``-P``,
``P * R``, ``P * c``, ``P / R``, ``P / c`` stay Partial(sum|avg); ``maximum``
keeps Partial(max) and ``minimum`` Partial(min); anything else, ``P + c``
included (the scalar would be added once per rank), reduces the Partial first.
The executor runs every call (operators and ``__array_ufunc__``, with ``dtype=``
and ``casting=``); ``array_ufunc`` below is the Python entry of what it leaves to
Python: ``out=`` (and ``x op= y``), other keywords, other methods and a user's
rule, each normalised into executor calls.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import _C, _layout, _modes, _registry
from .._clib import CORE
from .._dtensor import DTensor
from ..placement_types import Replicate
from .._algorithms import _dispatch as D
from . import _ufunc_methods
from . import _deferring, _inplace, _linalg
from .._algorithms import _views
from ._inplace import follow
from ._stats import logaddexp_reduce

_KWARGS = frozenset({"out", "dtype", "casting"})
_KINDS = {
    np.add: CORE.ELEMENTWISE_ADD, np.subtract: CORE.ELEMENTWISE_ADD,
    np.negative: CORE.ELEMENTWISE_NEG, np.positive: CORE.ELEMENTWISE_ADD,
    np.multiply: CORE.ELEMENTWISE_MUL, np.true_divide: CORE.ELEMENTWISE_DIV,
    np.maximum: CORE.ELEMENTWISE_MAX, np.minimum: CORE.ELEMENTWISE_MIN,
}
# Non-decreasing on their whole domain, so max(f(p)) = f(max(p)): a Partial(max)
# or Partial(min) passes (torch's non-decreasing unary rules).
_KINDS.update(dict.fromkeys(
    (np.exp, np.exp2, np.expm1, np.floor, np.ceil, np.trunc, np.rint, np.tanh, np.sinh,
     np.arcsinh, np.arctan, np.sign, np.deg2rad, np.rad2deg, np.radians, np.degrees),
    CORE.ELEMENTWISE_INCREASING))


# The ufuncs registered with the C dispatch: NumPy's at import, another library's
# (scipy.special's, say) at its first call on a DTensor.
_registered: set = set()


def _register_one(u) -> bool:
    """Registers ``u`` with the C dispatch once; whether it is registered."""
    if u in _registered:
        return True
    label = _registry.call_label(np.ufunc, (u, "__call__"))
    if u is np.matmul:
        _C.register_ufunc(u, CORE.FAMILY_MATMUL, 0, label)
    elif u.signature is None and u.nin <= D.MAX_INPUTS and u.nout >= 1:
        _C.register_ufunc(u, CORE.FAMILY_ELEMENTWISE, _KINDS.get(u, CORE.ELEMENTWISE_NONE), label)
    else:
        return False
    _registered.add(u)
    return True


def _register() -> None:
    """Registers every elementwise ufunc of NumPy, and matmul, once."""
    # NumPy's module dict, not dir(np): reading each name of dir() imports the
    # submodules NumPy loads on first use (f2py, ma, testing, ...), which every
    # process of a job would pay for at `import mpitensor`.
    for name, u in sorted(vars(np).items()):
        if isinstance(u, np.ufunc):
            _register_one(u)


_register()


@_registry.implements(np.ufunc)
def array_ufunc(ufunc, method, *operands, **kwargs):
    """The Python entry of ``ufunc.method(*operands, **kwargs)`` on DTensors: what
    the executor leaves to Python (out=, other methods, checks of keywords and
    operands), normalised into executor calls; what no rule covers runs on the
    gathered arrays. The Python door (mpitensor._registry.door_from_c) calls it,
    once the call is agreed, and runs a user's rule instead."""
    try:
        return _array_ufunc(ufunc, method, *operands, **kwargs)
    except _registry.NoRule as e:
        name = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        f = ufunc if method == "__call__" else getattr(ufunc, method)
        return _registry.gather_call(f, operands, kwargs, name, cause=e)


def _array_ufunc(ufunc, method, *operands, **kwargs):
    if method != "__call__":
        if method == "reduce" and ufunc in (np.logaddexp, np.logaddexp2):
            return logaddexp_reduce(ufunc, *operands, **kwargs)
        return _ufunc_methods.method(ufunc, method, operands, kwargs)
    if ufunc is np.isnan and len(operands) == 1 and not kwargs:
        deferred = _deferring.isnan(operands[0])
        if deferred is not None:
            return deferred
    gufunc = _linalg.GUFUNCS.get(ufunc)
    if (gufunc is not None and len(operands) == 2 and set(kwargs) <= gufunc[1]
            and all(type(x) is DTensor for x in operands)):
        return gufunc[0](*operands, **kwargs)  # the contraction it is
    if not _register_one(ufunc):
        raise _registry.NoRule(f"{_name_of(ufunc)} has no sharding rule for DTensors in "
                               f"mpitensor")
    name = _name_of(ufunc)
    for k in kwargs:
        if k not in _KWARGS:
            raise _registry.NoRule(f"{name}: the keyword argument {k}= is not supported "
                                   f"on DTensors")
    out = kwargs.get("out")
    if out and not any(type(o) is DTensor for o in out):
        # NumPy's `a += dt` with `a` an ndarray: the whole result written into `a`,
        # gathered as np.asarray(dt) gathers (warned, counted), and `a` returned.
        return _registry.gather_call(ufunc, operands, kwargs, name)
    if (out and type(out[0]) is DTensor and _modes.state.implicit_replication
            and not any(type(x) is DTensor for x in operands)):
        # Every input plain, written into a DTensor: replicated on the output's mesh.
        operands = _C.implicit(tuple(operands), out[0])
    else:
        operands = D.implicit(operands)
    split = D.split_operands(name, operands)
    if split is None:
        return NotImplemented
    inputs, pattern = split
    outs = kwargs.pop("out", None)
    if outs is None:
        return D.execute(ufunc, operands, kwargs=kwargs or None)
    if len(outs) != ufunc.nout:
        raise TypeError(f"{name}: out= must be {ufunc.nout} DTensor(s)")
    for o in outs:
        if type(o) is not DTensor:
            raise TypeError(f"{name}: out= must be {ufunc.nout} DTensor(s)")
    if not inputs:
        # Numbers only (agreed), written into DTensors: NumPy's value, the same on
        # every rank, broadcast into each output as np.copyto writes.
        results = ufunc(*operands, **kwargs)
        casting = kwargs.get("casting", "same_kind")
        for o, r in zip(outs, results if ufunc.nout > 1 else (results,)):
            _inplace.copyto(o, r, casting=casting)
        return outs[0] if len(outs) == 1 else outs
    mesh = D.same_mesh(name, inputs + list(outs))

    def run():
        out_pl, out_shape, _ = D.decide(ufunc, operands)
        if _fits(out_pl, out_shape, outs) or len(outs) != 1 or ufunc is np.matmul:
            return _into_outs(mesh, ufunc, operands, kwargs, outs, out_pl, out_shape)
        return _follow_out(mesh, ufunc, operands, pattern, kwargs, outs[0], out_pl,
                           out_shape)

    # An output that basic indexing made is written through to its base.
    if len(outs) == 1:
        return _views.write(outs[0], run)
    for o in outs:
        run = functools.partial(_views.write, o, run)
    return run()


def _name_of(ufunc) -> str:
    """``numpy.<name>`` of a ufunc, made once."""
    name = _NAMES.get(ufunc)
    if name is None:
        name = _NAMES[ufunc] = f"numpy.{ufunc.__name__}"
    return name


_NAMES: dict = {}


def _fits(out_pl, out_shape, outs) -> bool:
    for o in outs:
        if o._spec.placements != out_pl or o._spec.shape != out_shape:
            return False
    return True


def _follow_out(mesh, ufunc, operands, pattern, kwargs, o, out_pl, out_shape):
    """``out=`` (and ``x op= y``) when the decision's output placements are not the
    output's: the cheaper of moving every DTensor input to follow the output (torch's
    rule for in-place ops; nothing moves back) and the decision followed by one
    redistribution of the result; the bytes tie goes to following. An output with a
    Partial the result would not have keeps it: the result is written into it (torch
    refuses), except into Partial(avg), which no write makes exact."""
    name = f"numpy.{ufunc.__name__}"
    if o.shape != out_shape:
        raise ValueError(f"{name}: out= has shape {o.shape}, the result has shape "
                         f"{out_shape}")
    if any(p.is_partial() for p in o.placements):
        # The output keeps its placements (as in torch, an in-place operation never
        # changes them); the result is written into its Partial as copyto writes
        # (once per reduction, the identity elsewhere), where torch refuses.
        result = D.execute(ufunc, operands, kwargs=kwargs or None)
        _inplace.copyto(o, result, casting=kwargs.get("casting", "same_kind"))
        return o
    spec = o._spec
    targets, follow_bytes = [], 0
    for x, is_dt in zip(operands, pattern):
        if not is_dt:
            continue
        lead = len(spec.shape) - x.ndim
        dims = {d: d - lead for d in range(lead, len(spec.shape))
                if x.shape[d - lead] == spec.shape[d]}
        t = follow(spec, dims, x)
        t = tuple(Replicate() if q.is_partial() else q for q in t)
        targets.append(t)
        if t != x.placements:
            follow_bytes += _plan_bytes(mesh, x, t)
    via = D.decide(ufunc, operands)[2]
    if out_pl != o.placements:
        via += _plan_bytes(mesh, o, o.placements, src=out_pl)
    if via < follow_bytes:
        return _into_outs(mesh, ufunc, operands, kwargs, (o,), out_pl, out_shape)
    moved = iter(targets)
    args = tuple(D.relayout(name, x, next(moved)) if is_dt else x
                 for x, is_dt in zip(operands, pattern))
    pl, shape, _ = D.decide(ufunc, args)
    return _into_outs(mesh, ufunc, args, kwargs, (o,), pl, shape)


def _plan_bytes(mesh, x, dst, src=None) -> int:
    """The bytes (over all ranks) of redistributing ``x``'s layout (or ``src``
    placements of it) to ``dst``. Local."""
    spec = x._spec
    return _layout.plan(mesh, spec.shape, src or spec.placements, dst, spec.dtype).bytes


def _into_fitting(mesh, ufunc, operands, kwargs, outs):
    """Runs the ufunc straight into the local arrays of outputs that have the
    result's placements and shape."""
    if mesh._coordinate is None:
        D.execute(ufunc, operands, kwargs=kwargs or None)
    else:
        into = (outs[0]._data(),) if len(outs) == 1 else tuple(o._data() for o in outs)
        D.execute(ufunc, operands, None, lambda *ls: ufunc(*ls, out=into, **kwargs))
    return outs[0] if len(outs) == 1 else outs


def _into_outs(mesh, ufunc, operands, kwargs, outs, out_pl, out_shape):
    """Runs the ufunc into DTensor outputs: straight into their local arrays when
    they have the result's placements and shape, else into new arrays that are
    then redistributed to the outputs' placements and copied in."""
    for o in outs:
        if o._spec.shape != out_shape:
            raise ValueError(f"numpy.{ufunc.__name__}: out= has shape {o.shape}, the "
                             f"result has shape {out_shape}")
    if _fits(out_pl, out_shape, outs):
        return _into_fitting(mesh, ufunc, operands, kwargs, outs)
    result = D.execute(ufunc, operands, kwargs=kwargs or None)
    results = (result,) if ufunc.nout == 1 else result
    for o, r in zip(outs, results):
        if r.placements != o.placements and any(p.is_partial() for p in o.placements):
            # an output keeps its Partial: written as copyto writes into one
            _inplace.copyto(o, r, casting=kwargs.get("casting", "same_kind"))
            continue
        if r.placements != o.placements:
            r = r.redistribute(mesh, o.placements)
        if mesh._coordinate is not None:
            np.copyto(o._data(), r._data(), casting=kwargs.get("casting", "same_kind"))
    return outs[0] if len(outs) == 1 else outs
