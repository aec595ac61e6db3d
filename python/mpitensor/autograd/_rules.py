"""Backward rules of the operations on DTensors.

Each rule is registered once, at import, by ``_engine.register_backward`` (as the
rules in ``_fft_rules``, ``_order_rules`` and ``_shape_rules``): the ufuncs and
reduction methods the executor runs itself with ``operands=True`` (their node's
``saved`` holds the operands, ``aux`` a reduction's ``(axis, keepdims)``), the
registered NumPy functions without (``saved`` holds the positional arguments as
called, ``aux`` the keywords).

A rule is ``backward(grad, node, output)``, as the engine calls every node's. It computes the gradients with DTensor
operations, so they run through the same executor as the forward: their
placements come from the same decisions and are priced the same way. A gradient
is computed only for the operands that need one; broadcast dims are summed away
(a Partial(sum) where they are sharded). An operation with no rule raises
NotImplementedError when it would record a floating-point result, rather than
drop the gradient; one that writes in place raises in grad mode.
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from .. import _C, _modes
from . import _engine
from ._engine import register_backward
from .._dtensor import DTensor, _grad_placements, _redistribute_grad
from .._dtensor_spec import contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from .._algorithms._advanced_index import is_advanced, mask_grad, one_array, take_grad
from .._ops._diag import diag_into
from .._ops._indexing import _parse
from .._ops._linalg import tensordot_subscripts
from .._ops._select import clip_bounds
from .._ops._split import split_bounds
from .._ops._strided import restride
from ..placement_types import Replicate, Shard

__all__: list = []


# -- helpers ---------------------------------------------------------------------------

def sum_to(g, shape):
    """``g`` (a DTensor or an ndarray) summed over the dims that broadcasting
    ``shape`` to it added: the gradient of an operand of that shape, for every
    backward that broadcasts.

    Example: ``sum_to(g, (1, 4))`` of a (3, 4) ``g`` is ``g.sum(0, keepdims=True)``.
    """
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, g.shape)) if n == 1 and m != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _fit(gx, x):
    """A gradient for operand ``x``: broadcast dims summed away, ``x``'s dtype."""
    gx = sum_to(gx, x.shape)
    return gx if gx.dtype == x.dtype else gx.astype(x.dtype)


def _need(x) -> bool:
    return type(x) is DTensor and x._requires_grad


def _dtensors(operands, like: DTensor) -> tuple:
    """The operands with plain ndarrays (mixed in under implicit replication) as
    the Replicate DTensors on ``like``'s mesh the forward took them as (the
    executor's, ``_C.implicit``)."""
    return _C.implicit(tuple(operands), like)


def _bind(node, names, **defaults) -> dict:
    """A registered function's arguments by parameter name (``keepdim`` is torch's
    ``keepdims``)."""
    bound = dict(defaults)
    bound.update(zip(names, node.saved))
    kwargs = node.aux or {}
    bound.update(kwargs)
    if "keepdim" in kwargs:
        bound["keepdims"] = kwargs["keepdim"]
    return bound


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


def _select_grads(g, ops, need, greater):
    mask = _maximum_mask(ops[0], ops[1], greater)
    return (g * mask if need[0] else None, g * (1 - mask) if need[1] else None)


def _joint(grads):
    """Marks ``grads`` as computing both gradients from one intermediate."""
    grads.joint = True
    return grads


def _maximum_grads(g, ops, out, need):
    return _select_grads(g, ops, need, True)


def _minimum_grads(g, ops, out, need):
    return _select_grads(g, ops, need, False)


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
    np.reciprocal: lambda g, ops, out, need: (-(g * (out * out)),),
    np.sin: lambda g, ops, out, need: (g * np.cos(ops[0]),),
    np.cos: lambda g, ops, out, need: (-(g * np.sin(ops[0])),),
    np.conjugate: lambda g, ops, out, need: (np.conjugate(g),),
    np.maximum: _joint(_maximum_grads),
    np.minimum: _joint(_minimum_grads),
    np.power: _power,
}


def _headed(x):
    """Where the gradient of input ``x`` is taken next: ``x`` itself, or, through
    the redistributes that made it, the DTensor they moved (a redistribute's
    backward moves the gradient straight on to its source's placements). None
    past a redistribute with a ``backward_dtype``: its backward moves the
    gradient in that dtype, cheaper than the backward rule could. The walk stops
    at a tensor other gradients reach too (``y`` of ``y * y``): they are summed
    there and the sum moves on once, rather than each moving on its own."""
    if type(x) is DTensor and x.grad_fn is None:
        return None
    while type(x) is DTensor:
        if _engine.gathers(x):
            break
        node = x.grad_fn
        if node is None or node.name != "Redistribute" or type(node.inputs[0]) is not DTensor:
            break
        if node.aux and node.aux[0] is not None:
            return None
        x = node.inputs[0]
    return x if type(x) is DTensor else None


