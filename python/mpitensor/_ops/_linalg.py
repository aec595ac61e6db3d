"""``np.dot`` for 1-D and 2-D operands, and ``np.einsum`` with ``np.tensordot``,
``np.inner`` and ``np.outer`` as its instances; the array API's ``np.linalg``
functions (``matmul``, ``vecdot``, ``outer``, ``tensordot``, ``diagonal``, ``trace``,
``matrix_transpose``, ``vector_norm``, ``matrix_norm``, ``cross``), ``np.cross``,
``np.linalg.multi_dot`` and ``np.linalg.matrix_power``, as NumPy composes them of
these rules.

matmul itself (``@``, the ufunc ``np.matmul``) is registered with the C dispatch
(_elementwise.py), whose dim map (core/dimmap.c) broadcasts batch dims, keeps the
rows and columns and contracts the inner dim (sharded -> Partial(sum)); a
Partial(sum|avg) operand passes through when the other is Replicate:
``S1 @ S0 -> P(sum)``, ``S0 @ R -> S0``, ``R @ S1 -> S1``.
"""

from __future__ import annotations

import functools
import operator
import warnings

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .. import _registry
from .._dtensor import DTensor
from .._algorithms import _dispatch as D
from .._algorithms import _merge


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
    lhs, arrow, out = spec.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(operands):
        raise ValueError(f"{name}: {len(ins)} operand subscripts for {len(operands)} "
                         f"operands")
    if not arrow:
        # NumPy's implicit output: the broadcast dims, then the letters that
        # appear once, in alphabetical order.
        once = sorted(ch for ch in set(lhs) if ch in _LETTERS and lhs.count(ch) == 1)
        out = ("..." if "..." in lhs else "") + "".join(once)
    if "." in spec or "..." in out:
        ins, out = _spell_ellipsis(name, ins, out, operands)
        lhs = ",".join(ins)
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


def _spell_ellipsis(name, ins, out, operands):
    """einsum subscripts with each '...' spelled as letters no term uses: an
    operand's broadcast dims take the last of them, right-aligned as NumPy aligns
    them. Broadcast dims of unequal sizes stay NumPy's to broadcast (NoRule)."""
    free = [ch for ch in _LETTERS if ch not in "".join(ins) + out]
    spans = []
    for term, x in zip(ins, operands):
        if term.count("...") > 1 or term.replace("...", "").count("."):
            raise ValueError(f"{name}: invalid subscripts {term!r}")
        spans.append(x.ndim - len(term.replace("...", "")) if "..." in term else 0)
    if min(spans, default=0) < 0:
        raise ValueError(f"{name}: more subscripts than dims in an operand")
    width = max(spans, default=0)
    ell = free[:width]
    sizes = {}
    for term, x, k in zip(ins, operands, spans):
        at = term.find("...")
        for ch, n in zip(ell[width - k:], x.shape[at:at + k] if k else ()):
            if sizes.setdefault(ch, n) != n:
                raise _registry.NoRule(f"{name} on DTensors: '...' dims of other lengths "
                                       f"(broadcast) have no distributed rule")
    if width and "..." not in out:
        raise ValueError("output has more dimensions than subscripts given in einstein "
                         "sum, but no '...' ellipsis provided to broadcast the extra "
                         "dimensions.")
    ins = [term.replace("...", "".join(ell[width - k:])) for term, k in zip(ins, spans)]
    return ins, out.replace("...", "".join(ell))


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
        raise _registry.NoRule(f"{name}: {', '.join(sorted(kwargs)) or 'out'}= has no "
                               f"distributed rule")
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
    """The two operands as DTensors: a plain ndarray beside a DTensor is the
    Replicate DTensor the executor makes of it (once the call agreed that every
    rank holds it); NumPy's mixing error or a TypeError for anything else."""
    a, b = D.implicit((a, b))
    for x in (a, b):
        if type(x) is not DTensor:
            if isinstance(x, np.ndarray) or D.is_scalar(x):
                raise D.mixed_error(name, x)
            raise TypeError(f"{name}: expected DTensors, got {type(x).__name__}")
    return a, b


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
    """np.tensordot of two DTensors, placed as the einsum it equals (a sharded
    contracted dim leaves a Partial(sum)); each block runs NumPy's tensordot, so
    where the contracted dims are whole the result rounds as NumPy's (an einsum
    loop sums in another order).

    Example: ``np.tensordot(a, b, axes=1)``.
    """
    name = "numpy.tensordot"
    a, b = _two_dtensors(name, a, b)
    sub = tensordot_subscripts(name, a, b, axes)
    D.same_mesh(name, (a, b))
    lhs, out = sub.split("->")
    ins = lhs.split(",")
    letters = sorted(set(lhs.replace(",", "")), key=lhs.index)
    local_axes = axes if isinstance(axes, (int, np.integer)) else (
        tuple(normalize_axis_tuple(axes[0], a.ndim)), tuple(normalize_axis_tuple(axes[1], b.ndim)))
    return D.execute(("tensordot", sub), (a, b), lambda: einsum_map(ins, out, letters),
                     lambda x, y: np.tensordot(x, y, local_axes))


