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

from .. import _C, _registry
from .._dtensor import DTensor
from . import _dispatch as D

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
    local = iter(D.local_inputs(mesh, inputs, dec))
    args = [next(local) if is_dt else obj for is_dt, obj in zip(pattern, operands)]
    if outs is None:
        result = ufunc(*args, **kwargs)
        if ufunc.nout == 1:
            return D.wrap(mesh, dec, result)
        return tuple(D.wrap(mesh, dec, r) for r in result)
    return _into_outs(mesh, dec, ufunc, args, kwargs, outs)


def _into_outs(mesh, dec, ufunc, args, kwargs, outs):
    """Runs the ufunc into DTensor outputs: straight into their local arrays when
    they already have the result's placements and shape, else into new arrays that
    are then redistributed to the outputs' placements and copied in."""
    fits = all(o._spec.placements == dec.out_placements and o._spec.shape == dec.out_shape
               for o in outs)
    if fits and mesh._coordinate is not None:
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