def _toward(x, compute):
    """``compute()`` with its operations decided knowing their output goes to the
    placements of input ``x``'s gradient next (:func:`_headed`)."""
    was = _modes.set_want(_headed(x))
    try:
        return compute()
    finally:
        _modes.set_want(was)


def _ufunc_grads(grads, g, ops, out, need, inputs=None):
    """Each wanted operand's gradient, made where it goes next: the operations of
    operand i's gradient are decided knowing their output moves to ``inputs[i]``'s
    placements (its input as recorded; the operand itself by default)."""
    if getattr(grads, "joint", False):  # one mask serves both gradients
        gs = grads(g, ops, out, need)
        return tuple(_fit(gx, x) if n else None for gx, x, n in zip(gs, ops, need))
    targets = inputs if inputs is not None else ops
    res = []
    for i, (x, n) in enumerate(zip(ops, need)):
        if not n:
            res.append(None)
            continue
        only = tuple(j == i for j in range(len(need)))
        gx = _toward(targets[i], lambda: grads(g, ops, out, only)[i])
        res.append(_fit(gx, x))
    return tuple(res)


def _recorded_ufunc(grads):
    """The backward of a ufunc's node (node.saved: the operands)."""
    def backward(g, node, out):
        need = tuple(x is not None for x in node.inputs)
        return _ufunc_grads(grads, g, node.saved, out, need, node.inputs)
    return backward


def _recorded_matmul(g, node, out):
    need = tuple(x is not None for x in node.inputs)
    return _matmul_grads(g, *node.saved, out, need, node.inputs)


def _ufunc_entry(g, node, out):
    """A ufunc called through its Python entry (a user's rule for it): saved is
    (ufunc, method, *operands)."""
    ufunc, _, *ops = node.saved
    ops = _dtensors(ops, out)
    need = tuple(_need(x) for x in ops)
    if ufunc is np.matmul:
        return (None, None) + _matmul_grads(g, *ops, out)
    return (None, None) + _ufunc_grads(_UFUNCS[ufunc], g, ops, out, need)


def _ufunc_supported(args, kwargs) -> bool:
    return args[1] == "__call__" and (args[0] is np.matmul or args[0] in _UFUNCS)


# -- matmul ----------------------------------------------------------------------------

def _swap(x):
    return np.swapaxes(x, -1, -2)


def _matmul_grads(g, a, b, out, need=None, targets=None):
    """matmul's backward with NumPy's 1-D promotion and batch broadcasting; ``need``
    says which operands want a gradient (default: those that require grad)."""
    need = need or (_need(a), _need(b))
    a1 = a if a.ndim > 1 else a.reshape(1, a.shape[0])
    b1 = b if b.ndim > 1 else b.reshape(b.shape[0], 1)
    batch = out.shape[:out.ndim - (a.ndim > 1) - (b.ndim > 1)]
    g1 = g.reshape(batch + (a1.shape[-2], b1.shape[-1])) if (a.ndim == 1 or b.ndim == 1) else g
    ga = gb = None
    if need[0]:
        bt = _swap(b1)  # outside: only the product is made where a's gradient goes
        ga = _fit(_toward(a if targets is None else targets[0], lambda: g1 @ bt), a1)
        ga = ga if a.ndim > 1 else ga.reshape(a.shape)
    if need[1]:
        at = _swap(a1)
        gb = _fit(_toward(b if targets is None else targets[1], lambda: at @ g1), b1)
        gb = gb if b.ndim > 1 else gb.reshape(b.shape)
    return ga, gb


def _dot(g, node, out):
    return _matmul_grads(g, *node.saved[:2], out)


def _dot_supported(args, kwargs) -> bool:
    a, b = args[0], args[1]
    return type(a) is DTensor and type(b) is DTensor and 0 < a.ndim <= 2 and 0 < b.ndim <= 2


def _einsum_split(subscripts):
    ins, outs = subscripts.replace(" ", "").split("->")
    return ins.split(","), outs


def _einsum_supported(args, kwargs) -> bool:
    """Explicit subscripts without a repeated letter in an operand (a diagonal)."""
    sub = args[0]
    if not isinstance(sub, str) or "->" not in sub:
        return False
    ins, _ = _einsum_split(sub)
    return all(len(set(s)) == len(s) for s in ins)


