"""Functions on DTensors and plain ndarrays, after torch.nn.functional.

softmax and log_softmax normalise along ``axis``: for a DTensor that dim must be
whole on every rank, so its label is REPLICATE (a Shard of it is gathered first,
and it stays Replicate in the output) while every other Shard is kept; a Partial
input is reduced first (softmax is not linear). Both are numerically stable (the
maximum along ``axis`` is subtracted before exponentiating).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .._ops import _dispatch as D

__all__ = ["softmax", "log_softmax"]


def _softmax_local(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax_local(x, axis):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _apply(name, func, x, axis):
    from .._api import DTensor

    if type(x) is not DTensor:
        x = np.asarray(x)
        if x.dtype.kind not in "fc":
            x = x.astype(np.float64)
        if x.ndim == 0:
            return func(x.reshape(1), 0).reshape(())
        return func(x, normalize_axis_index(axis, x.ndim))
    if x.ndim == 0:
        raise ValueError(f"mpitensor.nn.functional.{name}: a 0-d DTensor has no axis")
    ax = normalize_axis_index(axis, x.ndim)
    n = x.ndim
    mesh = x._spec.mesh

    def build():
        kinds = [D.REPLICATE if d == ax else D.KEEP for d in range(n)]
        return D.dimmap([range(n)], range(n), kinds)

    dec = D.decide(D.input_key((name, ax), (x,)), mesh, (x,), build)
    (local,) = D.local_inputs(mesh, (x,), dec)
    if local.dtype.kind not in "fc":
        local = local.astype(np.float64)
    if local.size == 0:
        return D.wrap(mesh, dec, np.empty(local.shape, np.result_type(local, 1.0)))
    return D.wrap(mesh, dec, func(local, ax))


def softmax(x, axis: int = -1):
    """exp(x) / sum(exp(x), axis), computed stably. For a DTensor the result keeps
    every Shard except along ``axis``, which is Replicate. Integer inputs give
    float64."""
    return _apply("softmax", _softmax_local, x, axis)


def log_softmax(x, axis: int = -1):
    """log(softmax(x, axis)), computed stably as x - max - log(sum(exp(x - max)))."""
    return _apply("log_softmax", _log_softmax_local, x, axis)