@_registry.implements(np.inner)
def inner(a, b):
    """np.inner of two DTensors (at least 1-D) as an einsum over their last dims."""
    name = "numpy.inner"
    a, b = _two_dtensors(name, a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise TypeError(f"{name} on DTensors needs operands of at least one dim; for a "
                        f"scalar factor use *")
    return einsum(tensordot_subscripts(name, a, b, ((-1,), (-1,))), a, b)


@_registry.implements(np.outer)
def outer(a, b, out=None):
    """np.outer of two 1-D DTensors: the dim map of the einsum "i,j->ij", each block
    NumPy's own outer, a multiply (einsum's loop sets no floating-point flag, so
    np.errstate would see no overflow)."""
    name = "numpy.outer"
    a, b = _two_dtensors(name, a, b)
    if out is not None:
        raise _registry.NoRule(f"{name}: out= is not supported on DTensors")
    if a.ndim != 1 or b.ndim != 1:
        raise _registry.NoRule(f"{name} on DTensors takes 1-D operands (NumPy would flatten "
                               f"them, which has no sharding rule); got {a.ndim}-D and "
                               f"{b.ndim}-D")
    D.same_mesh(name, (a, b))
    return D.execute(("outer",), (a, b), lambda: einsum_map(["i", "j"], "ij", "ij"), np.outer)


# -- the array API's linear algebra, and what NumPy builds from matmul ----------------
#
# Each is NumPy's own composition of the rules above (and of the diagonal, norm and
# shape rules), in NumPy's order of operations, so a result is NumPy's to the bit
# where each step is.

def _as_dtensor(name, x):
    if type(x) is not DTensor:
        if isinstance(x, np.ndarray) or D.is_scalar(x):
            raise D.mixed_error(name, x)
        raise TypeError(f"{name}: expected a DTensor, got {type(x).__name__}")
    return x


@_registry.implements(np.matrix_transpose, np.linalg.matrix_transpose, takes_strided=True)
def matrix_transpose(x, /):
    """``np.matrix_transpose`` of a DTensor: its last two dims swapped, the
    placements following them. Local.

    Example: ``np.matrix_transpose(dt).shape == dt.shape[:-2] + dt.shape[:-3:-1]``.
    """
    x = _as_dtensor("numpy.matrix_transpose", x)
    if x.ndim < 2:
        raise ValueError("Input array must be at least 2-dimensional")
    return np.swapaxes(x, -1, -2)


@_registry.implements(np.linalg.diagonal)
def linalg_diagonal(x, /, *, offset=0):
    """``np.linalg.diagonal``: ``np.diagonal`` of the last two dims. Local (the
    diagonal's Partial is reduced when it is read).

    Example: ``np.linalg.diagonal(dt, offset=1)``.
    """
    return np.diagonal(_as_dtensor("numpy.linalg.diagonal", x), offset, -2, -1)


@_registry.implements(np.linalg.trace)
def linalg_trace(x, /, *, offset=0, dtype=None):
    """``np.linalg.trace``: ``np.trace`` of the last two dims. Local until read.

    Example: ``np.linalg.trace(dt)``.
    """
    return np.trace(_as_dtensor("numpy.linalg.trace", x), offset, -2, -1, dtype)


@_registry.implements(np.linalg.matmul)
def linalg_matmul(x1, x2, /):
    """``np.linalg.matmul``: the matmul rule (``@``). Collective when an operand
    moves.

    Example: ``np.linalg.matmul(a, b)``.
    """
    return np.matmul(x1, x2)


@_registry.implements(np.linalg.outer)
def linalg_outer(x1, x2, /):
    """``np.linalg.outer`` of two 1-D DTensors: NumPy's product of a column and a
    row, elementwise with broadcasting (an einsum would sum each product onto a
    zero, which turns a -0.0 into 0.0). Local when the operands are laid out for
    it.

    Example: ``np.linalg.outer(u, v)``.
    """
    name = "numpy.linalg.outer"
    x1, x2 = _two_dtensors(name, x1, x2)
    if x1.ndim != 1 or x2.ndim != 1:
        raise ValueError("Input arrays must be one-dimensional, but they are "
                         f"x1.ndim={x1.ndim} and x2.ndim={x2.ndim}.")
    D.same_mesh(name, (x1, x2))
    return np.multiply(np.expand_dims(x1, 1), np.expand_dims(x2, 0))


@_registry.implements(np.linalg.tensordot)
def linalg_tensordot(x1, x2, /, *, axes=2):
    """``np.linalg.tensordot``: ``np.tensordot``'s einsum.

    Example: ``np.linalg.tensordot(a, b, axes=1)``.
    """
    return tensordot(x1, x2, axes)


@_registry.implements(np.linalg.vecdot)
def linalg_vecdot(x1, x2, /, *, axis=-1):
    """``np.linalg.vecdot`` of DTensors: operands of one shape run NumPy's vecdot on
    each block, the axis contracted as einsum's (a sharded ``axis`` leaves a
    Partial(sum) the size of the result); broadcast operands (and bools) take the
    conjugate of ``x1`` times ``x2`` summed along ``axis`` in the operands' dtype
    (ints wrap as NumPy's). Local until read when the operands are laid out
    alike.

    Example: ``np.linalg.vecdot(a, b, axis=0)``.
    """
    name = "numpy.linalg.vecdot"
    x1, x2 = _two_dtensors(name, x1, x2)
    D.same_mesh(name, (x1, x2))
    if x1.ndim == 0 or x2.ndim == 0:
        raise ValueError(f"vecdot: Input operand {0 if x1.ndim == 0 else 1} does not have "
                         f"enough dimensions (has 0, gufunc core with signature "
                         f"(n),(n)->() requires 1)")
    a1 = np.lib.array_utils.normalize_axis_index(operator.index(axis), x1.ndim)
    a2 = np.lib.array_utils.normalize_axis_index(operator.index(axis), x2.ndim)
    if x1.shape[a1] != x2.shape[a2]:
        raise ValueError(f"vecdot: Input operand 1 has a mismatch in its core dimension 0, "
                         f"with gufunc signature (n),(n)->() (size {x2.shape[a2]} is "
                         f"different from {x1.shape[a1]})")
    dtype = np.result_type(x1.dtype, x2.dtype)
    u, v = np.moveaxis(x1, a1, -1), np.moveaxis(x2, a2, -1)
    if u.shape == v.shape and dtype != np.bool_:
        # NumPy's own loop on each block (its summation order where the axis is
        # whole); a sharded axis is contracted into a Partial(sum), as einsum's.
        letters = list(_LETTERS[:u.ndim])
        return D.execute(("vecdot", u.ndim), (u, v),
                         lambda: einsum_map([letters, letters], letters[:-1], letters),
                         lambda p, q: np.vecdot(p, q, axis=-1))
    if dtype.kind == "c":
        u = np.conjugate(u)
    return np.sum(np.multiply(u, v, dtype=dtype), axis=-1, dtype=dtype)


def _matvec(x1, x2):
    """``np.matvec`` of DTensors: ``x1 @ x2`` with ``x2`` a column, (..., m, n) by
    (..., n) to (..., m), as matmul lays it out."""
    if x1.ndim < 2 or x2.ndim < 1:
        raise ValueError("matvec: an operand does not have enough dimensions (gufunc "
                         "signature (m,n),(n)->(m))")
    return np.squeeze(np.matmul(x1, np.expand_dims(x2, -1)), -1)


def _vecmat(x1, x2):
    """``np.vecmat`` of DTensors: the conjugate of ``x1`` as a row times ``x2``,
    (..., n) by (..., n, m) to (..., m), as matmul lays it out."""
    if x1.ndim < 1 or x2.ndim < 2:
        raise ValueError("vecmat: an operand does not have enough dimensions (gufunc "
                         "signature (n),(n,m)->(m))")
    if np.result_type(x1.dtype, x2.dtype).kind == "c":
        x1 = np.conjugate(x1)
    return np.squeeze(np.matmul(np.expand_dims(x1, -2), x2), -2)


# NumPy's gufuncs of linear algebra that run as the contraction they are: the
# entry and the keywords it takes (those of this NumPy).
GUFUNCS = {u: entry for u, entry in ((getattr(np, "vecdot", None), (linalg_vecdot, {"axis"})),
                                     (getattr(np, "matvec", None), (_matvec, set())),
                                     (getattr(np, "vecmat", None), (_vecmat, set())))
           if u is not None}


def _vector_norm_axes(x, axes, ord, keepdims):
    """NumPy's vector norm over ``axes`` at once, the formulas of
    ``np.linalg.norm``'s vector branch (a complex square as NumPy's, the real part
    of the conjugate times the value) reduced over the tuple (NumPy reshapes
    several axes into one, which would move a sharded dim)."""
    if x.dtype.kind not in "fc":
        x = x.astype(np.float64)
    empty = any(x.shape[a] == 0 for a in axes)
    if ord is None or ord == 2:
        square = np.real(np.conjugate(x) * x) if x.dtype.kind == "c" else x * x
        return np.sqrt(np.sum(square, axis=axes, keepdims=keepdims))
    if isinstance(ord, str):
        raise ValueError(f"Invalid norm order '{ord}' for vectors")
    if ord == np.inf:
        absx = np.abs(x)
        if empty and _merge._FROM_ZERO:
            return np.sum(absx, axis=axes, keepdims=keepdims)
        return np.max(absx, axis=axes, keepdims=keepdims)
    if ord == -np.inf:
        return np.min(np.abs(x), axis=axes, keepdims=keepdims)
    if ord == 0:
        return np.sum((x != 0).astype(x.real.dtype), axis=axes, keepdims=keepdims)
    if ord == 1:
        return np.sum(np.abs(x), axis=axes, keepdims=keepdims)
    p = float(ord)
    return np.sum(np.abs(x) ** p, axis=axes, keepdims=keepdims) ** (1.0 / p)


@_registry.implements(np.linalg.vector_norm)
def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):
    """``np.linalg.vector_norm`` of a DTensor by partial norms: NumPy's vector
    formulas reduced over the axes (``None``: all) together; a sharded reduced
    axis is reduced at the size of the result. Collective on the mesh when a
    reduced axis is sharded.

    Example: ``np.linalg.vector_norm(dt, axis=(0, 1), ord=1)``.
    """
    name = "numpy.linalg.vector_norm"
    x = _as_dtensor(name, x)
    if axis is None:
        axes = tuple(range(x.ndim))
    elif isinstance(axis, tuple):
        axes = normalize_axis_tuple(axis, x.ndim)
    else:
        axes = normalize_axis_tuple(operator.index(axis), x.ndim)
    return _vector_norm_axes(x, axes, ord, bool(keepdims))