def _einsum(g, node, out):
    return (None,) + _einsum_grads(g, node.saved[0], _dtensors(node.saved[1:], out),
                                   node.inputs[1:])


def _einsum_grads(g, subscripts, ops, targets):
    """Each operand's gradient is the einsum of the output's gradient with the other
    operands onto its subscripts; a subscript of its own alone (summed in the
    forward) is broadcast back. One gradient (or None) per operand, each made where
    it goes next: decided knowing it moves to ``targets[i]``'s placements (the
    operand's input as recorded), as matmul's."""
    ins, outs = _einsum_split(subscripts)
    grads = []
    for i, (s, x) in enumerate(zip(ins, ops)):
        if not _need(x):
            grads.append(None)
            continue
        others = [outs] + [t for j, t in enumerate(ins) if j != i]
        avail = set("".join(others))
        keep = "".join(c for c in s if c in avail)
        rest = [y for j, y in enumerate(ops) if j != i]
        gx = _toward(targets[i],
                     lambda: np.einsum(",".join(others) + "->" + keep, g, *rest))
        if keep != s:
            gx = np.broadcast_to(gx.reshape(tuple(
                n if c in avail else 1 for c, n in zip(s, x.shape))), x.shape)
        grads.append(gx if gx.dtype == x.dtype else gx.astype(x.dtype))
    return tuple(grads)


# tensordot, inner and outer run as the einsum their subscripts spell (_linalg), so
# their backward is that einsum's: the same subscripts, rebuilt from the call.

def _tensordot(g, node, out):
    b = _bind(node, ("a", "b", "axes"), axes=2)
    a, y = b["a"], b["b"]
    return _einsum_grads(g, tensordot_subscripts("numpy.tensordot", a, y, b["axes"]), (a, y),
                         node.inputs[:2])


def _inner(g, node, out):
    a, b = node.saved[:2]
    return _einsum_grads(g, tensordot_subscripts("numpy.inner", a, b, ((-1,), (-1,))),
                         (a, b), node.inputs[:2])


def _outer(g, node, out):
    return _einsum_grads(g, "i,j->ij", node.saved[:2], node.inputs[:2])


# -- reductions ------------------------------------------------------------------------

def _reduced(a, axis):
    """(the reduced dims, their element count, the shape with them kept as 1)."""
    axes = tuple(range(a.ndim)) if axis is None else normalize_axis_tuple(axis, a.ndim)
    count = int(np.prod([a.shape[i] for i in axes], dtype=np.int64))
    return axes, count, tuple(1 if i in axes else n for i, n in enumerate(a.shape))


def _extremum_grads(g, a, result, axis, pick):
    """max/min (amax/amin, ``pick``): the gradient shared evenly by the elements
    equal to the result, as torch's amax/amin. A Partial ``a`` is summed here once
    and ``pick`` taken again from that sum: the comparison would sum the parts by
    another plan than the forward's, in another order, and the forward's result
    could then equal none of the lane's elements (a gradient of inf and NaN)."""
    axes, _, kept = _reduced(a, axis)
    if any(p.is_partial() for p in a.placements):
        a = a.redistribute(a.device_mesh, [Replicate() if p.is_partial() else p
                                           for p in a.placements])
        result = pick(a, axis=axes)
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


def _prod_grads(g, a, axis, keepdims):
    """prod: each element's gradient is the product of the other elements of its
    lane, exact where the lane holds zeros, as torch's prod backward: the lane's
    product of its nonzero elements, over the element itself where the lane has no
    zero, as it is at the lane's only zero, and 0 where the product of the others
    includes a zero. No division by zero, and no cumulative products along a
    possibly sharded axis: one product and one count per lane, each reduced once
    (in the reduced shape, before they meet ``a``'s)."""
    axes, _, kept = _reduced(a, axis)
    zero = a == 0
    nonzero = np.where(zero, np.ones((), a.dtype), a)
    # All the rule needs of the count is none, one or more: capped, it is reduced
    # once and then used twice.
    zeros = np.minimum(np.sum(zero, axis=axes), 2)
    product = np.prod(nonzero, axis=axes) * (zeros <= 1)
    at_zero = product.reshape(kept)
    elsewhere = (product * (zeros == 0)).reshape(kept) / nonzero
    return (_fit(g.reshape(kept) * np.where(zero, at_zero, elsewhere), a),)


