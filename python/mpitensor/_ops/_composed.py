"""NumPy functions that are NumPy's own code over operations DTensors have:
``np.rot90``, ``np.rollaxis``, ``np.unstack``, ``np.polyval``, ``np.select``,
``np.trapezoid``, ``np.vdot``, ``np.unwrap``, ``np.linalg.tensorinv`` and
``tensorsolve`` (a reshape around ``inv`` and ``solve``, which ScaLAPACK runs),
``np.trim_zeros`` (where each dim holds a nonzero, then a slice),
``np.polyfit`` (NumPy's scaled Vandermonde least squares, on TSQR or ScaLAPACK),
``np.resize``, ``np.choose``, ``np.unravel_index`` and ``np.ravel_multi_index`` (integer
arithmetic element by element, after one reduction that checks the indices),
``np.sort_complex``, ``np.lexsort`` (of 1-D keys:
one stable argsort per key, least significant first, each key read through the
order so far, as a radix sort does); and the ones that read only shapes:
``np.tril_indices_from``, ``np.triu_indices_from``, ``np.diag_indices_from``,
``np.einsum_path``; and ``np.vander``, whose rows are its input's elements.

NumPy writes the first group in Python over flips, transposes, slices, products
and sums, after ``asanyarray`` of its input (which would gather a DTensor). Here
the same steps run on the DTensor, each by its own rule, so the result is what
those rules give (no gather; what each step moves, it says) and the value is
NumPy's: the same operations in the same order. The shape-only functions answer
from the global shape on every rank without communicating, ``vander`` runs NumPy's on
each rank's block of a 1-D input (its rows keep the input's Shard), and
``fill_diagonal`` writes on each rank the diagonal positions its block holds.
"""

from __future__ import annotations

import operator
import warnings

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _views
from ._pointwise import per_element

__all__ = ["rot90", "rollaxis", "unstack", "polyval", "select", "trapezoid", "vdot",
           "sort_complex", "lexsort", "unwrap", "tensorinv", "tensorsolve", "trim_zeros",
           "fill_diagonal", "choose", "unravel_index", "ravel_multi_index", "polyfit",
           "resize",
           "tril_indices_from", "triu_indices_from", "diag_indices_from", "einsum_path",
           "vander"]


def _dtensor(name, x):
    if type(x) is not DTensor:
        raise _registry.NoRule(f"{name}: the DTensor rule takes a DTensor here")
    return x


@_registry.implements(np.rot90, views=True)
def rot90(m, k=1, axes=(0, 1)):
    """``np.rot90`` of a DTensor: NumPy's flips and transpose, each a DTensor
    operation (a flip along a sharded axis is one exchange; the transpose moves
    nothing). Collective on the mesh when a flipped axis is sharded.

    As NumPy's, a program's is a view of ``m`` (mpitensor._algorithms._views):
    its writes reach ``m``, rotated back, and it shows the writes into ``m``.

    Example: ``np.rot90(dt)`` of a ``[Shard(0)]`` matrix is ``[Shard(1)]``.
    """
    program = _registry.program_call(np.rot90)
    out = _rot90(m, k, axes)
    if not program:
        return out
    axes = tuple(axes)

    def back(p, view, written):
        np.copyto(p, np.rot90(view, -k, axes), where=np.rot90(written, -k, axes))
    return _views.keep(m, out, lambda p: _rot90(p, k, axes), back)


def _rot90(m, k, axes):
    """:func:`rot90` itself: the flips and the transpose."""
    m = _dtensor("numpy.rot90", m)
    axes = tuple(axes)
    if len(axes) != 2:
        raise ValueError("len(axes) must be 2.")
    if axes[0] == axes[1] or abs(axes[0] - axes[1]) == m.ndim:
        raise ValueError("Axes must be different.")
    if (axes[0] >= m.ndim or axes[0] < -m.ndim
            or axes[1] >= m.ndim or axes[1] < -m.ndim):
        raise ValueError(f"Axes={axes} out of range for array of ndim={m.ndim}.")
    k = operator.index(k) % 4
    if k == 0:
        return m[:]
    if k == 2:
        return np.flip(np.flip(m, axes[0]), axes[1])
    order = list(range(m.ndim))
    order[axes[0]], order[axes[1]] = order[axes[1]], order[axes[0]]
    if k == 1:
        return np.transpose(np.flip(m, axes[1]), order)
    return np.flip(np.transpose(m, order), axes[1])


