"""NumPy ufuncs on DTensors (``__array_ufunc__``): every elementwise ufunc with one or
two inputs, with broadcasting, scalars, NumPy's own dtype promotion and ``out=``.

Dim map: inputs right-aligned on the output's dims (all KEEP); an input dim of
size 1 that broadcasts gets its in_bcast bit. Partial inputs are kept by linear
ufuncs only as the algebra allows: ``P + P``, ``-P``, ``P * R``, ``P * c``,
``P / R``, ``P / c`` stay Partial(sum|avg); ``maximum`` keeps Partial(max) and
``minimum`` Partial(min); anything else, including ``P + c`` (the scalar would be
added once per rank), reduces the Partial first.
"""

from __future__ import annotations

import numpy as np

from .. import _C, _registry
from .._dtensor import DTensor
from . import _dispatch as D
from . import _linalg

_LINEAR_ALL = frozenset({np.add, np.subtract, np.negative, np.positive})
_KWARGS = frozenset({"out", "dtype", "casting"})


def _partial_rule(ufunc, pattern):
    """(rule, partial_inputs, partial_ops) for a ufunc called with ``pattern``
    (True where the operand is a DTensor)."""
    both = all(pattern)
    if ufunc in _LINEAR_ALL:
        return (D.P_LINEAR_ALL, 0, 0) if both else (D.P_NONE, 0, 0)
    if ufunc is np.multiply:
        return (D.P_LINEAR_ONE, 0b11, 0) if both else (D.P_LINEAR_ALL, 0, 0)
    if ufunc is np.true_divide:
        if both:
            return D.P_LINEAR_ONE, 0b01, 0
        return (D.P_LINEAR_ALL, 0, 0) if pattern[0] else (D.P_NONE, 0, 0)
    if ufunc is np.maximum:
        return D.P_SAME_OP, 1 << D.R_MAX, 0
    if ufunc is np.minimum:
        return D.P_SAME_OP, 1 << D.R_MIN, 0
    return D.P_NONE, 0, 0


def _elementwise_map(ufunc, pattern, shapes):
    out_shape = np.broadcast_shapes(*shapes)
    nout = len(out_shape)
    in_labels, bcast = [], []
    for shape in shapes:
        first = nout - len(shape)
        in_labels.append(range(first, nout))
        bits = 0
        for d, n in enumerate(shape):
            if n == 1 and out_shape[first + d] != 1:
                bits |= 1 << d
        bcast.append(bits)
    rule, pops, _ = _partial_rule(ufunc, pattern)
    partial_inputs, partial_ops = (pops, 0) if rule == D.P_LINEAR_ONE else (0, pops)
    return D.dimmap(in_labels, range(nout), [D.KEEP] * nout, in_bcast=bcast,
                    partial_rule=rule, partial_inputs=partial_inputs,
                    partial_ops=partial_ops)


def array_ufunc(self, ufunc, method, *operands, **kwargs):
    """DTensor.__array_ufunc__."""
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
    given = operands
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
    pattern = tuple(pattern)
    key = D.input_key((ufunc, pattern), inputs)
    if ufunc is np.matmul:
        build = lambda: _linalg.matmul_map(name, [x.shape for x in inputs])  # noqa: E731
    else:
        build = lambda: _elementwise_map(ufunc, pattern, [x.shape for x in inputs])  # noqa: E731
    dec = D.decide(key, mesh, inputs, build)
    local = iter(D.local_inputs(mesh, inputs, dec))
    args = [next(local) if is_dt else obj for is_dt, obj in zip(pattern, operands)]
    if outs is None:
        result = ufunc(*args, **kwargs)
        if ufunc.nout == 1:
            out = D.wrap(mesh, dec, result)
            if dec.local_only and not kwargs and mesh._coordinate is not None:
                _C.dispatch_record_ufunc(ufunc, given, out)
            return out
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