# Reduction methods as the executor records them: saved (a,), aux (axis, keepdims).
_METHODS = {
    np.sum: ("sum", lambda g, node, out: _reduction_grads(g, *node.saved, *node.aux, False)),
    np.mean: ("mean", lambda g, node, out: _reduction_grads(g, *node.saved, *node.aux, True)),
    np.prod: ("prod", lambda g, node, out: _prod_grads(g, *node.saved, *node.aux)),
    np.max: ("max", lambda g, node, out: _extremum_grads(g, *node.saved, out, node.aux[0],
                                                         np.max)),
    np.min: ("min", lambda g, node, out: _extremum_grads(g, *node.saved, out, node.aux[0],
                                                         np.min)),
    np.var: ("var", lambda g, node, out: _moment_grads(g, *node.saved, out, node.aux[0], 0,
                                                       False)),
    np.std: ("std", lambda g, node, out: _moment_grads(g, *node.saved, out, node.aux[0], 0,
                                                       True)),
}

_SUM_ARGS = ("a", "axis", "dtype", "out", "keepdims")
_EXTREMUM_ARGS = ("a", "axis", "out", "keepdims")
_MOMENT_ARGS = ("a", "axis", "dtype", "out", "ddof", "keepdims")


def _sum_function(mean):
    def backward(g, node, out):
        b = _bind(node, _SUM_ARGS, axis=None, keepdims=False)
        return _reduction_grads(g, b["a"], b["axis"], bool(b["keepdims"]), mean)
    return backward


def _prod_function(g, node, out):
    b = _bind(node, _SUM_ARGS, axis=None, keepdims=False)
    return _prod_grads(g, b["a"], b["axis"], bool(b["keepdims"]))


def _extremum_function(pick):
    def backward(g, node, out):
        b = _bind(node, _EXTREMUM_ARGS, axis=None)
        return _extremum_grads(g, b["a"], out, b["axis"], pick)
    return backward


def _moment_function(std):
    def backward(g, node, out):
        b = _bind(node, _MOMENT_ARGS, axis=None, ddof=0)
        return _moment_grads(g, b["a"], out, b["axis"], b["ddof"], std)
    return backward


# -- selection -------------------------------------------------------------------------

def _where(g, node, out):
    cond, x, y = _dtensors(node.saved, out)
    zero = np.zeros((), g.dtype)
    gx = _fit(np.where(cond, g, zero), x) if _need(x) else None
    gy = _fit(np.where(cond, zero, g), y) if _need(y) else None
    return None, gx, gy


def _clip(g, node, out):
    """torch.clamp's gradients: ``a``'s where it lies within its bounds; a lower
    bound's where ``a`` is below it and it is below the upper bound; an upper
    bound's where ``a`` is above it, or it is below the lower bound (which it then
    wins). A bound given by keyword is no input of the node (the executor refuses
    one that requires grad)."""
    b = _bind(node, ("a", "a_min", "a_max"), a_min=np._NoValue, a_max=np._NoValue,
              min=np._NoValue, max=np._NoValue)
    a, lo, hi = _dtensors((b["a"],) + clip_bounds(b["a_min"], b["a_max"], b["min"],
                                                   b["max"]), out)
    zero = np.zeros((), g.dtype)

    def masked(mask, x):
        return _fit(np.where(mask, g, zero), x)

    inside = None
    for bound, keep in ((lo, np.greater_equal), (hi, np.less_equal)):
        if bound is not None:
            m = keep(a, bound)
            inside = m if inside is None else inside & m
    ga = None
    if _need(a):
        ga = _fit(g, a) if inside is None else masked(inside, a)
    glo = masked(a < lo if hi is None else (a < lo) & (lo < hi), lo) if _need(lo) else None
    ghi = masked(a > hi if lo is None else (a > hi) | (hi < lo), hi) if _need(hi) else None
    return (ga, glo, ghi)[:len(node.saved)]


def _concatenate(g, node, out):
    arrays = _dtensors(node.saved[0], out)
    ax = _bind(node, ("arrays", "axis"), axis=0)["axis"] % arrays[0].ndim
    return _pieces(g, arrays, ax, lambda x, lo: slice(lo, lo + x.shape[ax]))


def _stack(g, node, out):
    arrays = _dtensors(node.saved[0], out)
    ax = _bind(node, ("arrays", "axis"), axis=0)["axis"] % (arrays[0].ndim + 1)
    return _pieces(g, arrays, ax, lambda x, lo: lo, step=1)


def _pieces(g, arrays, ax, index, step=None):
    """Each input's part of the output's gradient along ``ax`` (basic indexing)."""
    grads, lo = [], 0
    for x in arrays:
        if _need(x):
            gx = g[(slice(None),) * ax + (index(x, lo),)]
            grads.append(gx if gx.dtype == x.dtype else gx.astype(x.dtype))
        else:
            grads.append(None)
        lo += step if step is not None else x.shape[ax]
    return tuple(grads)


