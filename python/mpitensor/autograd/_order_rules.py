"""Backward rules of the operations that pick elements by their order or by an
index: np.take_along_axis, np.sort, and the order statistics (np.quantile,
np.percentile, np.median and their nan-variants).

All three send the output's gradient back to the elements it was picked from: a
scatter-add along one axis (``scatter_along_axis``), which runs through the
executor with a dim map of its own, so the gradient stays sharded as the
indices are and a shard of the axis gives a Partial(sum) instead of a gather.
sort picks by its argsort; a quantile by the argsort and NumPy's interpolation
weights between the two order statistics around each q (ties: whichever of the
equal elements the sort puts there, as torch).
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from .._dtensor import DTensor
from .._algorithms import _dispatch as D
from ..placement_types import Replicate
from ._engine import register_backward

__all__ = ["scatter_along_axis"]


def _scatter_local(g, idx, ax, n, shape):
    """``g`` added into zeros of ``shape`` at ``idx`` along ``ax`` (a repeated index
    adds up). Local."""
    out = np.zeros(shape, g.dtype)
    if g.size:
        where = list(np.indices(idx.shape, sparse=True))
        where[ax] = np.where(idx < 0, idx + n, idx)
        np.add.at(out, tuple(where), g)
    return out


def scatter_along_axis(g: DTensor, indices: DTensor, axis: int, n: int) -> DTensor:
    """The adjoint of ``np.take_along_axis(a, indices, axis)`` for an ``a`` of length
    ``n`` along ``axis``: zeros of ``indices``' shape but ``n`` along ``axis``, with
    each element of ``g`` added in where its index points. The other dims keep the
    placements ``g`` and ``indices`` share; where a mesh dim shards ``axis`` each
    rank adds its own indices' part and the result is Partial(sum) there; the new
    axis is whole. Collective on the mesh when an input must move.

    Example: ``scatter_along_axis(g, np.argsort(a, 1), 1, a.shape[1])`` is the
    gradient of ``np.sort(a, 1)`` for ``a``.
    """
    nd = g.ndim
    ax = normalize_axis_index(axis, nd)

    def build():
        # Label ax is summed over (each rank's indices give part of the sum); label
        # nd is the result's whole axis, held by no input.
        kinds = [D.KEEP] * nd + [D.REPLICATE]
        kinds[ax] = D.CONTRACT
        out = [nd if d == ax else d for d in range(nd)]
        return D.dimmap([range(nd), range(nd)], out, kinds, sizes={nd: n},
                        partial_rule=D.P_LINEAR_ONE, partial_inputs=1)

    return D.execute(("scatter_along_axis", ax, n), (g, indices), build,
                     lambda gl, il, shape: _scatter_local(gl, il, ax, n, shape), box=True)


def _fit(gx, x):
    return gx if gx.dtype == x.dtype else gx.astype(x.dtype)


# -- take_along_axis and sort --------------------------------------------------------------

def take_along_axis_grad(g, node, out):
    """np.take_along_axis: the gradient scattered back to the picked elements."""
    b = dict(zip(("arr", "indices", "axis"), node.saved))
    b.update(node.aux or {})
    arr, indices = b["arr"], b["indices"]
    ax = normalize_axis_index(operator.index(b.get("axis", -1)), arr.ndim)
    return (_fit(scatter_along_axis(g, indices, ax, arr.shape[ax]), arr), None)


def take_along_axis_supported(args, kwargs) -> bool:
    axis = kwargs.get("axis", args[2] if len(args) > 2 else -1)
    return axis is not None and type(args[1]) is DTensor


def sort_grad(g, node, out):
    """np.sort: the gradient of the k-th smallest goes back to where it was, by a
    stable argsort of the input (over the flattened input when ``axis`` is None)."""
    b = dict(zip(("a", "axis", "kind", "order"), node.saved))
    b.update(node.aux or {})
    a, axis = b["a"], b.get("axis", -1)
    flat = a.reshape(-1) if axis is None else a
    ax = 0 if axis is None else normalize_axis_index(operator.index(axis), a.ndim)
    order = np.argsort(flat, axis=ax, kind="stable")
    gx = scatter_along_axis(g, order, ax, flat.shape[ax])
    return (_fit(gx.reshape(a.shape) if axis is None else gx, a),)


# -- quantiles ---------------------------------------------------------------------------

def _weights(q, n, method) -> np.ndarray:
    """(len(q), n): how much each sorted element of a lane of ``n`` adds to each
    quantile ``q`` (in [0, 1]), by NumPy's positions for ``method``."""
    w = np.zeros((q.size, n))
    for i, qi in enumerate(q):
        pos = qi * (n - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, n - 1)
        gamma = pos - lo
        if method == "linear":
            w[i, lo] += 1.0 - gamma
            w[i, hi] += gamma
        elif method == "lower":
            w[i, lo] = 1.0
        elif method == "higher":
            w[i, int(np.ceil(pos))] = 1.0
        elif method == "midpoint":
            w[i, lo] += 0.5
            w[i, int(np.ceil(pos))] += 0.5
        else:  # nearest: NumPy rounds half to even
            w[i, int(np.around(pos))] = 1.0
    return w


_METHODS = ("linear", "lower", "higher", "midpoint", "nearest")
_QUANTILE_ARGS = ("a", "q", "axis", "out", "overwrite_input", "method", "keepdims")


