"""Backward rules of the operations that rearrange, select or pad elements:
np.take, np.repeat, np.delete, np.compress, np.extract,
np.pad, np.convolve and np.correlate, the stack and split families beside
np.concatenate and np.split, np.tril, np.triu, np.diagonal, np.trace,
np.partition, np.fliplr, np.flipud and np.ediff1d.

Most of them pick elements along one axis by indices known from the arguments
alone (the same on every rank): their gradient adds each element of the
output's gradient back where it was picked from, by the integer-array
indexing's backward (``take_grad``) along that axis, which sends rows back to
the ranks that own them. The others are linear maps written with operations
that have rules of their own (slices, concatenation, reshape, correlate), so
their placements come from the same decisions as any operation's.
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .._dtensor import DTensor
from ._engine import register_backward
from ._order_rules import scatter_along_axis
from ._rules import _dtensors, _fit, _need, _pad_along, _picked, _split, _zeros

__all__: list = []


def _bound(node, names, **defaults) -> dict:
    """A registered function's arguments by parameter name."""
    b = dict(defaults)
    b.update(zip(names, node.saved))
    b.update(node.aux if isinstance(node.aux, dict) else {})
    return b


def _plain(x) -> np.ndarray:
    """An index or mask argument as an ndarray (a DTensor one is gathered)."""
    return np.asarray(x.full_tensor() if isinstance(x, DTensor) else x)


def _along(a, axis) -> int:
    """The length the indices of ``axis`` (None: the flattened array) run over."""
    return a.size if axis is None else a.shape[normalize_axis_index(axis, a.ndim)]


# -- selections by index ------------------------------------------------------------------

def _take(g, node, out):
    b = _bound(node, ("a", "indices", "axis", "out", "mode"), axis=None, mode="raise")
    a = b["a"]
    n = _along(a, b["axis"])
    idx = _plain(b["indices"]).astype(np.intp)
    idx = np.clip(idx, 0, n - 1) if b["mode"] == "clip" else idx % n
    return (_fit(_picked(g, a, idx, b["axis"]), a), None)


def _repeat(g, node, out):
    """Each element's copies summed: a reshape and a sum for one count, the
    picked-index rule for a count per element."""
    b = _bound(node, ("a", "repeats", "axis"), axis=None)
    a, axis, reps = b["a"], b["axis"], _plain(b["repeats"])
    if reps.size == 1:
        r = int(reps.reshape(()))
        if axis is None:
            return (_fit(np.sum(g.reshape(a.size, r), axis=1).reshape(a.shape), a),)
        ax = normalize_axis_index(axis, a.ndim)
        g = g.reshape(a.shape[:ax] + (a.shape[ax], r) + a.shape[ax + 1:])
        return (_fit(np.sum(g, axis=ax + 1), a),)
    idx = np.repeat(np.arange(_along(a, axis)), reps)
    return (_fit(_picked(g, a, idx, axis), a),)


def _delete(g, node, out):
    b = _bound(node, ("arr", "obj", "axis"), axis=None)
    a = b["arr"]
    obj = b["obj"]
    kept = np.delete(np.arange(_along(a, b["axis"])),
                     _plain(obj) if isinstance(obj, DTensor) else obj)
    return (_fit(_picked(g, a, kept, b["axis"]), a),)


def _second(node, gx) -> tuple:
    """``gx`` as the gradient of the second positional argument, among the node's
    inputs: the positional arguments with a list or tuple (the condition, here)
    counted element by element."""
    first = node.saved[0]
    return (None,) * (len(first) if isinstance(first, (list, tuple)) else 1) + (gx,)


def _compress(g, node, out):
    b = _bound(node, ("condition", "a", "axis"), axis=None)
    a = b["a"]
    kept = np.compress(_plain(b["condition"]), np.arange(_along(a, b["axis"])))
    return _second(node, _fit(_picked(g, a, kept, b["axis"]), a))