def _getitem(g, node, out):
    """Indexing's backward: zeros of ``a``'s shape with the gradient at the picked
    elements. Slices of step 1 pad it (below); a stepped slice scatters it
    (``_scattered``); an integer array adds its rows in (a repeated index sums) and
    a boolean mask writes them, each undoing the forward's exchange. An integer
    array among slices undoes the forward's two steps: the rest of the key's
    gradient, then the rows added in along the array's dim."""
    a, key = node.saved
    one = one_array(key, a.ndim)
    if one is not None:
        dim, idx, rest, front = one
        if front is not None:
            g = np.moveaxis(g, 0, front)
        idx = np.asarray(idx, np.intp)
        shape = a.shape[:dim] + (idx.size,) + a.shape[dim + 1:]  # np.take's result
        n = a.shape[dim]
        return (_fit(_picked(_basic_grad(g, a, rest, shape), a, idx % n if n else idx,
                             dim), a),)
    if type(key) is DTensor and key.dtype.kind in "iu":
        # rows picked by an integer DTensor (_pick.py): added back where they came
        # from, the indices gathered (the gradient's rows go to their owners)
        n = a.shape[0]
        idx = np.asarray(key.full_tensor(), np.intp).reshape(-1)
        gx = take_grad(g.reshape((idx.size,) + a.shape[1:]), a, np.where(idx < 0, idx + n, idx))
        return (gx if gx.dtype == a.dtype else gx.astype(a.dtype),)
    kind = is_advanced(key)
    if kind is not None:
        gx = (take_grad if kind == "take" else mask_grad)(g, a, key)
        return (gx if gx.dtype == a.dtype else gx.astype(a.dtype),)
    return (_basic_grad(g, a, key, a.shape),)


def _basic_grad(g, a, key, shape):
    """The gradient of ``x[key]`` for a basic key and an ``x`` of ``shape`` laid out
    as ``a`` is (of its ndim, on its mesh), in ``a``'s dtype."""
    sel, outdims = _parse(key, shape)
    if any(count > 1 and step != 1 for _, step, count, _ in sel):
        return _scattered(g, a, key, outdims, shape)
    return _padded(g, a, sel, shape)


def _padded(g, a, sel, shape):
    """The gradient reshaped to the picked box (ints and None are size-1 dims) and
    padded with zeros to ``shape`` by concatenation, dim by dim."""
    g = g.reshape(tuple(count for _, _, count, _ in sel))
    for d, (start, _, count, _) in enumerate(sel):
        g = _pad_along(g, d, start, shape[d] - start - count)
    return g if g.dtype == a.dtype else g.astype(a.dtype)


def _picked(g: DTensor, a: DTensor, idx, axis) -> DTensor:
    """The gradient of ``np.take(a, idx, axis)`` for ``a`` (``idx`` an integer
    array in range; ``axis`` None: of the flattened ``a``): each element of ``g``
    added back where it was picked from, a repeated index adding up."""
    idx = np.asarray(idx, np.intp).reshape(-1)
    if axis is None:
        flat = a.reshape(-1)
        if any(type(p) not in (Shard, Replicate) for p in flat.placements):
            # a flattened inner shard is strided, which the rows' exchange does
            # not take: the gradient is made whole and laid out as ``a`` after
            flat = _zeros(flat.shape, a.dtype, a.device_mesh, (Replicate(),) * a.device_mesh.ndim)
        return take_grad(g.reshape(-1), flat, idx).reshape(a.shape)
    ax = normalize_axis_index(axis, a.ndim)
    g = g.reshape(a.shape[:ax] + (idx.size,) + a.shape[ax + 1:])
    gx = take_grad(np.moveaxis(g, ax, 0), np.moveaxis(a, ax, 0), idx)
    return np.moveaxis(gx, 0, ax)


def _scattered(g, a, key, outdims, shape):
    """A stepped slice's gradient: ``g`` written with the key into zeros of
    ``shape`` (DTensor item assignment, NumPy's semantics for any step), which
    moves ``g`` only where the zeros' layout needs it. Per mesh dim the zeros take
    ``g``'s Partial(sum), which the write keeps as it is (as the padding's zeros
    keep it); else ``g``'s Shard of a dim ``a`` has, whose rows go to the ranks
    that hold them; else ``a``'s own Shard, where each rank writes its rows of a
    replicated ``g`` without communication; else Replicate."""
    dims = [o[1] if o[0] == "in" else None for o in outdims]
    pl = []
    for gp, ap in zip(g.placements, a.placements):
        if gp.is_partial("sum"):
            pl.append(gp)
        elif gp.is_shard() and dims[gp.dim % g.ndim] is not None:
            pl.append(Shard(dims[gp.dim % g.ndim]))
        elif ap.is_shard():
            pl.append(Shard(ap.dim % a.ndim))
        else:
            pl.append(Replicate())
    gx = _zeros(shape, a.dtype, a.device_mesh, tuple(pl))
    gx[key] = g
    return gx