def _lane_weights(q, count, n, method):
    """(kept..., n): the weights of one quantile ``q`` on the sorted positions of
    lanes that hold ``count`` values that are not NaN (a DTensor, kept + (1,)),
    NaNs sorted last, by NumPy's positions for ``method``. A lane of NaNs only has
    none."""
    mesh = count.device_mesh
    k = DTensor.from_local(np.arange(n, dtype=np.float64), mesh, [Replicate()] * mesh.ndim)
    pos = (count - 1) * q
    lo = np.floor(pos)
    up = np.ceil(pos)
    if method == "linear":
        gamma = pos - lo
        hi = np.minimum(lo + 1, count - 1)
        return (1 - gamma) * (k == lo) + gamma * (k == hi)
    if method == "midpoint":
        return 0.5 * (k == lo) + 0.5 * (k == up)
    at = {"lower": lo, "higher": up, "nearest": np.rint(pos)}[method]
    return (k == at) * 1.0


def _nan_spread(gq, lanes, qs, method):
    """The output's gradient (kept..., one per q) on the sorted positions of
    ``lanes`` (kept..., n) whose NaNs are left out, as np.nanquantile leaves them."""
    n = lanes.shape[-1]
    count = np.sum(~np.isnan(lanes), axis=-1, keepdims=True).astype(np.float64)
    spread = None
    for i, qi in enumerate(qs):
        part = gq[..., i:i + 1] * _lane_weights(float(qi), count, n, method)
        spread = part if spread is None else spread + part
    return spread


def _order_stat_grad(g, a, q, axis, keepdims, method, nan=False):
    """The gradient of ``np.quantile(a, q, axis, method=method, keepdims=keepdims)``
    (``q`` in [0, 1]; np.nanquantile's with ``nan``) for ``a``: the reduced axes
    moved last and merged into one, a stable argsort along it, the output gradient
    spread on the sorted positions by the interpolation weights, and scattered
    back."""
    axes = tuple(range(a.ndim)) if axis is None else normalize_axis_tuple(axis, a.ndim)
    kept = tuple(d for d in range(a.ndim) if d not in axes)
    kept_shape = tuple(a.shape[d] for d in kept)
    n = int(np.prod([a.shape[d] for d in axes], dtype=np.int64))
    perm = kept + axes
    lanes = np.transpose(a, perm).reshape(kept_shape + (n,))
    q = np.asarray(q, dtype=np.float64)
    qs = q.reshape(-1)
    mesh = a.device_mesh
    # The output's gradient as (kept dims..., one per q), then onto the sorted lanes.
    gq = g.reshape(qs.shape + kept_shape)
    if kept_shape:
        gq = np.moveaxis(gq, 0, -1)
    if nan:
        spread = _nan_spread(gq, lanes, qs, method).astype(g.dtype)
    else:
        w = DTensor.from_local(_weights(qs, n, method).astype(g.dtype, copy=False), mesh,
                               [Replicate()] * mesh.ndim)
        spread = gq @ w if kept_shape else (gq.reshape(1, -1) @ w).reshape(n)
    order = np.argsort(lanes, axis=-1, kind="stable")
    gx = scatter_along_axis(spread, order, len(kept_shape), n)
    gx = gx.reshape(kept_shape + tuple(a.shape[d] for d in axes))
    gx = np.transpose(gx, tuple(int(i) for i in np.argsort(perm)))
    return (_fit(gx, a),)


def quantile_grad(percent, nan=False):
    """np.quantile (np.percentile with ``percent``; their nan-variants with
    ``nan``)."""
    def backward(g, node, out):
        b = dict(zip(_QUANTILE_ARGS, node.saved))
        b.update(node.aux or {})
        q = np.true_divide(b["q"], 100) if percent else b["q"]
        return _order_stat_grad(g, b["a"], q, b.get("axis"), bool(b.get("keepdims", False)),
                                b.get("method", "linear"), nan)
    return backward


def quantile_supported(args, kwargs) -> bool:
    method = kwargs.get("method", args[5] if len(args) > 5 else "linear")
    return method in _METHODS and kwargs.get("weights") is None


def median_grad(nan):
    """np.median (np.nanmedian with ``nan``): the quantile 0.5, whose weights
    average the middle two of an even lane as NumPy's median does."""
    def backward(g, node, out):
        b = dict(zip(("a", "axis", "out", "overwrite_input", "keepdims"), node.saved))
        b.update(node.aux or {})
        return _order_stat_grad(g, b["a"], 0.5, b.get("axis"),
                                bool(b.get("keepdims", False)), "linear", nan)
    return backward


# function -> (name, backward[, supports(args, kwargs)]), registered below.
_FUNCTIONS = {
    np.take_along_axis: ("take_along_axis", take_along_axis_grad, take_along_axis_supported),
    np.sort: ("sort", sort_grad),
    np.quantile: ("quantile", quantile_grad(False), quantile_supported),
    np.percentile: ("percentile", quantile_grad(True), quantile_supported),
    np.nanquantile: ("nanquantile", quantile_grad(False, True), quantile_supported),
    np.nanpercentile: ("nanpercentile", quantile_grad(True, True), quantile_supported),
    np.median: ("median", median_grad(False)),
    np.nanmedian: ("nanmedian", median_grad(True)),
}

for _func, _entry in _FUNCTIONS.items():
    register_backward(_func, *_entry)
del _func, _entry
