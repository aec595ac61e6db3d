"""A strided DTensor read as another layout of the same local elements.

The executor runs a strided DTensor (a ``_StridedShard`` among its placements) as
the plain layout of its expansion (mpitensor/core/strided.h, csrc/ext/ext_strided.c
and ext_plain.c). :func:`restride` is that reading as a DTensor operation, with a
gradient: reshape's views make strided DTensors with it (_shape.py), and the
executor records the views it reads operands through as its nodes.
"""

from __future__ import annotations

from .. import _C, _registry, _strided
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides

__all__ = ["expanded", "restride"]


def restride(a, shape, placements, copy=False):
    """The same local elements read as the layout ``(shape, placements)``: a local
    reshape, checked to hold the same elements on every rank (ValueError if not).
    Local; the local array is a view where NumPy's reshape gives one. Recorded for
    autograd (the gradient comes back the same way).

    Example (``mpiexec -n 2``)::

        >>> x = distribute_tensor(np.arange(48.0).reshape(8, 6), mesh, [Shard(1)])
        >>> restride(x, (48,), (_StridedShard(0, sf=8),)).placements
        (_StridedShard(dim=0, sf=8),)
    """
    return _registry.call(restride, a, layout=(tuple(shape), tuple(placements)),
                          copy=copy)


@_registry.implements(restride, takes_strided=True)
def _restride(a, *, layout, copy=False):
    shape, placements = layout
    spec = a._spec
    mesh = spec.mesh
    if not _strided.same_elements(spec.shape, spec.placements, shape, placements,
                                  mesh.shape):
        raise ValueError(
            f"the layout {spec.placements} of shape {spec.shape} is not a view of "
            f"{placements} of shape {tuple(shape)}")
    local = a._data()
    coord = mesh.get_coordinate()
    if coord is not None:
        box = _strided.local_shape(shape, placements, mesh.shape, coord)
        local = local.reshape(box)
        if copy:
            local = local.copy()
    return DTensor(local, DTensorSpec(mesh, tuple(placements), tuple(shape), spec.dtype,
                                      contiguous_strides(tuple(shape))))


def expanded(a):
    """``a`` read as its plain expansion: a local reshape, recorded as
    :func:`restride`, no communication.

    Example (``mpiexec -n 2``)::

        >>> y = np.reshape(distribute_tensor(np.ones((8, 6)), mesh, [Shard(1)]), 48)
        >>> expanded(y).placements, expanded(y).shape
        ((Shard(dim=1),), (8, 6))
    """
    shape, placements, _ = _strided.expand(a._spec.shape, a._spec.placements,
                                           a._spec.mesh.shape)
    return restride(a, shape, placements)


_C.set_hook("view", restride)