def _pad_along(g, d, before, after):
    """``g`` with ``before`` zeros ahead of it and ``after`` zeros behind it along
    dim ``d``, by one concatenation (``g`` itself when both are 0)."""
    if not before and not after:
        return g
    parts = [g]
    if before:
        parts.insert(0, _zeros_like_along(g, d, before))
    if after:
        parts.append(_zeros_like_along(g, d, after))
    return np.concatenate(parts, axis=d)


def _split(g, node, out):
    """np.split and np.array_split: one node per piece (node.aux: (kwargs, the
    piece's index)); its gradient is the input's shape, zeros outside the piece."""
    kwargs, i = node.aux
    b = dict(zip(("ary", "indices_or_sections", "axis"), node.saved))
    b.update(kwargs or {})
    a = b["ary"]
    ax = normalize_axis_index(operator.index(b.get("axis", 0)), a.ndim)
    lo, hi = split_bounds("numpy.split", a.shape[ax], b["indices_or_sections"], False)[i]
    g = _pad_along(g, ax, lo, a.shape[ax] - hi)
    return (g if g.dtype == a.dtype else g.astype(a.dtype),)


def _diag(g, node, out):
    """np.diag is linear: the diagonal of the gradient for a 1-D input, the
    gradient placed on the diagonal of zeros of the input's shape for a 2-D one."""
    b = _bind(node, ("v", "k"), k=0)
    v, k = b["v"], operator.index(b["k"])
    gv = np.diag(g, k) if v.ndim == 1 else diag_into(g, k, v.shape)
    return (gv if gv.dtype == v.dtype else gv.astype(v.dtype),)


def _zeros_like_along(g, d, n):
    """Zeros of ``g``'s shape but ``n`` along dim ``d``, laid out as ``g`` except
    that dim (Replicate there): concatenating them with ``g`` moves only what the
    concatenation itself must. Zeros are valid parts of a Partial. Local."""
    shape = g.shape[:d] + (n,) + g.shape[d + 1:]
    pl = tuple(Replicate() if p.is_shard() and p.dim % g.ndim == d else p
               for p in g.placements)
    return _zeros(shape, g.dtype, g.device_mesh, pl)


def _zeros(shape, dtype, mesh, pl):
    """A DTensor of zeros laid out by ``pl``; each rank allocates its part. Local."""
    if mesh.get_coordinate() is None:
        local = np.empty((0,), dtype)
    else:
        local = np.zeros(compute_local_shape_and_global_offset(shape, mesh, pl)[0], dtype)
    return DTensor.from_local(local, mesh, pl, shape=shape, stride=contiguous_strides(shape))


# -- shape -----------------------------------------------------------------------------

def _transpose(g, node, out):
    a = node.saved[0]
    axes = _bind(node, ("a", "axes"), axes=None)["axes"]
    perm = tuple(range(a.ndim))[::-1] if axes is None else normalize_axis_tuple(axes, a.ndim)
    return (np.transpose(g, tuple(int(i) for i in np.argsort(perm))),)


def _swapaxes(g, node, out):
    _, axis1, axis2 = node.saved
    return (np.swapaxes(g, axis1, axis2),)


def _moveaxis(g, node, out):
    b = _bind(node, ("a", "source", "destination"))
    return (np.moveaxis(g, b["destination"], b["source"]),)


def _reshape_back(g, node, out):
    return (g.reshape(node.saved[0].shape),)


def _restride_back(g, node, out):
    """A strided view's backward: the gradient laid out as the view's output (a
    Partial's: Replicate), then read back as the input's layout. No communication
    when the gradient comes in the output's placements."""
    a = node.saved[0]
    mesh = a._spec.mesh
    shape, placements = node.aux["layout"]
    want = _grad_placements(placements)
    if g._spec.placements != want:
        g = g.redistribute(mesh, want)
    return (restride(g, a._spec.shape, _grad_placements(a._spec.placements)),)


def _order_c(position):
    """Whether a reshape-like call's ``order`` (positional at ``position``) is C."""
    def supported(args, kwargs) -> bool:
        order = kwargs.get("order", args[position] if len(args) > position else "C")
        return order in ("C", "A")
    return supported


def _broadcast_to(g, node, out):
    return (_fit(g, node.saved[0]),)


