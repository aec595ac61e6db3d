"""``np.repeat`` of a DTensor: each rank repeats its own rows, then one exchange
re-chunks them.

The output rows of input row ``i`` are ``[cum[i], cum[i + 1])`` (``cum`` the
running sum of the repeats), so each rank's repeated block is a run of output
rows every rank can place, and torch.chunk's blocks of the output are known too:
one all-to-all of variable parts along the mesh dim that shards the axis
(``_row_exchange``) moves the runs whose owner changes. Along an axis no mesh dim
shards, every rank repeats its block and nothing moves. The repeats are a scalar
or one per row (an array the same on every rank, or a DTensor, made whole: they
are the counts, not the data). Repeating copies, so a Partial is kept.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X

__all__ = ["repeat"]


def _counts(name, repeats, n):
    """One count per row as int64, or one int for every row (a scalar or a single
    count), checked as NumPy checks them."""
    if isinstance(repeats, DTensor):
        whole = D.relayout(name, repeats, (Replicate(),) * repeats._spec.mesh.ndim,
                           records=True)
        repeats = whole.to_local()
    r = np.asarray(repeats)
    if r.dtype.kind not in "iub" or r.ndim > 1:
        raise _registry.NoRule(f"{name}: repeats of dtype {r.dtype} or {r.ndim} dims "
                               f"have no distributed rule")
    r = r.astype(np.int64).reshape(-1)
    if r.size == 1:
        # One count for every row: kept a scalar, so that nothing the length of
        # the whole axis is made on each rank.
        if r[0] < 0:
            raise ValueError("negative dimensions are not allowed")
        return int(r[0])
    if r.size != n:
        raise ValueError(f"operands could not be broadcast together with shape ({n},) "
                         f"({r.size},)")
    if (r < 0).any():
        raise ValueError("negative dimensions are not allowed")
    return r


@_registry.implements(np.repeat)
def repeat(a, repeats, axis=None):
    """``np.repeat`` of a DTensor, the repeats a scalar or one per row: local along
    an axis no mesh dim shards; along a sharded one each rank repeats its rows and
    one exchange re-chunks the output, which stays sharded (no gather).
    ``axis=None`` repeats the flattened array. Collective on the mesh then.

    Example: ``np.repeat(dt, 3)`` of a (10,) ``[Shard(0)]`` DTensor is a (30,)
    ``[Shard(0)]`` DTensor.
    """
    name = "numpy.repeat"
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")
    if axis is None:
        a, ax = (a if a.ndim == 1 else np.ravel(a)), 0
    else:
        ax = normalize_axis_index(axis, a.ndim)
    n = a.shape[ax]
    r = _counts(name, repeats, n)
    X.check_movable(name, a._spec.dtype)
    if isinstance(r, int):
        total = n * r
    else:
        cum = np.concatenate([[0], np.cumsum(r)])
        total = int(cum[-1])
    a, m = X.sharding_mesh_dim(name, a, ax)
    spec = a._spec
    mesh = spec.mesh
    shape = spec.shape[:ax] + (total,) + spec.shape[ax + 1:]
    out_spec = DTensorSpec(mesh, spec.placements, shape, spec.dtype, contiguous_strides(shape))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), spec.dtype), out_spec)
    if m is None:
        return DTensor(np.ascontiguousarray(np.repeat(a.to_local(), r, axis=ax)), out_spec)
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    at = X.bounds(n, p)
    if isinstance(r, int):
        mine = np.repeat(a.to_local(), r, axis=ax)
        starts = at * r
    else:
        mine = np.repeat(a.to_local(), r[at[me]:at[me + 1]], axis=ax)
        starts = cum[at]
    dst = X.bounds(total, p)
    if np.array_equal(starts, dst):
        # Every rank's repeated block is already its block of the output (the
        # plan, known alike on every rank, moves nothing): no exchange, no copy.
        return DTensor(np.ascontiguousarray(mine), out_spec)
    send = X.along(mine, ax)
    transfers = X.moves(starts, dst, 0, 0, total)
    out = np.empty((int(dst[me + 1] - dst[me]),) + send.shape[1:], spec.dtype)
    X.exchange(name, spec, m, send, transfers, out)
    return DTensor(np.ascontiguousarray(np.moveaxis(out, 0, ax)), out_spec)