@_registry.implements(np.rollaxis)
def rollaxis(a, axis, start=0):
    """``np.rollaxis`` of a DTensor: a transpose (Shards follow their dims). Local.

    Example: ``np.rollaxis(dt, 2).shape == (4, 2, 3)`` for a (2, 3, 4) ``dt``.
    """
    return np.rollaxis._implementation(_dtensor("numpy.rollaxis", a), axis, start)


@_registry.implements(np.unstack)
def unstack(x, /, *, axis=0):
    """``np.unstack`` of a DTensor: its slices along ``axis``, by indexing (a slice
    of an axis that is sharded is made Replicate, as torch's unbind does). Local
    unless ``axis`` is sharded.

    Example: ``np.unstack(dt, axis=1)`` of a ``[Shard(0)]`` matrix: its columns,
    each ``[Shard(0)]``.
    """
    x = _dtensor("numpy.unstack", x)
    if x.ndim == 0:
        raise ValueError("Input array must be at least 1-d.")
    axis = normalize_axis_index(operator.index(axis), x.ndim)
    lead = (slice(None),) * axis
    return tuple(x[lead + (i,)] for i in range(x.shape[axis]))


@_registry.implements(np.polyval)
def polyval(p, x):
    """``np.polyval`` at the points of a DTensor ``x`` (coefficients ``p`` the same on
    every rank, not a DTensor): NumPy's Horner steps, elementwise. Local for Shard
    and Replicate ``x``.

    Example: ``np.polyval([1.0, 0.0, -2.0], dt)`` is ``dt**2 - 2`` by NumPy's steps.
    """
    if type(p) is DTensor or type(x) is not DTensor:
        raise _registry.NoRule("numpy.polyval: the DTensor rule takes plain coefficients "
                               "and DTensor points")
    y = np.zeros_like(x.detach())  # zeros: nothing of x's gradient flows through
    for pv in np.asarray(p):
        y = y * x + pv
    return y


def _dtype_of(v):
    """What np.result_type makes of ``v``: a DTensor's dtype, a Python number as
    itself (weak, as NEP 50 has it), anything else as an array."""
    if type(v) is DTensor:
        return v.dtype
    return v if type(v) in (int, float, complex) else np.asarray(v)


@_registry.implements(np.select)
def select(condlist, choicelist, default=0):
    """``np.select`` with DTensor conditions or choices: NumPy's choices, the first
    true condition's taking precedence, as one ``np.where`` per choice (each by its
    rule: a DTensor operand follows the result's layout). Local when the DTensors
    share a layout.

    Example: ``np.select([dt < 0, dt > 5], [0, dt], default=-1)``.
    """
    if len(condlist) != len(choicelist):
        raise ValueError("list of cases must be same length as list of conditions")
    if len(condlist) == 0:
        raise ValueError("select with an empty condition list is not possible")
    try:
        dtype = np.result_type(*[_dtype_of(v) for v in (*choicelist, default)])
    except TypeError as e:
        raise TypeError(f"Choicelist and default value do not have a common dtype: "
                        f"{e}") from None
    for i, cond in enumerate(condlist):
        kind = cond.dtype if type(cond) is DTensor else np.asarray(cond).dtype
        if kind.type is not np.bool_:
            raise TypeError(f"invalid entry {i} in condlist: should be boolean ndarray")
    if not any(type(v) is DTensor for v in (*condlist, *choicelist, default)):
        raise _registry.NoRule("numpy.select: no DTensor among the arguments")
    result = default
    for cond, choice in zip(condlist[::-1], choicelist[::-1]):
        result = np.where(cond, choice, result)
    if type(result) is not DTensor:  # the DTensors were among conditions never reached
        raise _registry.NoRule("numpy.select: the result is not a DTensor")
    return result.astype(dtype, copy=False)