@_registry.implements(np.linalg.matrix_norm)
def matrix_norm(x, /, *, keepdims=False, ord="fro"):
    """``np.linalg.matrix_norm`` of a DTensor: ``np.linalg.norm`` over its last two
    dims, so the orders that rule distributes ('fro', 1, -1, inf, -inf; 2, -2,
    'nuc' of a tall matrix by TSQR). Collective on the mesh.

    Example: ``np.linalg.matrix_norm(dt, ord=1)``.
    """
    x = _as_dtensor("numpy.linalg.matrix_norm", x)
    return _registry.lookup(np.linalg.norm)(x, ord=ord, axis=(-2, -1),
                                            keepdims=bool(keepdims))


def _cross_last(a, b):
    """NumPy's cross product of DTensors whose vectors lie along their last dim (of
    2 or 3, already cast to one dtype), component by component in NumPy's order."""
    a0, a1 = a[..., 0], a[..., 1]
    b0, b1 = b[..., 0], b[..., 1]
    if a.shape[-1] == 2 and b.shape[-1] == 2:
        return a0 * b1 - a1 * b0
    if a.shape[-1] == 2:
        b2 = b[..., 2]
        cp = (a1 * b2, -(a0 * b2), a0 * b1 - a1 * b0)
    elif b.shape[-1] == 2:
        a2 = a[..., 2]
        cp = (-(a2 * b1), a2 * b0, a0 * b1 - a1 * b0)
    else:
        a2, b2 = a[..., 2], b[..., 2]
        cp = (a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0)
    return np.stack(cp, axis=-1)


