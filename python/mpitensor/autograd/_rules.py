"""Backward rules of the operations on DTensors.

At import every operation in mpitensor._registry gets an entry that, while grad
mode is on and an operand requires grad, runs the forward with grad mode off and
records the result with its rule (mpitensor.autograd._engine.record). Calls with
nothing to record go straight to the forward (and the ones the C path takes never
come here). The ufuncs and reduction methods the C path takes are recorded there,
without coming here: their node holds the operands, and its backward is the same
gradient function as their rule's here (``_RECORDED_REDUCTIONS``,
``_recorded_ufunc``). An operation with no rule here raises NotImplementedError
when it would have to record a floating-point result, rather than drop the
gradient.

A rule computes the gradients with DTensor operations, so they run through the
same dispatch as the forward: their placements come from the same C decisions and
are priced the same way. A gradient is computed only for the operands that need
one; broadcast dims are summed away (a Partial(sum) where they are sharded).
"""

from __future__ import annotations

import functools
import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .. import _C, _modes, _registry
from .._dtensor import DTensor
from .._dtensor_spec import contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from .._ops import _dispatch as D
from .._ops._indexing import _parse
from ..placement_types import Replicate
from ._engine import record

__all__: list = []


def _differentiable(func, rule) -> None:
    """Replaces ``func``'s entry in the registry by one that records with
    ``rule(result, *args, **kwargs)`` when an operand requires grad in grad mode."""
    impl = _registry.functions[func]
    forward = _call_ufunc if func is np.ufunc else impl

    @functools.wraps(impl)
    def entry(*args, **kwargs):
        if not _modes.grad_enabled or not _C.needs_grad(args, kwargs):
            return impl(*args, **kwargs)
        if func in _WRITES:
            raise RuntimeError(
                f"{_WRITES[func]}: a DTensor that requires grad cannot be written in place "
                f"while grad mode is on (the write would not be recorded and a gradient "
                f"would be lost); write under mpitensor.no_grad(), or build a new DTensor "
                f"(e.g. numpy.where)")
        if kwargs.get("out") is not None:
            raise RuntimeError(
                f"{_name(func, args)}: out= (or an in-place operator) with DTensors that "
                f"require grad is not supported in grad mode; write the result to a new "
                f"DTensor, or run the update under mpitensor.no_grad()")
        was = _modes.set_grad_enabled(False)
        try:
            result = forward(*args, **kwargs)
        finally:
            _modes.set_grad_enabled(was)
        return rule(result, *args, **kwargs)

    _registry.functions[func] = entry


# The operations that write into their first operand, by the name users write.
_WRITES = {operator.setitem: "DTensor item assignment (dt[key] = value)",
           np.copyto: "numpy.copyto (and DTensor.fill)"}


def _call_ufunc(ufunc, method, *operands, **kwargs):
    """The ufunc called again with grad mode off: the C dispatch then takes it with
    its cached decision (it leaves tensors that record to the Python entry only in
    grad mode), where the Python entry would decide anew; a call the C path cannot
    take comes back to the entry, which with grad mode off runs the operation."""
    return getattr(ufunc, method)(*operands, **kwargs)


def _name(func, args) -> str:
    if func is np.ufunc:
        return f"numpy.{args[0].__name__}"
    return f"numpy.{getattr(func, '__name__', func)}"


def _inexact(result) -> bool:
    results = result if isinstance(result, tuple) else (result,)
    return any(type(r) is DTensor and np.issubdtype(r._spec.dtype, np.inexact)
               for r in results)


def _no_rule(func):
    def rule(result, *args, **kwargs):
        if _inexact(result):
            raise NotImplementedError(
                f"{_name(func, args)} has no backward rule in mpitensor.autograd yet; "
                f"run it under mpitensor.no_grad() or on .detach()ed DTensors (the "
                f"gradient through it would be lost)")
        return result
    return rule


# -- helpers ---------------------------------------------------------------------------

def _sum_to(g: DTensor, shape: tuple) -> DTensor:
    """``g`` summed over the dims broadcasting added to ``shape``."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, g.shape)) if n == 1 and m != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _fit(gx, x):
    """A gradient for operand ``x``: broadcast dims summed away, ``x``'s dtype."""
    gx = _sum_to(gx, x.shape)
    return gx if gx.dtype == x.dtype else gx.astype(x.dtype)


