"""``np.roll`` along an axis a mesh dim shards: one exchange of the rows whose
owner changes, not a gather.

A roll by ``s`` of an axis of ``n`` rows sends row ``i`` to row ``(i + s) % n``;
the input and the output are cut into the same torch.chunk blocks, so every rank
knows where each of its rows lands. Rows that stay on their rank are copied in
place; the others (about ``s`` per rank when the shift is shorter than a block:
the wrapped and the shifted-over rows) go in one all-to-all of variable parts
along the mesh dim (``_row_exchange``). The result keeps the input's placements;
roll is a permutation, so a Partial is kept.
"""

from __future__ import annotations

import numpy as np

from .._dtensor import DTensor
from . import _row_exchange as X

__all__ = ["roll_sharded"]


def roll_sharded(a, shift: int, ax: int, m: int):
    """``np.roll(a, shift, axis=ax)`` when mesh dim ``m`` shards ``ax``: one exchange
    along ``m``, placed as ``a``. Collective on the mesh.

    Example: ``roll_sharded(dt, 3, 0, 0)`` of a (10,) ``[Shard(0)]`` DTensor.
    """
    name = "numpy.roll"
    X.check_movable(name, a._spec.dtype)
    a, m = X.sharding_mesh_dim(name, a, ax)
    spec = a._spec
    mesh = spec.mesh
    n = spec.shape[ax]
    if mesh.get_coordinate() is None or n == 0:
        return DTensor(np.array(a.to_local(), copy=True), spec)
    s = shift % n
    at = X.bounds(n, mesh.shape[m])
    transfers = X.moves(at, at, 0, s, n - s) + X.moves(at, at, n - s, 0, s)
    send = X.along(a.to_local(), ax)
    out = X.exchange(name, spec, m, send, transfers, np.empty_like(send))
    return DTensor(np.ascontiguousarray(np.moveaxis(out, 0, ax)), spec)