def _tile(g, node, out):
    """Each copy's part of the gradient summed: the gradient split into (copies,
    length) pairs of dims and summed over the copies."""
    a = node.saved[0]
    reps = _bind(node, ("A", "reps"))["reps"]
    reps = tuple(reps) if np.ndim(reps) else (reps,)
    n = max(a.ndim, len(reps))
    reps = (1,) * (n - len(reps)) + tuple(int(r) for r in reps)
    shape = (1,) * (n - a.ndim) + a.shape
    pairs = tuple(x for r, s in zip(reps, shape) for x in (r, s))
    summed = np.sum(g.reshape(pairs), axis=tuple(range(0, 2 * n, 2)))
    return (summed.reshape(a.shape),)


def _flip(g, node, out):
    b = _bind(node, ("m", "axis"), axis=None)
    return (np.flip(g, b["axis"]),)


def _roll(g, node, out):
    """The gradient rolled back: by minus each shift, along the same axes."""
    b = _bind(node, ("a", "shift", "axis"), axis=None)
    shift = b["shift"]
    back = tuple(-int(s) for s in shift) if np.ndim(shift) else -int(shift)
    return (np.roll(g, back, b["axis"]),)


def _cumsum(g, node, out):
    """Each element's gradient is the sum of the output gradient from it to the
    end: a cumulative sum of the flipped gradient, flipped back (over the
    flattened input when ``axis`` is None)."""
    b = _bind(node, ("a", "axis"), axis=None)
    a = b["a"]
    if b["axis"] is None:
        g, ax = g.reshape(-1), 0
    else:
        ax = normalize_axis_index(operator.index(b["axis"]), a.ndim)
    gx = np.flip(np.cumsum(np.flip(g, ax), axis=ax), ax)
    return (_fit(gx.reshape(a.shape), a),)


def _cumprod(g, node, out):
    """torch's cumprod backward, exact where a lane holds zeros. Before a lane's
    first zero, an element's gradient is the reversed cumulative sum of ``g *
    out`` over it; at the first zero, that of ``g`` times the cumulative product
    with the zero taken as one (the products of the others); after it, zero (each
    product it is in holds the first zero too). Over the flattened input when
    ``axis`` is None."""
    b = _bind(node, ("a", "axis", "dtype"), axis=None)
    a = b["a"]
    x = a.reshape(-1) if b["axis"] is None else a
    ax = 0 if b["axis"] is None else normalize_axis_index(operator.index(b["axis"]), a.ndim)
    if b["axis"] is None:
        g = g.reshape(-1)
    out = out.reshape(x.shape)

    def rsum(v):
        return np.flip(np.cumsum(np.flip(v, ax), axis=ax), ax)

    zero = x == 0
    seen = np.cumsum(zero, axis=ax)
    one = np.ones((), x.dtype)
    before = seen == 0
    first = zero & (seen == 1)
    gx = np.where(before, rsum(g * out) / np.where(zero, one, x), np.zeros((), g.dtype))
    gx = gx + first * rsum(g * np.cumprod(np.where(first, one, x), axis=ax))
    return (_fit(gx.reshape(a.shape), a),)


def _diff(g, node, out):
    """np.diff of order n is n first differences; the gradient of one,
    ``y[i] = x[i + 1] - x[i]``, is ``g`` shifted one place up minus ``g``, each
    padded with a zero. A prepended or appended scalar (all the forward takes on
    DTensors) has no gradient: its place is cut away."""
    b = _bind(node, ("a", "n", "axis", "prepend", "append"), n=1, axis=-1,
              prepend=np._NoValue, append=np._NoValue)
    a = b["a"]
    ax = normalize_axis_index(operator.index(b["axis"]), a.ndim)
    for _ in range(operator.index(b["n"])):
        g = _pad_along(g, ax, 1, 0) - _pad_along(g, ax, 0, 1)
    if g.shape[ax] != a.shape[ax]:
        lo = 0 if b["prepend"] is np._NoValue else 1
        g = g[(slice(None),) * ax + (slice(lo, lo + a.shape[ax]),)]
    return (_fit(g, a),)


def _atleast(g, node, out):
    """np.atleast_*d only adds dims of length 1: the gradient reshaped back. Given
    several arrays it gives one output each (node.aux: (kwargs, its index))."""
    if len(node.saved) == 1:
        return (g.reshape(node.saved[0].shape),)
    i = node.aux[1]
    return tuple(g.reshape(a.shape) if k == i else None for k, a in enumerate(node.saved))


def _identity(g, node, out):
    return (g,)


def _real(g, node, out):
    """np.real: the gradient as the real part (torch's: an imaginary part of zero)."""
    a = node.saved[0]
    return (g if g.dtype == a.dtype else g.astype(a.dtype),)