def _extract(g, node, out):
    b = _bound(node, ("condition", "arr"))
    a = b["arr"]
    kept = np.flatnonzero(_plain(b["condition"]).reshape(-1)[:a.size])
    return _second(node, _fit(_picked(g, a, kept, None), a))


def _partition(g, node, out):
    """np.partition moves each element to one place: ranking the input and the
    output by a stable argsort pairs each output place with the element that went
    there (equal values in turn), so the gradient is ``g`` read in the output's
    order and scattered in the input's."""
    b = _bound(node, ("a", "kth", "axis"), axis=-1)
    a, axis = b["a"], b["axis"]
    flat, y = (a.reshape(-1), out.reshape(-1)) if axis is None else (a, out)
    ax = 0 if axis is None else normalize_axis_index(operator.index(axis), a.ndim)
    ranked = np.take_along_axis(g.reshape(y.shape), np.argsort(y, axis=ax, kind="stable"),
                                axis=ax)
    gx = scatter_along_axis(ranked, np.argsort(flat, axis=ax, kind="stable"), ax,
                            flat.shape[ax])
    return (_fit(gx.reshape(a.shape), a),)


# -- padding and the correlations -----------------------------------------------------------

_GATHER_MODES = ("edge", "reflect", "symmetric", "wrap")


def _pad_supported(args, kwargs) -> bool:
    mode = kwargs.get("mode", args[2] if len(args) > 2 else "constant")
    return (mode == "constant" or mode in _GATHER_MODES) and \
        kwargs.get("reflect_type", "even") == "even"


def _pad(g, node, out):
    """constant: the gradient's middle (the padding is constants). The other modes
    fill each axis's padding with copies of its elements, axis by axis, so each
    axis's padded indices come from np.pad of a range, and their gradients add
    back where they were copied from."""
    b = _bound(node, ("array", "pad_width", "mode"), mode="constant")
    a, mode = b["array"], b["mode"]
    widths = np.broadcast_to(np.asarray(b["pad_width"], np.intp), (a.ndim, 2))
    for d in range(a.ndim):
        lo, hi = (int(w) for w in widths[d])
        if not lo and not hi:
            continue
        if mode == "constant":
            g = g[(slice(None),) * d + (slice(lo, lo + a.shape[d]),)]
        else:
            idx = np.pad(np.arange(a.shape[d]), (lo, hi), mode=mode)
            shape = g.shape[:d] + (a.shape[d],) + g.shape[d + 1:]
            # the array this axis was padded from exists only as a shape: zeros
            # laid out as the gradient stand in for it
            g = _picked(g, _zeros(shape, g.dtype, g.device_mesh, tuple(g.placements)),
                        idx, d)
    return (_fit(g, a),)