@_registry.implements(np.trapezoid)
def trapezoid(y, x=None, dx=1.0, axis=-1):
    """``np.trapezoid`` of a DTensor ``y``: NumPy's sum of ``d * (y[1:] + y[:-1]) / 2``
    along ``axis``, each step by its rule (a slice of a sharded axis moves the rows
    it shifts; the sum over it is one reduction). Collective on the mesh when
    ``axis`` is sharded.

    Example: ``np.trapezoid(dt, dx=0.5)``.
    """
    y = _dtensor("numpy.trapezoid", y)
    if x is None:
        d = dx
    else:
        x = x if type(x) is DTensor else np.asarray(x)
        if x.ndim == 1:
            d = np.diff(x)
            shape = [1] * y.ndim
            shape[axis] = d.shape[0]
            d = d.reshape(shape)
        else:
            d = np.diff(x, axis=axis)
        if type(d) is not DTensor:  # spacings every rank holds alike
            mesh = y._spec.mesh
            d = DTensor.from_local(np.ascontiguousarray(d), mesh,
                                   [Replicate()] * mesh.ndim)
    nd = y.ndim
    first, rest = [slice(None)] * nd, [slice(None)] * nd
    first[axis] = slice(1, None)
    rest[axis] = slice(None, -1)
    return (d * (y[tuple(first)] + y[tuple(rest)]) / 2.0).sum(axis)


@_registry.implements(np.vdot)
def vdot(a, b, /):
    """``np.vdot``: the dot product of the flattened DTensors, the first conjugated:
    each rank's products summed, one reduction (an ndarray beside a DTensor is
    replicated, as for every operation). Collective on the mesh.

    Example: ``np.vdot(dt, dt)`` is the squared norm of ``dt``.
    """
    a, b = D.implicit((a, b))
    if type(a) is not DTensor or type(b) is not DTensor:
        raise D.mixed_error("numpy.vdot", b if type(a) is DTensor else a)
    if a.size != b.size:
        raise ValueError("vectors have different lengths")
    flat_a, flat_b = np.ravel(a), np.ravel(b)
    if np.iscomplexobj(flat_a):
        flat_a = np.conjugate(flat_a)
    return np.dot(flat_a, flat_b)


@_registry.implements(np.unwrap)
def unwrap(p, discont=None, axis=-1, *, period=2 * np.pi):
    """``np.unwrap`` of a DTensor: NumPy's steps (a difference along ``axis``, the
    jumps folded into the period, their running sum added back), each by its rule:
    a halo of one row and a scan when ``axis`` is sharded. Collective on the mesh
    then.

    Example: ``np.unwrap(phases)`` of a ``[Shard(0)]`` vector.
    """
    p = _dtensor("numpy.unwrap", p)
    nd = p.ndim
    dd = np.diff(p, axis=axis)
    if discont is None:
        discont = period / 2
    rest = [slice(None, None)] * nd
    rest[axis] = slice(1, None)
    rest = tuple(rest)
    dtype = np.result_type(dd.dtype, period)
    if np.issubdtype(dtype, np.integer):
        interval_high, rem = divmod(period, 2)
        boundary_ambiguous = rem == 0
    else:
        interval_high = period / 2
        boundary_ambiguous = True
    interval_low = -interval_high
    ddmod = np.mod(dd - interval_low, period) + interval_low
    if boundary_ambiguous:
        np.copyto(ddmod, interval_high, where=(ddmod == interval_low) & (dd > 0))
    ph_correct = ddmod - dd
    np.copyto(ph_correct, 0, where=abs(dd) < discont)
    up = p.astype(dtype, copy=True)
    up[rest] = p[rest] + ph_correct.cumsum(axis)
    return up


@_registry.implements(np.linalg.tensorinv)
def tensorinv(a, ind=2):
    """``np.linalg.tensorinv`` of a DTensor: ``inv`` of its reshape to a square
    matrix (ScaLAPACK's, see _scalapack.py), reshaped back. Collective on the mesh.

    Example: ``np.linalg.tensorinv(dt, ind=1)`` of a (4, 2, 2) ``dt``.
    """
    a = _dtensor("numpy.linalg.tensorinv", a)
    oldshape = a.shape
    if ind <= 0:
        raise ValueError("Invalid ind argument.")
    invshape = oldshape[ind:] + oldshape[:ind]
    prod = 1
    for k in oldshape[ind:]:
        prod *= k
    return np.linalg.inv(a.reshape(prod, -1)).reshape(*invshape)


