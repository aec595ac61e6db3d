"""Stencils along a sharded axis: ``np.diff`` (and ``np.ediff1d``), ``np.gradient``,
``np.convolve`` and ``np.correlate`` by a halo of the neighbours' rows, never a
gather.

Each output row depends on a few consecutive input rows (``n + 1`` for diff, the
row and ``edge_order`` on each side for gradient, ``len(v)`` for a convolution
with a kernel ``v``). The output is laid out in torch.chunk's blocks of its own
length along the same mesh dim, so every rank knows which input rows each rank
needs: one exchange along that mesh dim (``_row_exchange``) brings each rank its
block's rows plus the few rows of the overlap, from whichever ranks hold them
(several, when shards are short or empty), and NumPy runs on that window. The
functions are linear, so a Partial(sum) is kept. A convolution's kernel is the
small operand: it is made Replicate (a sharded long signal and a short kernel is
the form this rule is for).
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X

__all__ = ["diff_sharded", "gradient", "sliding_window_view", "convolve", "correlate",
           "ediff1d"]


def _spec(a, shape, dtype):
    shape = tuple(shape)
    return DTensorSpec(a._spec.mesh, a._spec.placements, shape, np.dtype(dtype),
                       contiguous_strides(shape))


def _window(name, a, ax, m, ranges) -> np.ndarray:
    """This rank's rows ``ranges[c]`` (c its coordinate on mesh dim ``m``) of axis
    ``ax`` of ``a``, rows first, from whichever ranks hold them. Collective along
    ``m``."""
    spec = a._spec
    p, me = spec.mesh.shape[m], spec.mesh.get_coordinate()[m]
    send = X.along(a.to_local(), ax)
    lo, hi = ranges[me]
    out = np.empty((max(hi - lo, 0),) + send.shape[1:], spec.dtype)
    return X.exchange(name, spec, m, send, X.gathers(X.bounds(spec.shape[ax], p), ranges),
                      out)


def _back(rows, ax) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(rows, 0, ax))


def diff_sharded(a, n, ax, m):
    """``np.diff(a, n, axis=ax)`` (no prepend or append) when mesh dim ``m`` shards
    ``ax``: each rank's output block needs its ``n`` following input rows, one
    exchange along ``m``; the output keeps ``Shard(ax)``. Collective on the mesh.

    Example: ``diff_sharded(dt, 1, 0, 0)`` of a (10,) ``[Shard(0)]`` DTensor.
    """
    name = "numpy.diff"
    X.check_movable(name, a._spec.dtype)
    if a._spec.dtype.kind == "b":
        # A difference of booleans is not_equal, which no Partial survives.
        a = D.relayout(name, a, [Replicate() if p.is_partial() else p
                                 for p in a._spec.placements])
    a, m = X.sharding_mesh_dim(name, a, ax)
    shape = list(a._spec.shape)
    length = max(shape[ax] - n, 0)
    shape[ax] = length
    dtype = np.diff(np.zeros((n + 1,), a._spec.dtype), n).dtype
    mesh = a._spec.mesh
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), dtype), _spec(a, shape, dtype))
    at = X.bounds(length, mesh.shape[m])
    ranges = [(int(at[q]), int(at[q + 1]) + n if at[q + 1] > at[q] else int(at[q]))
              for q in range(mesh.shape[m])]
    rows = _window(name, a, ax, m, ranges)
    out = np.diff(rows, n, axis=0) if len(rows) else rows[:0].astype(dtype)
    return DTensor(_back(out, ax), _spec(a, shape, dtype))


@_registry.implements(np.lib.stride_tricks.sliding_window_view)
def sliding_window_view(x, window_shape, axis=None, *, subok=False, writeable=False):
    """``np.lib.stride_tricks.sliding_window_view`` of a DTensor (xarray's rolling):
    along an axis no mesh dim shards, NumPy's view of the local block; along a
    sharded one, each rank's windows need the ``w - 1`` rows after its block, one
    exchange along that mesh dim (never a gather). The window dims come last, not
    sharded; the placements are kept. Read-only, as NumPy's view is; a writeable
    view of a sharded axis would have to reach several ranks' blocks, so
    ``writeable=True`` is NumPy's on the gathered array. Collective on the mesh when
    a windowed axis is sharded.

    Example: ``sliding_window_view(dt, 3, axis=0)`` of a (10, 4) ``[Shard(0)]``
    DTensor is an (8, 4, 3) ``[Shard(0)]`` DTensor.
    """
    name = "numpy.lib.stride_tricks.sliding_window_view"
    if type(x) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(x).__name__}")
    if writeable:
        raise _registry.NoRule(f"{name}: writeable=True has no distributed rule")
    window = tuple(window_shape) if np.iterable(window_shape) else (window_shape,)
    if any(w < 0 for w in window):
        raise ValueError("`window_shape` cannot contain negative values")
    if axis is None:
        if len(window) != x.ndim:
            raise ValueError(f"Since axis is `None`, must provide window_shape for all "
                             f"dimensions of `x`; got {len(window)} window_shape elements "
                             f"and `x.ndim` is {x.ndim}.")
        axes = tuple(range(x.ndim))
    else:
        axes = normalize_axis_tuple(axis, x.ndim, allow_duplicate=True)
        if len(window) != len(axes):
            raise ValueError(f"Must provide matching length window_shape and axis; got "
                             f"{len(window)} window_shape elements and {len(axes)} axes "
                             f"elements.")
    shape = list(x.shape)
    for ax, w in zip(axes, window):
        if shape[ax] < w:
            raise ValueError("window shape cannot be larger than input array shape")
        shape[ax] -= w - 1
    out = x
    for ax, w in zip(axes, window):
        out = _windows_along(name, out, ax, operator.index(w))
    return out


def _windows_along(name, a, ax, w):
    """The windows of ``w`` rows along axis ``ax`` of ``a``, a new last dim."""
    a, m = X.sharding_mesh_dim(name, a, ax)
    spec = a._spec
    shape = list(spec.shape)
    shape[ax] -= w - 1
    shape.append(w)
    out_spec = DTensorSpec(spec.mesh, spec.placements, tuple(shape), spec.dtype,
                           contiguous_strides(tuple(shape)))
    mesh = spec.mesh
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), spec.dtype), out_spec)
    if m is None:
        local = np.lib.stride_tricks.sliding_window_view(a.to_local(), w, axis=ax)
    else:
        X.check_movable(name, spec.dtype)
        at = X.bounds(shape[ax], mesh.shape[m])
        ranges = [(int(at[q]), int(at[q + 1]) + w - 1 if at[q + 1] > at[q] else int(at[q]))
                  for q in range(mesh.shape[m])]
        rows = _window(name, a, ax, m, ranges)
        views = (np.lib.stride_tricks.sliding_window_view(rows, w, axis=0) if len(rows)
                 else np.empty(rows.shape + (w,), spec.dtype))
        local = np.moveaxis(views, 0, ax)
    local = np.ascontiguousarray(local)
    local.flags.writeable = False
    return DTensor(local, out_spec)


def _spacing(name, f, varargs, axes):
    """Per axis, NumPy's reading of a spacing: a scalar, or the differences of a
    coordinate array (a scalar again when they are all equal, as NumPy decides on
    the whole axis). Coordinate arrays are ndarrays every rank passes alike; a
    DTensor of coordinates has no distributed rule."""
    if not varargs:
        return [1.0] * len(axes)
    if len(varargs) == 1 and np.ndim(varargs[0]) == 0:
        varargs = list(varargs) * len(axes)
    if len(varargs) != len(axes):
        raise TypeError("invalid number of arguments")
    out = []
    for h, ax in zip(varargs, axes):
        if isinstance(h, DTensor):
            raise _registry.NoRule(f"{name}: a DTensor of coordinates has no distributed "
                                   f"rule")
        h = np.asanyarray(h)
        if h.ndim == 0:
            out.append(h)
            continue
        if h.ndim != 1:
            raise ValueError("distances must be either scalars or 1d")
        if len(h) != f.shape[ax]:
            raise ValueError("when 1d, distances must match the length of the "
                             "corresponding dimension")
        if np.issubdtype(h.dtype, np.integer):
            h = h.astype(np.float64)
        dx = np.diff(h)
        out.append(dx[0] if (dx == dx[0]).all() else dx)
    return out


def _nonuniform(rows, dx, edge_order):
    """np.gradient along axis 0 of ``rows`` whose spacings are ``dx`` (one per
    pair of rows), by NumPy's non-uniform formulas in NumPy's order of operations,
    so that a window of rows gives the bits the whole axis gives: NumPy itself
    would take its uniform formula on a window whose spacings happen to be equal."""
    def col(v):
        return np.reshape(v, (-1,) + (1,) * (rows.ndim - 1))
    out = np.empty_like(rows)
    dx1, dx2 = dx[0:-1], dx[1:]
    a = -(dx2) / (dx1 * (dx1 + dx2))
    b = (dx2 - dx1) / (dx1 * dx2)
    c = dx1 / (dx2 * (dx1 + dx2))
    out[1:-1] = col(a) * rows[:-2] + col(b) * rows[1:-1] + col(c) * rows[2:]
    if edge_order == 1:
        out[0] = (rows[1] - rows[0]) / dx[0]
        out[-1] = (rows[-1] - rows[-2]) / dx[-1]
        return out
    dx1, dx2 = dx[0], dx[1]
    a = -(2. * dx1 + dx2) / (dx1 * (dx1 + dx2))
    b = (dx1 + dx2) / (dx1 * dx2)
    c = - dx1 / (dx2 * (dx1 + dx2))
    out[0] = a * rows[0] + b * rows[1] + c * rows[2]
    dx1, dx2 = dx[-2], dx[-1]
    a = (dx2) / (dx1 * (dx1 + dx2))
    b = - (dx2 + dx1) / (dx1 * dx2)
    c = (2. * dx2 + dx1) / (dx2 * (dx1 + dx2))
    out[-1] = a * rows[-3] + b * rows[-2] + c * rows[-1]
    return out


def _gradient_rows(rows, h, edge_order, lo):
    """np.gradient along axis 0 of a window of rows starting at row ``lo`` of the
    axis: ``h`` a scalar spacing, or the axis' spacings (the window's are taken)."""
    if np.ndim(h) == 0:
        return np.gradient(rows, h, axis=0, edge_order=edge_order)
    if len(rows) < edge_order + 1:
        raise ValueError("Shape of array too small to calculate a numerical gradient, "
                         "at least (edge_order + 1) elements are required.")
    if rows.dtype.kind in "iu":
        rows = rows.astype(np.float64)
    return _nonuniform(rows, h[lo:lo + len(rows) - 1], edge_order)


@_registry.implements(np.gradient)
def gradient(f, *varargs, axis=None, edge_order=1):
    """``np.gradient`` of a DTensor, with scalar spacings or coordinate arrays (the
    same ndarray on every rank, as xarray's differentiate passes): along an axis no
    mesh dim shards, local; along a sharded one, each rank's block with ``edge_order``
    rows of halo on each side, one exchange along the sharding mesh dim (never a
    gather). Each result is placed as ``f`` (float64 for integer input).
    Collective on the mesh when an axis is sharded.

    Example: ``np.gradient(dt)`` of a (10,) ``[Shard(0)]`` DTensor is a
    ``[Shard(0)]`` DTensor.
    """
    name = "numpy.gradient"
    f = D.implicit((f,) + varargs)[0]  # DTensor coordinates beside an ndarray
    if type(f) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(f).__name__}")
    axes = tuple(range(f.ndim)) if axis is None else normalize_axis_tuple(axis, f.ndim)
    spacing = _spacing(name, f, varargs, axes)
    edge_order = operator.index(edge_order)
    if edge_order > 2:
        raise ValueError("'edge_order' greater than 2 not supported")
    for ax in axes:
        if f.shape[ax] < edge_order + 1:
            raise ValueError("Shape of array too small to calculate a numerical gradient, "
                             "at least (edge_order + 1) elements are required.")
    kind = f._spec.dtype.kind
    if kind not in "iufc":
        raise _registry.NoRule(f"{name}: DTensors of dtype {f._spec.dtype} have no "
                               f"distributed rule")
    dtype = np.dtype(np.float64) if kind in "iu" else f._spec.dtype
    X.check_movable(name, f._spec.dtype)
    outs = [_gradient_along(name, f, ax, h, edge_order, dtype)
            for ax, h in zip(axes, spacing)]
    return outs[0] if len(axes) == 1 else tuple(outs)


def _gradient_along(name, f, ax, h, edge_order, dtype):
    g, m = X.sharding_mesh_dim(name, f, ax)
    mesh = g._spec.mesh
    spec = _spec(g, g._spec.shape, dtype)
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), dtype), spec)
    if m is None:
        local = g.to_local()
        out = (_back(_gradient_rows(np.moveaxis(local, ax, 0), h, edge_order, 0), ax)
               if local.size else local.astype(dtype))
        return DTensor(np.ascontiguousarray(out, dtype), spec)
    n, p, me = g._spec.shape[ax], mesh.shape[m], mesh.get_coordinate()[m]
    at = X.bounds(n, p)
    ranges = []
    for q in range(p):
        lo, hi = int(at[q]), int(at[q + 1])
        ranges.append((max(lo - edge_order, 0), min(hi + edge_order, n)) if hi > lo
                      else (lo, lo))
    rows = _window(name, g, ax, m, ranges)
    lo, hi = int(at[me]), int(at[me + 1])
    if hi > lo:
        out = _gradient_rows(rows, h, edge_order, ranges[me][0])
        out = out[lo - ranges[me][0]:hi - ranges[me][0]]
    else:
        out = rows.astype(dtype)
    return DTensor(_back(np.asarray(out, dtype), ax), spec)


_MODES = ("full", "same", "valid")


def _signal_and_kernel(name, a, v, swap):
    mesh = next(x._spec.mesh for x in (a, v) if type(x) is DTensor)
    # A plain array beside the DTensor (the usual kernel) is the same on every
    # rank, as the fallback would take it too: a Replicate DTensor, made locally.
    a, v = (x if type(x) is DTensor else
            DTensor.from_local(np.ascontiguousarray(x), mesh, [Replicate()] * mesh.ndim)
            for x in (a, v))
    if a.ndim == 0 or v.ndim == 0:
        raise _registry.NoRule(f"{name}: 0-d DTensors have no distributed rule")
    if a.ndim != 1 or v.ndim != 1:
        raise ValueError("object too deep for desired array")
    if a.shape[0] == 0:
        raise ValueError("a cannot be empty")
    if v.shape[0] == 0:
        raise ValueError("v cannot be empty")
    D.same_mesh(name, (a, v))
    if v.shape[0] > a.shape[0]:
        if not swap:
            raise _registry.NoRule(f"{name}: a kernel longer than the signal has no "
                                   f"distributed rule")
        a, v = v, a
    return a, v


def _convolution(name, a, v, mode, correlate):
    """``np.convolve(a, v, mode)`` (``correlate``: of ``v`` reversed and conjugated,
    which is ``np.correlate`` when ``a`` is the longer) of the 1-D DTensor signal
    ``a`` by the kernel ``v``."""
    if isinstance(mode, (int, np.integer)) and not isinstance(mode, bool) and \
            0 <= mode < len(_MODES):
        mode = _MODES[::-1][mode]
    if mode not in _MODES:
        raise ValueError("Use one of 'valid', 'same', or 'full' for convolve/correlate mode")
    a, v = _signal_and_kernel(name, a, v, swap=not correlate)
    dtype = np.convolve(np.zeros(1, a._spec.dtype), np.zeros(1, v._spec.dtype)).dtype
    X.check_movable(name, a._spec.dtype)
    kernel = D.relayout(name, v, (Replicate(),) * v._spec.mesh.ndim)
    a, m = X.sharding_mesh_dim(name, a, 0)
    n, k = a._spec.shape[0], v._spec.shape[0]
    length, off = {"full": (n + k - 1, 0), "same": (n, (k - 1) // 2),
                   "valid": (n - k + 1, k - 1)}[mode]
    spec = _spec(a, (length,), dtype)
    mesh = a._spec.mesh
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), dtype), spec)
    w = kernel.to_local()
    if correlate:
        w = w[::-1].conj()
    if m is None:
        full = np.convolve(a.to_local(), w, "full")
        return DTensor(np.ascontiguousarray(full[off:off + length], dtype), spec)
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    at = X.bounds(length, p)
    ranges = []
    for q in range(p):
        k0, k1 = int(at[q]) + off, int(at[q + 1]) + off
        ranges.append((max(k0 - k + 1, 0), min(k1, n)) if k1 > k0 else (0, 0))
    rows = _window(name, a, 0, m, ranges)
    k0, k1 = int(at[me]) + off, int(at[me + 1]) + off
    if k1 > k0:
        start = ranges[me][0]
        out = np.convolve(rows, w, "full")[k0 - start:k1 - start]
    else:
        out = np.empty((0,), dtype)
    return DTensor(np.ascontiguousarray(out, dtype), spec)


@_registry.implements(np.convolve)
def convolve(a, v, mode="full"):
    """``np.convolve`` of 1-D DTensors: the longer one (the signal) keeps its
    Shard, the shorter (the kernel) is made Replicate, and each rank's output
    block takes ``len(kernel) - 1`` rows of halo from its neighbours in one
    exchange along the sharding mesh dim. Collective on the mesh.

    Example: ``np.convolve(signal, kernel, "same")`` of a ``[Shard(0)]`` signal is a
    ``[Shard(0)]`` DTensor.
    """
    return _convolution("numpy.convolve", a, v, mode, False)


@_registry.implements(np.correlate)
def correlate(a, v, mode="valid"):
    """``np.correlate`` of a 1-D DTensor signal ``a`` with a kernel ``v`` no longer
    than it: a convolution by ``v`` reversed and conjugated (see
    :func:`convolve`), a halo exchange, no gather. A longer ``v`` goes to the
    fallback. Collective on the mesh.

    Example: ``np.correlate(signal, kernel, "full")``.
    """
    return _convolution("numpy.correlate", a, v, mode, True)


def _replicated(x, mesh, dtype=None):
    """A plain array the same on every rank as a Replicate DTensor, made locally."""
    x = np.ascontiguousarray(x, dtype)
    return DTensor.from_local(x, mesh, [Replicate()] * mesh.ndim, shape=x.shape,
                              stride=contiguous_strides(x.shape))


@_registry.implements(np.ediff1d)
def ediff1d(ary, to_end=None, to_begin=None):
    """``np.ediff1d`` of a DTensor: ``np.diff`` of the flattened array (a halo of
    one row along a sharded axis), with ``to_begin`` and ``to_end`` (arrays the
    same on every rank) joined on by ``np.concatenate`` (one exchange of rows when
    the result is sharded). Collective on the mesh then.

    Example: ``np.ediff1d(dt, to_begin=0)`` of a (10,) ``[Shard(0)]`` DTensor.
    """
    name = "numpy.ediff1d"
    if type(ary) is not DTensor or ary._spec.dtype.kind == "b":
        raise _registry.NoRule(f"{name}: has no distributed rule for these arguments")
    dtype = ary._spec.dtype
    flat = ary if ary.ndim == 1 else np.ravel(ary)
    parts = [np.diff(flat)]
    for label, extra, at in (("to_begin", to_begin, 0), ("to_end", to_end, 1)):
        if extra is None:
            continue
        if isinstance(extra, DTensor):
            raise _registry.NoRule(f"{name}: a DTensor {label} has no distributed rule")
        extra = np.asanyarray(extra)
        if not np.can_cast(extra, dtype, casting="same_kind"):
            raise TypeError(f"dtype of `{label}` must be compatible with input `ary` under "
                            f"the `same_kind` rule.")
        piece = _replicated(extra.ravel(), ary._spec.mesh, dtype)
        parts.insert(0, piece) if at == 0 else parts.append(piece)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