# -- ufuncs ----------------------------------------------------------------------------
# ufunc -> grads(g, operands, out, need): one gradient (or None) per operand, only
# where need[i]; operands are DTensors or scalars.

def _maximum_mask(a, b, greater):
    win = (a > b) if greater else (a < b)
    return win + 0.5 * (a == b)  # ties split the gradient, as torch's maximum


def _power(g, ops, out, need):
    a, b = ops
    ga = g * b * a ** (b - 1) if need[0] else None
    gb = g * out * np.log(a) if need[1] else None
    return ga, gb


_UFUNCS = {
    np.add: lambda g, ops, out, need: (g, g),
    np.subtract: lambda g, ops, out, need: (g, -g if need[1] else None),
    np.negative: lambda g, ops, out, need: (-g,),
    np.positive: lambda g, ops, out, need: (g,),
    np.absolute: lambda g, ops, out, need: (g * np.sign(ops[0]),),  # torch: 0 at 0
    np.multiply: lambda g, ops, out, need: (g * ops[1] if need[0] else None,
                                            g * ops[0] if need[1] else None),
    np.true_divide: lambda g, ops, out, need: (g / ops[1] if need[0] else None,
                                               -(g * out) / ops[1] if need[1] else None),
    np.exp: lambda g, ops, out, need: (g * out,),
    np.expm1: lambda g, ops, out, need: (g * (out + 1),),
    np.log: lambda g, ops, out, need: (g / ops[0],),
    np.log1p: lambda g, ops, out, need: (g / (ops[0] + 1),),
    np.tanh: lambda g, ops, out, need: (g * (1 - out * out),),
    np.sqrt: lambda g, ops, out, need: (g / (2 * out),),
    np.square: lambda g, ops, out, need: (g * (2 * ops[0]),),
    np.sin: lambda g, ops, out, need: (g * np.cos(ops[0]),),
    np.cos: lambda g, ops, out, need: (-(g * np.sin(ops[0])),),
    np.maximum: lambda g, ops, out, need: _select_grads(g, ops, need, True),
    np.minimum: lambda g, ops, out, need: _select_grads(g, ops, need, False),
    np.power: _power,
}


def _select_grads(g, ops, need, greater):
    mask = _maximum_mask(ops[0], ops[1], greater)
    return (g * mask if need[0] else None, g * (1 - mask) if need[1] else None)


def _ufunc_grads(grads, g, ops, out, need):
    gs = grads(g, ops, out, need)
    return tuple(_fit(gx, x) if n else None for gx, x, n in zip(gs, ops, need))


def _ufunc_rule(result, ufunc, method, *operands, **kwargs):
    if ufunc is np.matmul:
        a, b = D.implicit(operands)
        return record("matmul", result, (a, b), lambda g: _matmul_grads(g, a, b, result))
    grads = _UFUNCS.get(ufunc)
    if grads is None:
        return _no_rule(np.ufunc)(result, ufunc, method, *operands, **kwargs)
    ops = D.implicit(operands)
    need = tuple(type(x) is DTensor and x._requires_grad for x in ops)
    return record(ufunc.__name__, result, ops,
                  lambda g: _ufunc_grads(grads, g, ops, result, need))


def _recorded_ufunc(grads):
    """The backward of a ufunc's node made by the C dispatch (node.saved: the
    operands)."""
    def backward(g, node, out):
        need = tuple(x is not None for x in node.inputs)
        return _ufunc_grads(grads, g, node.saved, out, need)
    return backward


def _recorded_matmul(g, node, out):
    return _matmul_grads(g, *node.saved, out)


# -- matmul ----------------------------------------------------------------------------

def _swap(x):
    return np.swapaxes(x, -1, -2)


def _matmul_grads(g, a, b, out):
    """matmul's backward with NumPy's 1-D promotion and batch broadcasting."""
    a1 = a if a.ndim > 1 else a.reshape(1, a.shape[0])
    b1 = b if b.ndim > 1 else b.reshape(b.shape[0], 1)
    batch = out.shape[:out.ndim - (a.ndim > 1) - (b.ndim > 1)]
    g1 = g.reshape(batch + (a1.shape[-2], b1.shape[-1])) if (a.ndim == 1 or b.ndim == 1) else g
    ga = gb = None
    if a._requires_grad:
        ga = _fit(g1 @ _swap(b1), a1)
        ga = ga if a.ndim > 1 else ga.reshape(a.shape)
    if b._requires_grad:
        gb = _fit(_swap(a1) @ g1, b1)
        gb = gb if b.ndim > 1 else gb.reshape(b.shape)
    return ga, gb