@_registry.implements(np.linalg.tensorsolve)
def tensorsolve(a, b, axes=None):
    """``np.linalg.tensorsolve`` with DTensors: ``solve`` of the reshaped square
    system (ScaLAPACK's), reshaped to the unknowns' shape. Collective on the mesh.

    Example: ``np.linalg.tensorsolve(a, b)`` of a (2, 3, 6) ``a`` and (2, 3) ``b``.
    """
    a = _dtensor("numpy.linalg.tensorsolve", a)
    if type(b) is not DTensor:
        raise D.mixed_error("numpy.linalg.tensorsolve", b)
    an = a.ndim
    if axes is not None:
        order = list(range(an))
        for k in axes:
            order.remove(k)
            order.insert(an, k)
        a = a.transpose(order)
    oldshape = a.shape[-(an - b.ndim):]
    prod = 1
    for k in oldshape:
        prod *= k
    if a.size != prod ** 2:
        raise np.linalg.LinAlgError(
            "Input arrays must satisfy the requirement "
            "prod(a.shape[b.ndim:]) == prod(a.shape[:b.ndim])")
    return np.linalg.solve(a.reshape(prod, prod), np.ravel(b)).reshape(oldshape)


@_registry.implements(np.trim_zeros)
def trim_zeros(filt, trim="fb", axis=None):
    """``np.trim_zeros`` of a DTensor: the first and last nonzero index per dim
    (from ``any`` over the other dims, a vector of the dim's length made whole),
    then NumPy's slice. Collective on the mesh.

    Example: ``np.trim_zeros(dt)`` of ``[0, 0, 3, 1, 0]`` as ``[Shard(0)]``.
    """
    filt = _dtensor("numpy.trim_zeros", filt)
    trim = trim.lower()
    if trim not in {"fb", "bf", "f", "b"}:
        raise ValueError(f"unexpected character(s) in `trim`: {trim!r}")
    nd = filt.ndim
    axes = tuple(range(nd)) if axis is None else np.lib.array_utils.normalize_axis_tuple(
        axis, nd, argname="axis")
    if not axes:
        return filt
    # Per dim, whether each index holds a nonzero (a reduction over the other dims,
    # made whole: its length, not the array's size); NumPy's argwhere extremes.
    nonzero = filt != 0
    lines = [np.asarray((np.any(nonzero, axis=tuple(o for o in range(nd) if o != d))
                         if nd > 1 else nonzero).full_tensor()) for d in range(nd)]
    if not lines[0].any():
        start = stop = np.zeros(nd, dtype=np.intp)
    else:
        start = [int(np.argmax(line)) for line in lines]
        stop = [len(line) - int(np.argmax(line[::-1])) for line in lines]
        if "f" not in trim:
            start = (None,) * nd
        if "b" not in trim:
            stop = (None,) * nd
    key = tuple(slice(None if start[d] is None else int(start[d]),
                      None if stop[d] is None else int(stop[d])) if d in axes
                else slice(None) for d in range(nd))
    return filt[key[0]] if nd == 1 else filt[key]


@_registry.implements(np.fill_diagonal)
@_views.writes
def fill_diagonal(a, val, wrap=False):
    """``np.fill_diagonal`` of a DTensor, in place: NumPy's diagonal positions (every
    ``step``-th element of the flattened array, wrapping on a tall matrix when asked),
    each written by the rank whose block holds it, ``val`` cycled as NumPy's flat
    assignment cycles it. Local (a Partial destination or a DTensor ``val`` is
    gathered).

    Example: ``np.fill_diagonal(dt, 0.0)`` of a ``[Shard(0)]`` matrix.
    """
    name = "numpy.fill_diagonal"
    a = _dtensor(name, a)
    if type(val) is DTensor or any(p.is_partial() for p in a._spec.placements):
        raise _registry.NoRule(f"{name}: a DTensor value or a Partial destination")
    if a.ndim < 2:
        raise ValueError("array must be at least 2-d")
    end = a.size
    if a.ndim == 2:
        step = a.shape[1] + 1
        if not wrap:
            end = min(end, a.shape[1] * a.shape[1])
    else:
        if not np.all(np.diff(a.shape) == 0):
            raise ValueError("All dimensions of input must be of equal length")
        step = 1 + int(np.cumprod(a.shape[:-1]).sum())
    values = np.asarray(val, dtype=a.dtype).reshape(-1)
    spec = a._spec
    if spec.mesh._coordinate is None or values.size == 0:
        return
    flat = np.arange(0, end, step, dtype=np.intp)
    where = np.unravel_index(flat, spec.shape)
    lshape, loff = local_shape_and_global_offset(spec.shape, spec.mesh.shape,
                                                 spec.mesh._coordinate, spec.placements)
    mine = np.ones(flat.size, bool)
    for d in range(a.ndim):
        mine &= (where[d] >= loff[d]) & (where[d] < loff[d] + lshape[d])
    local = a.to_local()
    local[tuple(w[mine] - loff[d] for d, w in enumerate(where))] = \
        values[np.flatnonzero(mine) % values.size]


