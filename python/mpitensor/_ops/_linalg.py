"""``np.dot`` for 1-D and 2-D operands, and ``np.einsum`` with ``np.tensordot``,
``np.inner`` and ``np.outer`` as its instances.

matmul itself (``@``, the ufunc ``np.matmul``) is registered with the C dispatch
(_elementwise.py), whose dim map (core/dimmap.c) broadcasts batch dims, keeps the
rows and columns and contracts the inner dim (sharded -> Partial(sum)); a
Partial(sum|avg) operand passes through when the other is Replicate:
``S1 @ S0 -> P(sum)``, ``S0 @ R -> S0``, ``R @ S1 -> S1``.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .. import _registry
from .._dtensor import DTensor
from . import _dispatch as D


@_registry.implements(np.dot)
def dot(a, b, out=None):
    """np.dot for 1-D and 2-D DTensors (the cases where it equals matmul)."""
    if out is not None:
        raise _registry.NoRule("numpy.dot: out= is not supported on DTensors")
    a, b = D.implicit((a, b))
    for x in (a, b):
        if type(x) is not DTensor:
            if isinstance(x, np.ndarray) and x.ndim > 0:
                raise D.mixed_error("numpy.dot", x)
            raise TypeError("numpy.dot on DTensors takes two DTensors; for a scalar "
                            "factor use *")
        if x.ndim not in (1, 2):
            raise TypeError(
                f"numpy.dot on DTensors supports 1-D and 2-D operands, got {x.ndim}-D; "
                f"use numpy.matmul")
    out = np.matmul(a, b)
    want = _dot_dtype(a.dtype, b.dtype)
    return out if out.dtype == want else out.astype(want)


@functools.lru_cache(maxsize=64)
def _dot_dtype(a, b):
    """The dtype numpy.dot gives: matmul's, except where a dtype's loops differ
    (ml_dtypes' bfloat16 matmul gives float32, its dot bfloat16)."""
    return np.dot(np.zeros((1, 1), a), np.zeros((1, 1), b)).dtype


# -- einsum and its instances ---------------------------------------------------------
#
# Dim map: one label per subscript letter; letters in the output are KEEP, the
# others CONTRACT (sharded -> Partial(sum)); a letter repeated within one operand
# (a diagonal) is never sharded (the engine's rule). einsum is linear in every
# operand, so one Partial(sum|avg) operand passes through while the others are
# Replicate (LINEAR_ONE over all inputs).

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse_einsum(subscripts, operands):
    name = "numpy.einsum"
    if not isinstance(subscripts, str):
        raise _registry.NoRule(f"{name} on DTensors takes a subscripts string (the interleaved "
                               f"operand/sublist form is not supported)")
    spec = subscripts.replace(" ", "")
    if "->" not in spec:
        raise _registry.NoRule(f"{name} on DTensors needs explicit output subscripts "
                               f"('ij,jk->ik'), got {subscripts!r}")
    if "." in spec:
        raise _registry.NoRule(f"{name} on DTensors does not support '...'; spell every dim")
    lhs, out = spec.split("->")
    ins = lhs.split(",")
    if len(ins) != len(operands):
        raise ValueError(f"{name}: {len(ins)} operand subscripts for {len(operands)} "
                         f"operands")
    for term in ins + [out]:
        for ch in term:
            if ch not in _LETTERS:
                raise ValueError(f"{name}: invalid subscript {ch!r} in {subscripts!r}")
    for term, x in zip(ins, operands):
        if len(term) != x.ndim:
            raise ValueError(f"{name}: subscripts {term!r} for an operand of {x.ndim} "
                             f"dims")
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: output subscript repeated in {subscripts!r}")
    letters = sorted(set(lhs.replace(",", "")), key=lhs.index)
    for ch in out:
        if ch not in letters:
            raise ValueError(f"{name}: output subscript {ch!r} is in no operand")
    return ins, out, letters


def einsum_map(ins, out, letters):
    label = {ch: i for i, ch in enumerate(letters)}
    kinds = [D.KEEP if ch in out else D.CONTRACT for ch in letters]
    return D.dimmap([[label[ch] for ch in term] for term in ins],
                    [label[ch] for ch in out], kinds, partial_rule=D.P_LINEAR_ONE,
                    partial_inputs=(1 << len(ins)) - 1)


@_registry.implements(np.einsum)
def einsum(subscripts, *operands, out=None, optimize=False, **kwargs):
    """np.einsum with explicit "->" subscripts on DTensors (all operands DTensors)."""
    name = "numpy.einsum"
    if out is not None or kwargs:
        raise TypeError(f"{name}: out= and {', '.join(kwargs) or 'out'}= are not "
                        f"supported on DTensors")
    operands = D.implicit(operands)
    for x in operands:
        if type(x) is not DTensor:
            raise D.mixed_error(name, x)
    if not operands:
        raise ValueError(f"{name}: no operands")
    if len(operands) > 8:
        raise TypeError(f"{name}: at most 8 DTensor operands at once, got "
                        f"{len(operands)}")
    ins, outs, letters = _parse_einsum(subscripts, operands)
    if len(letters) > 32:
        raise TypeError(f"{name}: at most 32 distinct subscripts on DTensors")
    sub = ",".join(ins) + "->" + outs
    D.same_mesh(name, operands)
    return D.execute(("einsum", sub), operands, lambda: einsum_map(ins, outs, letters),
                     lambda *ls: np.einsum(sub, *ls, optimize=optimize))


def _two_dtensors(name, a, b):
    for x in (a, b):
        if type(x) is not DTensor:
            if isinstance(x, np.ndarray) or D.is_scalar(x):
                raise D.mixed_error(name, x)
            raise TypeError(f"{name}: expected DTensors, got {type(x).__name__}")


def tensordot_subscripts(name, a, b, axes):
    """The einsum subscripts of ``np.tensordot(a, b, axes)`` (an int: the last
    ``axes`` dims of ``a`` with the first of ``b``; a pair of sequences: those dims),
    checked against the shapes. Local."""
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        if n < 0 or n > min(a.ndim, b.ndim):
            raise ValueError(f"{name}: axes={n} does not fit shapes {a.shape}, {b.shape}")
        ax_a, ax_b = tuple(range(a.ndim - n, a.ndim)), tuple(range(n))
    else:
        ax_a, ax_b = axes
        ax_a = normalize_axis_tuple(ax_a, a.ndim)
        ax_b = normalize_axis_tuple(ax_b, b.ndim)
        if len(ax_a) != len(ax_b):
            raise ValueError(f"{name}: shape-mismatch for sum")
    if a.ndim + b.ndim - len(ax_a) > 32 or a.ndim + b.ndim > 52:
        raise TypeError(f"{name}: too many dims for einsum on DTensors")
    sa = list(_LETTERS[:a.ndim])
    sb = [None] * b.ndim
    for i, j in zip(ax_a, ax_b):
        if a.shape[i] != b.shape[j]:
            raise ValueError(f"{name}: shape-mismatch for sum")
        sb[j] = sa[i]
    fresh = iter(_LETTERS[a.ndim:])
    sb = [s if s is not None else next(fresh) for s in sb]
    out = [s for i, s in enumerate(sa) if i not in ax_a] + \
          [s for j, s in enumerate(sb) if j not in ax_b]
    return "".join(sa) + "," + "".join(sb) + "->" + "".join(out)


@_registry.implements(np.tensordot)
def tensordot(a, b, axes=2):
    """np.tensordot of two DTensors as an einsum."""
    name = "numpy.tensordot"
    _two_dtensors(name, a, b)
    return einsum(tensordot_subscripts(name, a, b, axes), a, b)


@_registry.implements(np.inner)
def inner(a, b):
    """np.inner of two DTensors (at least 1-D) as an einsum over their last dims."""
    name = "numpy.inner"
    _two_dtensors(name, a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise TypeError(f"{name} on DTensors needs operands of at least one dim; for a "
                        f"scalar factor use *")
    return einsum(tensordot_subscripts(name, a, b, ((-1,), (-1,))), a, b)


@_registry.implements(np.outer)
def outer(a, b, out=None):
    """np.outer of two 1-D DTensors as an einsum ("i,j->ij")."""
    name = "numpy.outer"
    _two_dtensors(name, a, b)
    if out is not None:
        raise _registry.NoRule(f"{name}: out= is not supported on DTensors")
    if a.ndim != 1 or b.ndim != 1:
        raise _registry.NoRule(f"{name} on DTensors takes 1-D operands (NumPy would flatten "
                               f"them, which has no sharding rule); got {a.ndim}-D and "
                               f"{b.ndim}-D")
    return einsum("i,j->ij", a, b)
