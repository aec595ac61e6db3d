"""``np.take`` of a DTensor by integer indices the same on every rank.

Taking along an axis is indexing that axis with an integer array: the axis moves
to the front (a permutation, local), the rows are picked as ``dt[[i, j, ...]]``
picks them (``_advanced_index``: local when no mesh dim shards the axis, else one
all-to-all of variable parts that sends each picked row straight to the rank
whose output shard lists it, never a gather), and the index dims move back to
where the axis was. ``mode='wrap'`` and ``'clip'`` only rewrite the indices first.
Indices given as a DTensor are answered where they lie (``_pick``: each index to
the row's owner, the rows back); ``out=`` goes to the fallback.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from .._algorithms._pick import pick_rows

__all__ = ["take"]


def _indices(indices, n, mode):
    """The indices as non-negative intp, checked or rewritten by ``mode``."""
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iu":
        if idx.size:
            raise _registry.NoRule("numpy.take: indices that are not integers have no "
                                   "distributed rule")
        idx = idx.astype(np.intp)
    if mode not in ("raise", "wrap", "clip"):
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    if idx.size and n == 0:
        raise IndexError("cannot do a non-empty take from an empty axes.")
    if mode == "wrap":
        idx = idx % max(n, 1)
    elif mode == "clip":
        idx = np.clip(idx, 0, max(n - 1, 0))
    else:
        bad = idx[(idx < -n) | (idx >= n)]
        if bad.size:
            raise IndexError(f"index {int(bad.flat[0])} is out of bounds for axis 0 with "
                             f"size {n}")
    return np.where(idx < 0, idx + n, idx).astype(np.intp)


@_registry.implements(np.take)
def take(a, indices, axis=None, out=None, mode="raise"):
    """``np.take`` of a DTensor by integer indices (a list or ndarray, the same on
    every rank): local when no mesh dim shards ``axis``; otherwise each picked row
    goes from its owner to the rank that holds it in the output, one all-to-all
    of variable parts (the output is sharded along the index's first dim).
    ``axis=None`` takes from the flattened array. Collective on the mesh then.

    Example: ``np.take(dt, [4, 0, 4])`` of a (10,) ``[Shard(0)]`` DTensor is a (3,)
    ``[Shard(0)]`` DTensor.
    """
    name = "numpy.take"
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")
    if out is not None:
        raise _registry.NoRule(f"{name}: out= is not supported on DTensors")
    if type(indices) is DTensor and mode not in ("raise", "wrap", "clip"):
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    if axis is None:
        a, ax = (a if a.ndim == 1 else np.ravel(a)), 0
    else:
        ax = normalize_axis_index(axis, a.ndim)
    moved = np.moveaxis(a, ax, 0) if ax else a
    if type(indices) is DTensor:
        # each rank answers for its block of indices (_pick.py)
        got = pick_rows(name, moved, indices, mode)
        k = indices.ndim
        return np.moveaxis(got, list(range(k)), list(range(ax, ax + k))) if ax else got
    idx = _indices(indices, a.shape[ax], mode)
    got = moved[idx.reshape(-1)]
    k = idx.ndim
    if k == 0:
        return got[0]
    if k > 1:
        got = np.reshape(got, idx.shape + got.shape[1:])
    return np.moveaxis(got, list(range(k)), list(range(ax, ax + k))) if ax else got
