"""``np.meshgrid`` of 1-D DTensors, with no communication: each output is one
input laid along its own axis and repeated along the others, so an input's Shard
becomes the output's Shard of that axis (Replicate elsewhere) and each rank
repeats its own part. A Partial input is reduced first.

Inputs that are not all 1-D DTensors go to the fallback (NumPy ravels them).
"""

from __future__ import annotations

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D

__all__ = ["meshgrid"]


def _grid(x, axis, shape, sparse):
    """Input ``x`` laid along ``axis`` of the grid of ``shape`` (ones elsewhere when
    ``sparse``)."""
    x = D.relayout("numpy.meshgrid", x, [Replicate() if p.is_partial() else p
                                         for p in x._spec.placements])
    spec = x._spec
    n = len(shape)
    out_shape = tuple(s if (d == axis or not sparse) else 1 for d, s in enumerate(shape))
    pls = tuple(Shard(axis) if p.is_shard() else Replicate() for p in spec.placements)
    if spec.mesh.get_coordinate() is None:
        local = D.outside_local(out_shape, spec.dtype)
    else:
        piece = x.to_local()
        lined = piece.reshape(tuple(-1 if d == axis else 1 for d in range(n)))
        local_shape = tuple(piece.shape[0] if d == axis else s for d, s in enumerate(out_shape))
        local = np.ascontiguousarray(np.broadcast_to(lined, local_shape))
    return DTensor(local, DTensorSpec(spec.mesh, pls, out_shape, spec.dtype,
                                      contiguous_strides(out_shape)))


@_registry.implements(np.meshgrid)
def meshgrid(*xi, copy=True, sparse=False, indexing="xy"):
    """``np.meshgrid`` of 1-D DTensors: a tuple of DTensors, each input along its own
    axis (the first two swapped with ``indexing="xy"``), its Shard kept on that
    axis. Local: no communication (a Partial input is reduced first).

    Example: ``xx, yy = np.meshgrid(dx, dy)``.
    """
    if indexing not in ("xy", "ij"):
        raise ValueError("Valid values for `indexing` are 'xy' and 'ij'.")
    if not xi or any(type(x) is not DTensor or x.ndim != 1 for x in xi):
        raise _registry.NoRule("numpy.meshgrid: the inputs must all be 1-D DTensors")
    D.same_mesh("numpy.meshgrid", xi)
    axes = list(range(len(xi)))
    if indexing == "xy" and len(xi) > 1:
        axes[0], axes[1] = 1, 0
    shape = [0] * len(xi)
    for x, axis in zip(xi, axes):
        shape[axis] = x.shape[0]
    return tuple(_grid(x, axis, tuple(shape), sparse) for x, axis in zip(xi, axes))