@_registry.implements(np.polyfit)
def polyfit(x, y, deg, rcond=None, full=False, w=None, cov=False):
    """``np.polyfit`` with DTensor samples: NumPy's steps, the Vandermonde matrix
    laid out as the samples (``vander``), its columns scaled by their norms (one
    reduction) and ``lstsq`` on it (TSQR for a tall ``[Shard(0)]`` one: only the
    small R factors move); the coefficients are placed as lstsq places them.

    Example: ``np.polyfit(x, y, 2)`` of two ``[Shard(0)]`` vectors.
    """
    name = "numpy.polyfit"
    if type(x) is not DTensor or type(y) is not DTensor or (
            w is not None and type(w) is not DTensor):
        raise _registry.NoRule(f"{name}: the DTensor rule takes DTensor x, y (and w)")
    order = int(deg) + 1
    x, y = x + 0.0, y + 0.0
    if deg < 0:
        raise ValueError("expected deg >= 0")
    if x.ndim != 1:
        raise TypeError("expected 1D vector for x")
    if x.size == 0:
        raise TypeError("expected non-empty vector for x")
    if y.ndim < 1 or y.ndim > 2:
        raise TypeError("expected 1D or 2D array for y")
    if x.shape[0] != y.shape[0]:
        raise TypeError("expected x and y to have same length")
    if rcond is None:
        rcond = len(x) * np.finfo(x.dtype).eps
    lhs, rhs = np.vander(x, order), y
    if w is not None:
        w = w + 0.0
        if w.ndim != 1:
            raise TypeError("expected a 1-d array for weights")
        if w.shape[0] != y.shape[0]:
            raise TypeError("expected w and y to have the same length")
        lhs = lhs * w[:, np.newaxis]
        rhs = rhs * (w[:, np.newaxis] if rhs.ndim == 2 else w)
    scale = np.sqrt((lhs * lhs).sum(axis=0))
    lhs = lhs / scale
    c, resids, rank, sv = np.linalg.lstsq(lhs, rhs, rcond)
    c = (c.T / scale).T
    rank = int(rank.full_tensor()) if type(rank) is DTensor else int(rank)
    if rank != order and not full:
        warnings.warn("Polyfit may be poorly conditioned", np.exceptions.RankWarning,
                      stacklevel=4)
    if full:
        return c, resids, rank, sv, rcond
    if cov:
        base = np.linalg.inv(np.dot(lhs.T, lhs)) / np.outer(scale, scale)
        if cov == "unscaled":
            fac = 1
        else:
            if len(x) <= order:
                raise ValueError("the number of data points must exceed order "
                                 "to scale the covariance matrix")
            fac = resids / (len(x) - order)
        return (c, base * fac) if y.ndim == 1 else (c, base[:, :, np.newaxis] * fac)
    return c


@_registry.implements(np.resize)
def resize(a, new_shape):
    """``np.resize`` of a DTensor: NumPy's flatten, repeat by concatenation, cut and
    reshape, each by its rule. Collective on the mesh when the layout moves.

    Example: ``np.resize(dt, (3, 4))``.
    """
    a = _dtensor("numpy.resize", a)
    if isinstance(new_shape, (int, np.integer)):
        new_shape = (new_shape,)
    a = np.ravel(a)
    new_size = 1
    for n in new_shape:
        new_size *= n
        if n < 0:
            raise ValueError("all elements of `new_shape` must be non-negative")
    if a.size == 0 or new_size == 0:
        return np.zeros_like(a, shape=new_shape)
    repeats = (new_size + a.size - 1) // a.size
    return np.reshape(np.concatenate((a,) * repeats)[:new_size], new_shape)


def _any(mask) -> bool:
    """Whether any element of a boolean DTensor is true, the same on every rank
    (one reduction). Collective on the mesh."""
    return bool(np.any(mask).full_tensor())


def _in_range(a, n, mode, message):
    """Integer DTensor ``a`` brought into ``[0, n)`` by NumPy's clip modes: 'raise'
    checks it (ValueError ``message`` on every rank, one reduction), 'wrap' and
    'clip' rewrite it."""
    if mode == "raise":
        if (n == 0 and a.size) or _any((a < 0) | (a >= n)):
            raise ValueError(message)
        return a
    if mode == "wrap":
        return a % n
    if mode == "clip":
        return np.clip(a, 0, n - 1)
    raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")