def _mode_start(n: int, m: int, mode: str) -> int:
    """Where NumPy's ``mode`` output of a convolution of lengths n and m starts
    in the full one."""
    return {"full": 0, "same": (min(n, m) - 1) // 2, "valid": min(n, m) - 1}[mode]


def _full(g, n, m, mode):
    """The gradient of a ``mode`` output, zero-padded to the full output's length."""
    lo = _mode_start(n, m, mode)
    return _pad_along(g, 0, lo, n + m - 1 - lo - g.shape[0])


def _convolve(g, node, out):
    """out = a * v (full): the gradients are correlations of the full-length
    gradient with the other operand, over the valid lags (torch's conjugates
    for complex operands, which np.correlate takes)."""
    b = _bound(node, ("a", "v", "mode"), mode="full")
    a, v = b["a"], b["v"]
    gf = _full(g, a.shape[0], v.shape[0], b["mode"])
    ga = _fit(np.correlate(gf, v, "valid"), a) if _need(a) else None
    gv = _fit(np.correlate(gf, a, "valid"), v) if _need(v) else None
    return ga, gv


def _correlate(g, node, out):
    """correlate(a, v) is the convolution of a with conj(v) reversed: that
    convolution's gradients, the second one reversed and conjugated back."""
    b = _bound(node, ("a", "v", "mode"), mode="valid")
    a, v = b["a"], b["v"]
    gf = _full(g, a.shape[0], v.shape[0], b["mode"])
    w = np.flip(np.conj(v) if v.dtype.kind == "c" else v, 0)
    ga = _fit(np.correlate(gf, w, "valid"), a) if _need(a) else None
    gv = None
    if _need(v):
        gw = np.flip(np.correlate(gf, a, "valid"), 0)
        gv = _fit(np.conj(gw) if gw.dtype.kind == "c" else gw, v)
    return ga, gv


# -- the stack family and the split family ---------------------------------------------------

def _cut(g, arrays, shapes, ax):
    """Each input's slice of the gradient along ``ax``, ``shapes`` being the
    inputs as the concatenation took them, reshaped to the inputs' own shapes."""
    grads, lo = [], 0
    for x, shape in zip(arrays, shapes):
        if _need(x):
            gx = g[(slice(None),) * ax + (slice(lo, lo + shape[ax]),)]
            grads.append(_fit(gx.reshape(x.shape), x))
        else:
            grads.append(None)
        lo += shape[ax]
    return tuple(grads)


def _vstack(g, node, out):
    arrays = _dtensors(node.saved[0], out)
    return _cut(g, arrays, [(1,) + x.shape if x.ndim < 2 else x.shape for x in arrays], 0)


def _hstack(g, node, out):
    arrays = _dtensors(node.saved[0], out)
    shapes = [x.shape if x.ndim else (1,) for x in arrays]
    return _cut(g, arrays, shapes, 0 if all(len(s) == 1 for s in shapes) else 1)


def _dstack(g, node, out):
    arrays = _dtensors(node.saved[0], out)
    shapes = [np.atleast_3d(np.empty(x.shape, np.int8)).shape for x in arrays]
    return _cut(g, arrays, shapes, 2)


def _column_stack(g, node, out):
    arrays = _dtensors(node.saved[0], out)
    return _cut(g, arrays, [x.shape + (1,) if x.ndim < 2 else x.shape for x in arrays], 1)


def _append(g, node, out):
    b = _bound(node, ("arr", "values", "axis"), axis=None)
    arrays = _dtensors([b["arr"], b["values"]], out)
    if b["axis"] is None:
        return _cut(g, arrays, [(x.size,) for x in arrays], 0)
    return _cut(g, arrays, [x.shape for x in arrays], normalize_axis_index(b["axis"], g.ndim))


def _split_along(axis_of):
    """hsplit, vsplit and dsplit: np.split's backward along the axis they split."""
    def backward(g, node, out):
        kwargs, i = node.aux
        a, sections = node.saved[0], node.saved[1]
        node_of = _Split((a, sections, axis_of(a)), (kwargs, i))
        return _split(g, node_of, out)
    return backward


class _Split:
    """np.split's node, as ``_split`` reads it, for a function of the family."""

    __slots__ = ("saved", "aux")

    def __init__(self, saved, aux):
        self.saved, self.aux = saved, aux


# -- triangles, diagonals -------------------------------------------------------------------

def _tril(g, node, out):
    b = _bound(node, ("m", "k"), k=0)
    return (_fit(np.tril(g, b["k"]), b["m"]),)


def _triu(g, node, out):
    b = _bound(node, ("m", "k"), k=0)
    return (_fit(np.triu(g, b["k"]), b["m"]),)


def _on_diagonal(g, a, offset, axis1, axis2):
    """Zeros of ``a``'s shape with ``g`` (the diagonal's shape: ``a``'s other dims,
    then the diagonal's length) on the diagonal ``offset`` of dims ``axis1`` and
    ``axis2``. In the last two dims flattened, the diagonal is every (n2 + 1)-th
    element from its first: ``g`` with n2 zeros after each element, shifted to
    that first element, by concatenation and reshape alone."""
    i1, i2 = normalize_axis_index(axis1, a.ndim), normalize_axis_index(axis2, a.ndim)
    moved = np.moveaxis(a, (i1, i2), (-2, -1)).shape
    rest, (n1, n2), length = moved[:-2], moved[-2:], g.shape[-1]
    first = (-offset) * n2 if offset < 0 else offset
    h = _pad_along(np.expand_dims(g, -1), g.ndim, 0, n2)
    h = h.reshape(rest + (length * (n2 + 1),))
    end = n1 * n2 - first - h.shape[-1]
    h = _pad_along(h, len(rest), first, max(end, 0))
    if end < 0:
        h = h[(slice(None),) * len(rest) + (slice(0, n1 * n2),)]
    return np.moveaxis(h.reshape(moved), (-2, -1), (i1, i2))


def _diagonal(g, node, out):
    b = _bound(node, ("a", "offset", "axis1", "axis2"), offset=0, axis1=0, axis2=1)
    a = b["a"]
    return (_fit(_on_diagonal(g, a, operator.index(b["offset"]), b["axis1"], b["axis2"]),
                 a),)


def _trace(g, node, out):
    """The trace is the diagonal's sum: ``g`` spread along the diagonal."""
    b = _bound(node, ("a", "offset", "axis1", "axis2"), offset=0, axis1=0, axis2=1)
    a = b["a"]
    length = np.diagonal(np.empty(a.shape, np.int8), b["offset"], b["axis1"],
                         b["axis2"]).shape[-1]
    spread = np.broadcast_to(np.expand_dims(g, -1), g.shape + (length,))
    return (_fit(_on_diagonal(spread, a, operator.index(b["offset"]), b["axis1"],
                              b["axis2"]), a),)


def _fliplr(g, node, out):
    return (np.flip(g, 1),)


def _flipud(g, node, out):
    return (np.flip(g, 0),)


def _ediff1d(g, node, out):
    """np.diff of the flattened array, between constants that have no gradient."""
    b = _bound(node, ("ary", "to_end", "to_begin"), to_end=None, to_begin=None)
    a = b["ary"]
    lo = 0 if b["to_begin"] is None else np.size(b["to_begin"])
    g = g[lo:lo + max(a.size - 1, 0)]
    gx = _pad_along(g, 0, 1, 0) - _pad_along(g, 0, 0, 1)
    return (_fit(gx.reshape(a.shape), a),)


def _ediff1d_supported(args, kwargs) -> bool:
    a = args[0] if args else kwargs.get("ary")
    return getattr(a, "size", 0) > 1


_FUNCTIONS = {
    np.take: ("take", _take),
    np.repeat: ("repeat", _repeat),
    np.delete: ("delete", _delete),
    np.compress: ("compress", _compress),
    np.extract: ("extract", _extract),
    np.partition: ("partition", _partition),
    np.pad: ("pad", _pad, _pad_supported),
    np.convolve: ("convolve", _convolve),
    np.correlate: ("correlate", _correlate),
    np.vstack: ("vstack", _vstack),
    np.hstack: ("hstack", _hstack),
    np.dstack: ("dstack", _dstack),
    np.column_stack: ("column_stack", _column_stack),
    np.append: ("append", _append),
    np.hsplit: ("hsplit", _split_along(lambda a: 1 if a.ndim > 1 else 0)),
    np.vsplit: ("vsplit", _split_along(lambda a: 0)),
    np.dsplit: ("dsplit", _split_along(lambda a: 2)),
    np.tril: ("tril", _tril),
    np.triu: ("triu", _triu),
    np.diagonal: ("diagonal", _diagonal),
    np.trace: ("trace", _trace),
    np.fliplr: ("fliplr", _fliplr),
    np.flipud: ("flipud", _flipud),
    np.ediff1d: ("ediff1d", _ediff1d, _ediff1d_supported),
}

for _func, _entry in _FUNCTIONS.items():
    register_backward(_func, *_entry)
del _func, _entry