@_registry.implements(np.cross)
def cross(a, b, axisa=-1, axisb=-1, axisc=-1, axis=None):
    """``np.cross`` of DTensors: elementwise over the other dims, each component
    NumPy's products in NumPy's order, so nothing moves when the vectors' dim is
    not sharded (a sharded one is made whole first) and the other dims are laid
    out alike. NumPy's errors and its DeprecationWarning for 2-vectors.

    Example: ``np.cross(u, v)`` of ``(n, 3)`` DTensors sharded on dim 0.
    """
    name = "numpy.cross"
    a, b = _two_dtensors(name, a, b)
    D.same_mesh(name, (a, b))
    if axis is not None:
        axisa, axisb, axisc = (axis,) * 3
    if a.ndim < 1 or b.ndim < 1:
        raise ValueError("At least one array has zero dimension")
    axisa = np.lib.array_utils.normalize_axis_index(axisa, a.ndim, msg_prefix="axisa")
    axisb = np.lib.array_utils.normalize_axis_index(axisb, b.ndim, msg_prefix="axisb")
    a, b = np.moveaxis(a, axisa, -1), np.moveaxis(b, axisb, -1)
    if a.shape[-1] not in (2, 3) or b.shape[-1] not in (2, 3):
        raise ValueError("incompatible dimensions for cross product\n"
                         "(dimension must be 2 or 3)")
    if a.shape[-1] == 2 or b.shape[-1] == 2:
        warnings.warn("Arrays of 2-dimensional vectors are deprecated. Use arrays of "
                      "3-dimensional vectors instead. (deprecated in NumPy 2.0)",
                      DeprecationWarning, stacklevel=2)
    shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    if a.shape[-1] == 3 or b.shape[-1] == 3:
        shape += (3,)
        axisc = np.lib.array_utils.normalize_axis_index(axisc, len(shape),
                                                        msg_prefix="axisc")
    dtype = np.promote_types(a.dtype, b.dtype)
    if dtype == np.bool_:
        # NumPy subtracts in place, which bools refuse.
        raise TypeError("numpy boolean subtract, the `-` operator, is not supported, use "
                        "the bitwise_xor, the `^` operator, or the logical_xor function "
                        "instead.")
    cp = _cross_last(a.astype(dtype, copy=False), b.astype(dtype, copy=False))
    if a.shape[-1] == 2 and b.shape[-1] == 2:
        return cp
    return np.moveaxis(cp, -1, axisc)