def _int_dtensor(name, x):
    x = _dtensor(name, x)
    if x.dtype.kind not in "iu":
        raise TypeError("only int indices permitted")
    return x


@_registry.implements(np.choose)
def choose(a, choices, out=None, mode="raise"):
    """``np.choose`` with an integer DTensor ``a``: element by element, the choice
    ``a`` names (``np.select`` of ``a == k``), after one reduction that checks ``a``
    for mode 'raise' ('wrap' and 'clip' rewrite it). Local besides that check when
    the DTensors share a layout.

    Example: ``np.choose(dt_index, [x, y, z])``.
    """
    name = "numpy.choose"
    if out is not None:
        raise _registry.NoRule(f"{name}: out= is not supported on DTensors")
    a = _int_dtensor(name, a)
    choices = list(choices)
    n = len(choices)
    a = _in_range(a, n, mode, "invalid entry in choice array")
    return np.select([a == k for k in range(n)], choices)


@_registry.implements(np.unravel_index)
def unravel_index(indices, shape, order="C"):
    """``np.unravel_index`` of an integer DTensor: one DTensor of coordinates per dim
    of ``shape``, each laid out as ``indices`` (NumPy's on each block), after one
    reduction that checks the bounds. Local besides that check.

    Example: ``np.unravel_index(dt, (4, 5))``.
    """
    name = "numpy.unravel_index"
    idx = _int_dtensor(name, indices)
    shape = (operator.index(shape),) if np.ndim(shape) == 0 else tuple(
        operator.index(d) for d in shape)
    if order not in ("C", "F"):
        raise ValueError("only 'C' or 'F' order is permitted")
    size = int(np.prod(shape))
    if _any((idx < 0) | (idx >= size)):
        raise ValueError(f"an index is out of bounds for array with size {size}")
    return tuple(per_element(name, ("unravel_index", shape, order, k), idx,
                             lambda v, k=k: np.unravel_index(v, shape, order)[k])
                 for k in range(len(shape)))


@_registry.implements(np.ravel_multi_index)
def ravel_multi_index(multi_index, dims, mode="raise", order="C"):
    """``np.ravel_multi_index`` of integer DTensor coordinates: the flat index by
    integer arithmetic element by element (exact, as NumPy's), after one reduction
    that checks the coordinates for mode 'raise'. Local besides that check when
    the coordinates share a layout.

    Example: ``np.ravel_multi_index((rows, cols), (4, 5))``.
    """
    name = "numpy.ravel_multi_index"
    coords = [_int_dtensor(name, c) for c in multi_index]
    dims = tuple(operator.index(d) for d in dims)
    if len(coords) != len(dims):
        raise ValueError(f"parameter multi_index must be a sequence of length {len(dims)}")
    if order not in ("C", "F"):
        raise ValueError("only 'C' or 'F' order is permitted")
    modes = (mode,) * len(dims) if isinstance(mode, str) else tuple(mode)
    fixed = []
    for c, n, m in zip(coords, dims, modes):
        fixed.append(_in_range(c.astype(np.intp), n, m,
                               "invalid entry in coordinates array"))
    pairs = list(zip(fixed, dims))
    if order == "F":
        pairs = pairs[::-1]
    flat = pairs[0][0]
    for c, n in pairs[1:]:
        flat = flat * n + c
    return flat


@_registry.implements(np.sort_complex)
def sort_complex(a):
    """``np.sort_complex`` of a DTensor: NumPy's sort along the last axis (by real
    part, then imaginary), cast to complex as NumPy casts. The sort's own
    communication (a sample sort when that axis is sharded).

    Example: ``np.sort_complex(dt)`` of a real ``[Shard(0)]`` vector is complex128.
    """
    b = np.sort(_dtensor("numpy.sort_complex", a))
    if np.issubdtype(b.dtype, np.complexfloating):
        return b
    char = b.dtype.char
    return b.astype("F" if char in "bhBH" else "G" if char == "g" else "D")


