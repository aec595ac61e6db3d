"""NumPy ufuncs on DTensors: every elementwise ufunc, with broadcasting, scalars,
NumPy's own dtype promotion and ``out=``, and matmul.

Each ufunc is registered with the C dispatch at import with its family and the
way it treats Partial inputs (prop.h's mt_elementwise_kind): ``P + P``, ``-P``,
``P * R``, ``P * c``, ``P / R``, ``P / c`` stay Partial(sum|avg); ``maximum``
keeps Partial(max) and ``minimum`` Partial(min); anything else, ``P + c``
included (the scalar would be added once per rank), reduces the Partial first.
The C path runs the calls it can take; ``array_ufunc`` below is the Python entry
of the others (``out=`` and other keywords, plain ndarrays, implicit replication,
debugging tools, ranks outside the mesh), deciding through the same memo.
"""

from __future__ import annotations

import numpy as np

from .. import _C, _redistribute, _registry
from .._dtensor import DTensor
from ..placement_types import Replicate
from . import _dispatch as D
from ._inplace import follow
from ._stats import logaddexp_reduce

_KWARGS = frozenset({"out", "dtype", "casting"})
_KINDS = {
    np.add: _C.ELEMENTWISE_ADD, np.subtract: _C.ELEMENTWISE_ADD,
    np.negative: _C.ELEMENTWISE_NEG, np.positive: _C.ELEMENTWISE_ADD,
    np.multiply: _C.ELEMENTWISE_MUL, np.true_divide: _C.ELEMENTWISE_DIV,
    np.maximum: _C.ELEMENTWISE_MAX, np.minimum: _C.ELEMENTWISE_MIN,
}
# Non-decreasing on their whole domain, so max(f(p)) = f(max(p)): a Partial(max)
# or Partial(min) passes (torch's non-decreasing unary rules).
_KINDS.update(dict.fromkeys(
    (np.exp, np.exp2, np.expm1, np.floor, np.ceil, np.trunc, np.rint, np.tanh, np.sinh,
     np.arcsinh, np.arctan, np.sign, np.deg2rad, np.rad2deg, np.radians, np.degrees),
    _C.ELEMENTWISE_INCREASING))


def _register() -> None:
    """Registers every elementwise ufunc of NumPy, and matmul, once."""
    seen = set()
    for name in sorted(dir(np)):
        u = getattr(np, name)
        if not isinstance(u, np.ufunc) or u in seen:
            continue
        seen.add(u)
        if u is np.matmul:
            _C.register_ufunc(u, _C.FAMILY_MATMUL, 0)
        elif u.signature is None and u.nin <= D.MAX_INPUTS:
            _C.register_ufunc(u, _C.FAMILY_ELEMENTWISE,
                              _KINDS.get(u, _C.ELEMENTWISE_NONE))


_register()


@_registry.implements(np.ufunc)
def array_ufunc(ufunc, method, *operands, **kwargs):
    """The Python entry of ``ufunc.method(*operands, **kwargs)`` on DTensors."""
    name = f"numpy.{ufunc.__name__}"
    if _registry.rules and method == "__call__":
        custom = _registry.rules.get(ufunc)
        if custom is not None:  # experimental.register_sharding overrides the rule
            return custom(operands, kwargs)
    if method == "reduce" and ufunc in (np.logaddexp, np.logaddexp2):
        return logaddexp_reduce(ufunc, *operands, **kwargs)
    if method != "__call__":
        raise TypeError(
            f"{name}.{method} has no sharding rule for DTensors in mpitensor; use the "
            f"NumPy function (e.g. numpy.sum for add.reduce) or .full_tensor()"
        )
    if ufunc.signature is not None and ufunc is not np.matmul:
        raise TypeError(f"{name} has no sharding rule for DTensors in mpitensor")
    for k in kwargs:
        if k not in _KWARGS:
            raise TypeError(f"{name}: the keyword argument {k}= is not supported on DTensors")
    operands = D.implicit(operands)
    split = D.split_operands(name, operands)
    if split is None:
        return NotImplemented
    inputs, pattern = split
    outs = kwargs.pop("out", None)
    if outs is not None:
        if len(outs) != ufunc.nout or any(type(o) is not DTensor for o in outs):
            raise TypeError(f"{name}: out= must be {ufunc.nout} DTensor(s)")
    mesh = D.same_mesh(name, inputs + list(outs or ()))
    dec = D.decide_ufunc(ufunc, operands)
    if outs is not None and not _fits(dec, outs):
        return _follow_out(mesh, dec, ufunc, operands, pattern, kwargs, outs)
    local = iter(D.local_inputs(mesh, inputs, dec))
    args = [next(local) if is_dt else obj for is_dt, obj in zip(pattern, operands)]
    if outs is None:
        result = ufunc(*args, **kwargs)
        if ufunc.nout == 1:
            return D.wrap(mesh, dec, result)
        return tuple(D.wrap(mesh, dec, r) for r in result)
    return _into_outs(mesh, dec, ufunc, args, kwargs, outs)