def _imag(g, node, out):
    """np.imag: the gradient as the imaginary part (torch's: ``1j * g``); a real
    input's imaginary part is zero, whatever the input."""
    a = node.saved[0]
    gx = g * 1j if a.dtype.kind == "c" else g * 0
    return (gx if gx.dtype == a.dtype else gx.astype(a.dtype),)


def _astype(g, node, out):
    a = node.saved[0]
    return (g if g.dtype == a.dtype else g.astype(a.dtype),)


_WRITES = {operator.setitem: "DTensor item assignment (dt[key] = value)",
           np.copyto: "numpy.copyto (and DTensor.fill)",
           np.put: "numpy.put", np.place: "numpy.place",
           np.put_along_axis: "numpy.put_along_axis", np.putmask: "numpy.putmask",
           np.fill_diagonal: "numpy.fill_diagonal"}

# function -> (name, backward[, supports(args, kwargs)])
_FUNCTIONS = {
    np.ufunc: ("ufunc", _ufunc_entry, _ufunc_supported),
    np.dot: ("dot", _dot, _dot_supported),
    np.einsum: ("einsum", _einsum, _einsum_supported),
    np.tensordot: ("tensordot", _tensordot),
    np.inner: ("inner", _inner),
    np.outer: ("outer", _outer),
    np.where: ("where", _where),
    np.concatenate: ("concatenate", _concatenate),
    np.split: ("split", _split),
    np.array_split: ("array_split", _split),
    np.diag: ("diag", _diag),
    np.stack: ("stack", _stack),
    operator.getitem: ("getitem", _getitem),
    np.sum: ("sum", _sum_function(False)),
    np.mean: ("mean", _sum_function(True)),
    np.prod: ("prod", _prod_function),
    np.max: ("max", _extremum_function(np.max)),
    np.amax: ("amax", _extremum_function(np.max)),
    np.min: ("min", _extremum_function(np.min)),
    np.amin: ("amin", _extremum_function(np.min)),
    np.clip: ("clip", _clip),
    np.var: ("var", _moment_function(False)),
    np.std: ("std", _moment_function(True)),
    np.transpose: ("transpose", _transpose),
    np.swapaxes: ("swapaxes", _swapaxes),
    np.moveaxis: ("moveaxis", _moveaxis),
    np.squeeze: ("squeeze", _reshape_back),
    np.expand_dims: ("expand_dims", _reshape_back),
    np.reshape: ("reshape", _reshape_back, _order_c(2)),
    restride: ("restride", _restride_back),
    np.ravel: ("ravel", _reshape_back, _order_c(1)),
    np.broadcast_to: ("broadcast_to", _broadcast_to),
    np.tile: ("tile", _tile),
    np.flip: ("flip", _flip),
    np.roll: ("roll", _roll),
    np.cumsum: ("cumsum", _cumsum),
    np.cumprod: ("cumprod", _cumprod),
    np.diff: ("diff", _diff),
    np.linalg.norm: ("norm", True),
    # NumPy's own steps over DTensor operations (_ops/_composed.py, _assemble.py,
    # _poly.py): each step records itself
    **{f: (f.__name__, True) for f in (
        np.rot90, np.rollaxis, np.unstack, np.polyval, np.select, np.trapezoid, np.vdot,
        np.unwrap, np.linalg.tensorinv, np.linalg.tensorsolve, np.resize, np.polyfit,
        np.block, np.apply_over_axes, np.polyadd, np.polysub, np.polymul, np.polyder,
        np.polyint)},
    np.atleast_1d: ("atleast_1d", _atleast),
    np.atleast_2d: ("atleast_2d", _atleast),
    np.atleast_3d: ("atleast_3d", _atleast),
    np.copy: ("copy", _identity),
    np.real: ("real", _real),
    np.imag: ("imag", _imag),
    np.ndarray.astype: ("astype", _astype),
    np.astype: ("astype", _astype),
}


for _func, _entry in _FUNCTIONS.items():
    register_backward(_func, *_entry)
for _func, _message in _WRITES.items():
    register_backward(_func, _message, None)
for _func, _grads in _UFUNCS.items():
    register_backward(_func, _func.__name__, _recorded_ufunc(_grads), operands=True)
register_backward(np.matmul, "matmul", _recorded_matmul, operands=True)
register_backward("redistribute", "Redistribute", _redistribute_grad, operands=True)
register_backward("view", "restride", _restride_back, operands=True)
for _func, (_name, _backward) in _METHODS.items():
    register_backward(_func, _name, _backward, operands=True)
del _func, _entry, _message, _grads, _name, _backward