@_registry.implements(np.lexsort)
def lexsort(keys, axis=-1):
    """``np.lexsort`` of 1-D DTensor keys of one length (a tuple, or the rows of a
    2-D DTensor, the last key primary): the stable argsort of the first key, then for each next key the
    stable argsort of that key read through the order so far, which the order then
    follows (``a[idx]`` by an integer DTensor, _pick.py). Each step is a sample sort
    and two exchanges of what it picks, never a gather. Collective on the mesh.

    Example: ``np.lexsort((first_names, surnames))`` of two ``[Shard(0)]`` vectors
    (a tuple: NumPy looks into a tuple of keys for DTensors, not into a list).
    """
    name = "numpy.lexsort"
    if type(keys) is DTensor and keys.ndim == 2:
        keys = [keys[i] for i in range(keys.shape[0])]
    if type(keys) is DTensor or not isinstance(keys, (list, tuple)) or not keys or \
            any(type(k) is not DTensor or k.ndim != 1 for k in keys):
        raise _registry.NoRule(f"{name}: the DTensor rule takes a sequence of 1-D "
                               f"DTensor keys")
    if axis not in (-1, 0):
        raise np.exceptions.AxisError(axis, 1)
    if len({k.shape for k in keys}) != 1:
        raise ValueError("all keys need to be the same shape")
    order = np.argsort(keys[0], kind="stable")
    for key in keys[1:]:
        order = order[np.argsort(key[order], kind="stable")]
    return order


@_registry.implements(np.tril_indices_from)
def tril_indices_from(arr, k=0):
    """``np.tril_indices_from`` of a DTensor: from its global shape, plain index
    arrays alike on every rank. Local (no communication).

    Example: ``np.tril_indices_from(dt, -1)``.
    """
    return np.tril_indices_from._implementation(_dtensor("numpy.tril_indices_from", arr),
                                                k)


@_registry.implements(np.triu_indices_from)
def triu_indices_from(arr, k=0):
    """``np.triu_indices_from`` of a DTensor: from its global shape, plain index
    arrays alike on every rank. Local (no communication).

    Example: ``np.triu_indices_from(dt, 1)``.
    """
    return np.triu_indices_from._implementation(_dtensor("numpy.triu_indices_from", arr),
                                                k)


@_registry.implements(np.diag_indices_from)
def diag_indices_from(arr):
    """``np.diag_indices_from`` of a DTensor: from its global shape. Local.

    Example: ``np.diag_indices_from(dt)`` of a (3, 3) ``dt``.
    """
    return np.diag_indices_from._implementation(_dtensor("numpy.diag_indices_from", arr))


@_registry.implements(np.einsum_path)
def einsum_path(*operands, optimize="greedy", einsum_call=False):
    """``np.einsum_path`` with DTensor operands: NumPy's path, from the operands'
    global shapes (stand-ins that hold no data). Local.

    Example: ``np.einsum_path("ij,jk->ik", a, b)[0]``.
    """
    stand_ins = tuple(np.broadcast_to(np.zeros((), v.dtype), v.shape)
                      if type(v) is DTensor else v for v in operands)
    return np.einsum_path(*stand_ins, optimize=optimize, einsum_call=einsum_call)


@_registry.implements(np.vander)
def vander(x, N=None, increasing=False):
    """``np.vander`` of a 1-D DTensor: NumPy's on each rank's block (row i holds the
    powers of element i), the rows placed as ``x``'s elements (a Partial ``x`` is
    reduced first). Local for Shard and Replicate.

    Example: ``np.vander(dt, 3)`` of a ``[Shard(0)]`` vector is ``[Shard(0)]``.
    """
    name = "numpy.vander"
    x = _dtensor(name, x)
    if x.ndim != 1:
        raise ValueError("x must be a one-dimensional array or sequence.")
    n = len(x) if N is None else operator.index(N)
    if n < 0:
        raise ValueError("negative dimensions are not allowed")
    x = D.relayout(name, x, [Replicate() if p.is_partial() else p
                             for p in x._spec.placements])
    spec = x._spec
    dtype = np.vander(np.zeros(1, spec.dtype), max(n, 0)).dtype
    shape = (spec.shape[0], n)
    if spec.mesh._coordinate is None:
        local = D.outside_local(shape, dtype)
    else:
        local = np.vander(x.to_local(), n, increasing=bool(increasing))
    placements = tuple(Shard(0) if isinstance(p, Shard) else p for p in spec.placements)
    return DTensor(np.ascontiguousarray(local), DTensorSpec(
        spec.mesh, placements, shape, dtype, contiguous_strides(shape)))