def _fits(dec, outs) -> bool:
    return all(o._spec.placements == dec.out_placements and o._spec.shape == dec.out_shape
               for o in outs)


def _follow_out(mesh, dec, ufunc, operands, pattern, kwargs, outs):
    """``out=`` (and ``x op= y``) when the decision's output placements are not the
    output's: the cheaper of moving every DTensor input to follow the output (torch's
    rule for in-place ops; nothing moves back) and the decision followed by one
    redistribution of the result; the bytes tie goes to following. An output with a
    Partial the result would not have is a RuntimeError, as in torch: placements are
    never changed in place."""
    name = f"numpy.{ufunc.__name__}"
    o = outs[0]
    if len(outs) != 1 or ufunc is np.matmul:
        return _into_outs(mesh, dec, ufunc, _run_inputs(mesh, operands, pattern, dec),
                          kwargs, outs)
    if o.shape != dec.out_shape:
        raise ValueError(f"{name}: out= has shape {o.shape}, the result has shape "
                         f"{dec.out_shape}")
    if any(p.is_partial() for p in o.placements):
        raise RuntimeError(
            f"{name} into a DTensor with placements {o.placements}: the result would be "
            f"{dec.out_placements}, and an in-place operation never changes placements "
            f"(a Partial cannot be made from a result); redistribute the output first, "
            f"e.g. x = x.redistribute(x.device_mesh, [Replicate()]), or write "
            f"x = {name}(...) to get a new DTensor")
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
    via = sum(p.bytes for p in dec.plans if p is not None)
    if dec.out_placements != o.placements:
        via += _plan_bytes(mesh, o, o.placements, src=dec.out_placements)
    if via < follow_bytes:
        return _into_outs(mesh, dec, ufunc, _run_inputs(mesh, operands, pattern, dec),
                          kwargs, outs)
    moved = iter(targets)
    args = [D.relayout(name, x, next(moved)) if is_dt else x
            for x, is_dt in zip(operands, pattern)]
    if mesh._coordinate is not None:
        ufunc(*[a.to_local() if t else a for a, t in zip(args, pattern)],
              out=(o.to_local(),), **kwargs)
    return o


def _plan_bytes(mesh, x, dst, src=None) -> int:
    """The bytes (over all ranks) of redistributing ``x``'s layout (or ``src``
    placements of it) to ``dst``. Local."""
    spec = x._spec
    return _redistribute.plan_for(mesh, spec.shape, src or spec.placements, dst,
                                  spec.dtype).bytes


def _run_inputs(mesh, operands, pattern, dec):
    local = iter(D.local_inputs(mesh, [x for x, t in zip(operands, pattern) if t], dec))
    return [next(local) if t else x for x, t in zip(operands, pattern)]


def _into_outs(mesh, dec, ufunc, args, kwargs, outs):
    """Runs the ufunc into DTensor outputs: straight into their local arrays when
    they already have the result's placements and shape, else into new arrays that
    are then redistributed to the outputs' placements and copied in."""
    if _fits(dec, outs) and mesh._coordinate is not None:
        ufunc(*args, out=tuple(o.to_local() for o in outs), **kwargs)
        return outs[0] if len(outs) == 1 else outs
    result = ufunc(*args, **kwargs)
    results = (result,) if ufunc.nout == 1 else result
    for o, r in zip(outs, results):
        if o.shape != dec.out_shape:
            raise ValueError(
                f"numpy.{ufunc.__name__}: out= has shape {o.shape}, the result has "
                f"shape {dec.out_shape}")
        r = D.wrap(mesh, dec, r)
        if r.placements != o.placements:
            r = r.redistribute(mesh, o.placements)
        if mesh._coordinate is not None:
            np.copyto(o.to_local(), r.to_local(), casting=kwargs.get("casting", "same_kind"))
    return outs[0] if len(outs) == 1 else outs