def _dot_rule(result, a, b, out=None):
    if type(a) is not DTensor or type(b) is not DTensor or a.ndim > 2 or b.ndim > 2 \
            or a.ndim == 0 or b.ndim == 0:
        return _no_rule(np.dot)(result, a, b)
    return record("dot", result, (a, b), lambda g: _matmul_grads(g, a, b, result))


def _einsum_rule(result, subscripts, *operands, out=None, optimize=False, **kwargs):
    """Each operand's gradient is the einsum of the output's gradient with the other
    operands onto its subscripts; a subscript of its own alone (summed in the
    forward) is broadcast back."""
    ops = D.implicit(operands)
    ins, outs = subscripts.replace(" ", "").split("->")
    ins = ins.split(",")
    if any(len(set(s)) != len(s) for s in ins):  # a diagonal ('ii->i')
        return _no_rule(np.einsum)(result, subscripts, *operands)
    need = tuple(x._requires_grad for x in ops)

    def backward(g):
        grads = []
        for i, (s, x) in enumerate(zip(ins, ops)):
            if not need[i]:
                grads.append(None)
                continue
            others = [outs] + [t for j, t in enumerate(ins) if j != i]
            avail = set("".join(others))
            keep = "".join(c for c in s if c in avail)
            gx = np.einsum(",".join(others) + "->" + keep, g,
                           *(y for j, y in enumerate(ops) if j != i))
            if keep != s:
                gx = np.broadcast_to(gx.reshape(tuple(
                    n if c in avail else 1 for c, n in zip(s, x.shape))), x.shape)
            grads.append(gx if gx.dtype == x.dtype else gx.astype(x.dtype))
        return tuple(grads)
    return record("einsum", result, ops, backward)


# -- reductions ------------------------------------------------------------------------

def _reduced(a, axis):
    """(the reduced dims, their element count, the shape with them kept as 1)."""
    axes = tuple(range(a.ndim)) if axis is None else normalize_axis_tuple(axis, a.ndim)
    count = int(np.prod([a.shape[i] for i in axes], dtype=np.int64))
    return axes, count, tuple(1 if i in axes else n for i, n in enumerate(a.shape))


def _extremum_grads(g, a, result, axis):
    """max/min (amax/amin): the gradient shared evenly by the elements equal to the
    result, as torch's amax/amin."""
    axes, _, kept = _reduced(a, axis)
    hit = a == np.broadcast_to(result.reshape(kept), a.shape)
    share = g.reshape(kept) / hit.sum(axis=axes, keepdims=True)
    return (_fit(hit * share, a),)


def _moment_grads(g, a, result, axis, ddof, std):
    """var: 2 (a - mean) / (n - ddof) times the gradient; std: that over 2 std."""
    axes, count, kept = _reduced(a, axis)
    centered = a - np.mean(a, axis=axes, keepdims=True)
    g = g.reshape(kept)
    if std:
        g = g / result.reshape(kept)
    return (_fit(centered * (g * ((1.0 if std else 2.0) / (count - ddof))), a),)


def _reduction_grads(g, a, axis, keepdims, mean):
    """sum/mean: the gradient (over the count for mean) broadcast back."""
    _, count, kept = _reduced(a, axis)
    if mean:
        g = g / count
    if not keepdims:
        g = g.reshape(kept)
    g = np.broadcast_to(g, a.shape)
    return (g if g.dtype == a.dtype else g.astype(a.dtype),)


def _extremum_rule(name):
    def rule(result, a, axis=None, out=None, keepdims=False, **kwargs):
        return record(name, result, (a,), lambda g: _extremum_grads(g, a, result, axis))
    return rule


def _moment_rule(std):
    def rule(result, a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kwargs):
        return record("std" if std else "var", result, (a,),
                      lambda g: _moment_grads(g, a, result, axis, ddof, std))
    return rule