@_registry.implements(np.linalg.cross)
def linalg_cross(x1, x2, /, *, axis=-1):
    """``np.linalg.cross`` of DTensors of 3-vectors: ``np.cross``'s rule.

    Example: ``np.linalg.cross(u, v)``.
    """
    name = "numpy.linalg.cross"
    x1, x2 = _two_dtensors(name, x1, x2)
    if x1.shape[axis] != 3 or x2.shape[axis] != 3:
        raise ValueError("Both input arrays must be (arrays of) 3-dimensional vectors, "
                         f"but they are {x1.shape[axis]} and {x2.shape[axis]} "
                         "dimensional instead.")
    return cross(x1, x2, axis=axis)


def _assert_2d(*arrays):
    for a in arrays:
        if a.ndim != 2:
            raise np.linalg.LinAlgError(f"{a.ndim}-dimensional array given. Array must "
                                        f"be two-dimensional")


def _chain_order(shapes):
    """NumPy's optimal parenthesisation of a matrix chain of ``shapes`` (the
    textbook dynamic programme, as numpy.linalg.multi_dot breaks its ties): the
    split of each sub-chain."""
    n = len(shapes)
    p = [s[0] for s in shapes] + [shapes[-1][1]]
    cost = np.zeros((n, n))
    split = np.empty((n, n), dtype=np.intp)
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i, j] = np.inf
            for k in range(i, j):
                q = cost[i, k] + cost[k + 1, j] + p[i] * p[k + 1] * p[j + 1]
                if q < cost[i, j]:
                    cost[i, j], split[i, j] = q, k
    return split


