"""A strided DTensor read as another layout of the same local elements.

The executor runs a strided DTensor (a ``_StridedShard`` among its placements) as
the plain layout of its expansion (mpitensor/core/strided.h, csrc/ext/ext_strided.c,
and the Python door's plain copies in mpitensor._registry). :func:`restride` is
that reading as a DTensor operation, with a gradient: reshape's views make strided
DTensors with it (_shape.py), and the executor records the views it reads operands
through as its nodes.
"""

from __future__ import annotations

from .. import _registry, _strided
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard, _StridedShard

__all__ = ["expanded", "restride", "is_strided", "on_expansion", "permuted"]


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


def is_strided(a) -> bool:
    """Whether ``a`` is a DTensor placed with a strided shard. Local.

    Example: ``is_strided(dt.reshape(-1))`` is True for an ``(8, 6)`` Shard(1) ``dt``.
    """
    return type(a) is DTensor and _strided.has_strided(a._spec.placements)


def on_expansion(a, run, reduce=False):
    """``run(e)``, ``e`` the strided DTensor ``a`` read as its plain expansion, read
    back as ``a``'s layout: for an entry that acts on each element where it lies,
    whose result has the expansion's shape and placements. With ``reduce`` (a
    nonlinear call) each Partial of ``e`` is reduced to Replicate first, as torch
    reduces one for a nonlinear pointwise op: the result is Replicate there. The
    strided shards stay and move nothing; the views are restride's, so a recorded
    caller's gradient comes back the same way. Local unless a Partial is reduced.

    Example (``mpiexec -n 2``)::

        >>> y = np.reshape(distribute_tensor(np.ones((8, 6)), mesh, [Shard(1)]), 48)
        >>> on_expansion(y, lambda e: e * 2).placements
        (_StridedShard(dim=0, sf=8),)
    """
    e = expanded(a)
    placements = a._spec.placements
    if reduce and any(p.is_partial() for p in placements):
        placements = tuple(Replicate() if p.is_partial() else p for p in placements)
        e = e.redistribute(e._spec.mesh, tuple(Replicate() if p.is_partial() else p
                                                for p in e._spec.placements))
    return restride(run(e), a._spec.shape, placements)


def permuted(a, perm):
    """The strided DTensor ``a`` with its dims in the order ``perm`` (output dim j
    is input dim perm[j]): the local array transposed, a view as NumPy's, every
    shard, strided or not, following its dim with its split factor; Replicate and
    Partial stay. A strided shard only orders the indices of its own dim, so
    the transposed local array holds the transposed layout's elements. Local.

    Example (``mpiexec -n 2``)::

        >>> y = distribute_tensor(np.ones((5, 6)), mesh, [_StridedShard(1, sf=2)])
        >>> permuted(y, (1, 0)).placements
        (_StridedShard(dim=0, sf=2),)
    """
    spec = a._spec
    where = {d: j for j, d in enumerate(perm)}
    placements = tuple(
        _StridedShard(where[p.dim], sf=p.split_factor) if type(p) is _StridedShard
        else Shard(where[p.dim]) if p.is_shard() else p for p in spec.placements)
    shape = tuple(spec.shape[d] for d in perm)
    local = a._data()
    if spec.mesh.get_coordinate() is not None:
        local = local.transpose(perm)
    return DTensor(local, DTensorSpec(spec.mesh, placements, shape, spec.dtype,
                                      contiguous_strides(shape)))