def _reduction_rule(mean):
    def rule(result, a, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        return record("mean" if mean else "sum", result, (a,),
                      lambda g: _reduction_grads(g, a, axis, keepdims, mean))
    return rule


# The backwards of the reductions' nodes made by the C dispatch: node.saved is
# (a,), node.aux (axis, keepdims) as the method was called (no dtype, no ddof).
_RECORDED_REDUCTIONS = {
    np.sum: ("sum", lambda g, node, out: _reduction_grads(g, *node.saved, *node.aux, False)),
    np.mean: ("mean", lambda g, node, out: _reduction_grads(g, *node.saved, *node.aux, True)),
    np.max: ("max", lambda g, node, out: _extremum_grads(g, *node.saved, out, node.aux[0])),
    np.min: ("min", lambda g, node, out: _extremum_grads(g, *node.saved, out, node.aux[0])),
    np.var: ("var", lambda g, node, out: _moment_grads(g, *node.saved, out, node.aux[0], 0,
                                                       False)),
    np.std: ("std", lambda g, node, out: _moment_grads(g, *node.saved, out, node.aux[0], 0,
                                                       True)),
}


# -- selection -------------------------------------------------------------------------

def _where_rule(result, condition, x=None, y=None):
    ops = D.implicit((condition, x, y))
    cond, x, y = ops
    need = tuple(type(v) is DTensor and v._requires_grad for v in ops)

    def backward(g):
        zero = np.zeros((), g.dtype)
        gx = _fit(np.where(cond, g, zero), x) if need[1] else None
        gy = _fit(np.where(cond, zero, g), y) if need[2] else None
        return None, gx, gy
    return record("where", result, ops, backward)


def _clip_rule(result, a, a_min=np._NoValue, a_max=np._NoValue, out=None, *,
               min=np._NoValue, max=np._NoValue, **kwargs):
    """The gradient where ``a`` lies within the (scalar) bounds, as torch's clamp."""
    lo = a_min if a_min is not np._NoValue else (None if min is np._NoValue else min)
    hi = a_max if a_max is not np._NoValue else (None if max is np._NoValue else max)

    def backward(g):
        inside = None
        for bound, keep in ((lo, np.greater_equal), (hi, np.less_equal)):
            if bound is not None:
                m = keep(a, bound)
                inside = m if inside is None else inside & m
        return (_fit(g if inside is None else g * inside, a),)
    return record("clip", result, (a,), backward)


def _concatenate_rule(result, arrays, axis=0, out=None, **kwargs):
    arrays = tuple(D.implicit(arrays))
    ax = axis % arrays[0].ndim
    return record("concatenate", result, arrays,
                  lambda g: _pieces(g, arrays, ax, lambda x, lo: slice(lo, lo + x.shape[ax])))


def _stack_rule(result, arrays, axis=0, out=None, **kwargs):
    arrays = tuple(D.implicit(arrays))
    ax = axis % (arrays[0].ndim + 1)
    return record("stack", result, arrays,
                  lambda g: _pieces(g, arrays, ax, lambda x, lo: lo, step=1))


def _pieces(g, arrays, ax, index, step=None):
    """Each input's part of the output's gradient along ``ax`` (basic indexing)."""
    grads, lo = [], 0
    for x in arrays:
        if type(x) is DTensor and x._requires_grad:
            gx = g[(slice(None),) * ax + (index(x, lo),)]
            grads.append(gx if gx.dtype == x.dtype else gx.astype(x.dtype))
        else:
            grads.append(None)
        lo += step if step is not None else x.shape[ax]
    return tuple(grads)


def _getitem_rule(result, a, key):
    """Basic indexing's backward: the gradient reshaped to the picked box (ints and
    None are size-1 dims) and padded with zeros to ``a``'s shape by concatenation,
    dim by dim. A slice with a step other than 1 has no rule yet."""
    if _stepped(key):
        sel, _ = _parse(key, a.shape)
        if any(count > 1 and step != 1 for _, step, count, _ in sel):
            return _no_rule(operator.getitem)(result, a, key)
    return record("getitem", result, (a,), lambda g: _getitem_grads(g, a, key))


def _stepped(key) -> bool:
    """Whether a slice of ``key`` has a step other than 1 (the key is parsed in
    backward, or here only then)."""
    for k in key if type(key) is tuple else (key,):
        if type(k) is slice and k.step is not None and k.step != 1:
            return True
    return False


def _getitem_grads(g, a, key):
    sel, _ = _parse(key, a.shape)
    g = g.reshape(tuple(count for _, _, count, _ in sel))
    for d, (start, _, count, _) in enumerate(sel):
        if count == a.shape[d]:
            continue
        parts = [g]
        if start:
            parts.insert(0, _zeros_like_along(g, d, start))
        if a.shape[d] - start - count:
            parts.append(_zeros_like_along(g, d, a.shape[d] - start - count))
        g = np.concatenate(parts, axis=d)
    return (g if g.dtype == a.dtype else g.astype(a.dtype),)


def _zeros_like_along(g, d, n):
    """Zeros of ``g``'s shape but ``n`` along dim ``d``, laid out as ``g`` except
    that dim (Replicate there): concatenating them with ``g`` moves only what the
    concatenation itself must. Zeros are valid parts of a Partial. Local."""
    shape = g.shape[:d] + (n,) + g.shape[d + 1:]
    mesh = g.device_mesh
    pl = tuple(Replicate() if p.is_shard() and p.dim % g.ndim == d else p
               for p in g.placements)
    if mesh.get_coordinate() is None:
        local = np.empty((0,), g.dtype)
    else:
        local = np.zeros(compute_local_shape_and_global_offset(shape, mesh, pl)[0], g.dtype)
    return DTensor.from_local(local, mesh, pl, shape=shape, stride=contiguous_strides(shape))


# -- shape -----------------------------------------------------------------------------

def _transpose_rule(result, a, axes=None):
    return record("transpose", result, (a,), lambda g: (_transpose_grad(g, a, axes),))


def _transpose_grad(g, a, axes):
    perm = tuple(range(a.ndim))[::-1] if axes is None else normalize_axis_tuple(axes, a.ndim)
    return np.transpose(g, tuple(int(i) for i in np.argsort(perm)))


def _swapaxes_rule(result, a, axis1, axis2):
    return record("swapaxes", result, (a,), lambda g: (np.swapaxes(g, axis1, axis2),))


def _moveaxis_rule(result, a, source, destination):
    return record("moveaxis", result, (a,), lambda g: (np.moveaxis(g, destination, source),))


def _reshape_like(name):
    def rule(result, a, *args, **kwargs):
        order = kwargs.get("order", args[1] if name == "reshape" and len(args) > 1 else
                           args[0] if name == "ravel" and args else "C")
        if order not in ("C", "A"):
            return _no_rule(name)(result, a, *args, **kwargs)
        return record(name, result, (a,), lambda g: (g.reshape(a.shape),))
    return rule


def _broadcast_to_rule(result, array, shape, subok=False):
    return record("broadcast_to", result, (array,), lambda g: (_fit(g, array),))


def _copy_rule(result, a, *args, **kwargs):
    return record("copy", result, (a,), lambda g: (g,))


def _astype_rule(result, a, dtype, copy=True):
    return record("astype", result, (a,),
                  lambda g: (g if g.dtype == a.dtype else g.astype(a.dtype),))


_RULES = {
    np.ufunc: _ufunc_rule,
    np.dot: _dot_rule,
    np.einsum: _einsum_rule,
    np.where: _where_rule,
    np.concatenate: _concatenate_rule,
    np.stack: _stack_rule,
    operator.getitem: _getitem_rule,
    np.sum: _reduction_rule(False),
    np.mean: _reduction_rule(True),
    np.max: _extremum_rule("max"),
    np.amax: _extremum_rule("amax"),
    np.min: _extremum_rule("min"),
    np.amin: _extremum_rule("amin"),
    np.clip: _clip_rule,
    np.var: _moment_rule(False),
    np.std: _moment_rule(True),
    np.transpose: _transpose_rule,
    np.swapaxes: _swapaxes_rule,
    np.moveaxis: _moveaxis_rule,
    np.squeeze: _reshape_like("squeeze"),
    np.expand_dims: _reshape_like("expand_dims"),
    np.reshape: _reshape_like("reshape"),
    np.ravel: _reshape_like("ravel"),
    np.broadcast_to: _broadcast_to_rule,
    np.copy: _copy_rule,
    np.ndarray.astype: _astype_rule,
}


def install() -> None:
    """Wraps every registered operation once: with its rule, or with the check that
    refuses to drop a gradient; and gives the C dispatch the backwards of the ufuncs
    and reduction methods it records itself. Local (at import)."""
    for func in list(_registry.functions):
        _differentiable(func, _RULES.get(func) or _no_rule(func))
    for ufunc, grads in _UFUNCS.items():
        _C.register_grad(ufunc, ufunc.__name__, _recorded_ufunc(grads))
    _C.register_grad(np.matmul, "matmul", _recorded_matmul)
    for func, (name, backward) in _RECORDED_REDUCTIONS.items():
        _C.register_grad(func, name, backward)