def _chain(arrays, split, i, j):
    if i == j:
        return arrays[i]
    k = int(split[i, j])
    return dot(_chain(arrays, split, i, k), _chain(arrays, split, k + 1, j))


@_registry.implements(np.linalg.multi_dot)
def multi_dot(arrays, *, out=None):
    """``np.linalg.multi_dot`` of DTensors: the chain of the matmul rule in the
    order NumPy picks from the shapes (so in NumPy's rounding order), a 1-D first
    or last operand as a row or a column. Collective when an operand moves.

    Example: ``np.linalg.multi_dot([a, b, c])``.
    """
    name = "numpy.linalg.multi_dot"
    if out is not None:
        raise _registry.NoRule(f"{name}: out= is not supported on DTensors")
    arrays = list(D.implicit(tuple(arrays)))
    n = len(arrays)
    if n < 2:
        raise ValueError("Expecting at least two arrays.")
    for x in arrays:
        _as_dtensor(name, x)
    if n == 2:
        return dot(arrays[0], arrays[1])
    first, last = arrays[0].ndim, arrays[-1].ndim
    if first == 1:
        arrays[0] = np.atleast_2d(arrays[0])
    if last == 1:
        arrays[-1] = np.atleast_2d(arrays[-1]).T
    _assert_2d(*arrays)
    if n == 3:
        (a0, a1b0), (b1c0, c1) = arrays[0].shape, arrays[2].shape
        if a0 * b1c0 * (a1b0 + c1) < a1b0 * c1 * (a0 + b1c0):
            result = dot(dot(arrays[0], arrays[1]), arrays[2])
        else:
            result = dot(arrays[0], dot(arrays[1], arrays[2]))
    else:
        result = _chain(arrays, _chain_order([x.shape for x in arrays]), 0, n - 1)
    if first == 1 and last == 1:
        return result[0, 0]
    if first == 1 or last == 1:
        return np.ravel(result)
    return result


@_registry.implements(np.linalg.matrix_power)
def matrix_power(a, n):
    """``np.linalg.matrix_power`` of a DTensor (a matrix or a stack): NumPy's
    binary decomposition into products of the matmul rule; ``n == 0`` the
    identity in ``a``'s layout, made without communicating; ``n < 0`` powers of
    ``np.linalg.inv(a)``. Collective when an operand moves.

    Example: ``np.linalg.matrix_power(dt, 5)``.
    """
    name = "numpy.linalg.matrix_power"
    a = _as_dtensor(name, a)
    if a.ndim < 2:
        raise np.linalg.LinAlgError(f"{a.ndim}-dimensional array given. Array must be at "
                                    f"least two-dimensional")
    if a.shape[-1] != a.shape[-2]:
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")
    try:
        n = operator.index(n)
    except TypeError as e:
        raise TypeError("exponent must be an integer") from e
    if n == 0:
        return np.tril(np.triu(np.ones_like(a)))
    if n < 0:
        a, n = np.linalg.inv(a), -n
    if n == 1:
        return a
    if n == 2:
        return np.matmul(a, a)
    if n == 3:
        return np.matmul(np.matmul(a, a), a)
    z = result = None
    while n > 0:
        z = a if z is None else np.matmul(z, z)
        n, bit = divmod(n, 2)
        if bit:
            result = z if result is None else np.matmul(result, z)
    return result
