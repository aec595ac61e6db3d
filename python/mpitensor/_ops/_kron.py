"""``np.kron`` of a DTensor by a small replicated factor, without a gather.

``kron(a, b)`` puts block ``a[i, j, ...] * b`` at ``(i * b.shape[0], j * b.shape[1],
...)``: a rank's block of ``a`` gives a whole box of the output, the rows
``[lo * b.shape[d], hi * b.shape[d])`` along each dim ``d`` its shard covers. Each
rank runs NumPy's kron on its block, and one exchange per sharded dim
(``_row_exchange``) re-chunks those rows into torch.chunk's blocks of the output
along the same mesh dim. ``kron`` is linear in ``a``, so a Partial of ``a`` is
kept. A sharded ``b`` (its blocks interleave in the output), or a ``b`` of more
dims than ``a``, goes to the fallback.
"""

from __future__ import annotations

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X

__all__ = ["kron"]


@_registry.implements(np.kron)
def kron(a, b):
    """``np.kron(a, b)`` of a DTensor ``a`` (any placements) and a replicated ``b``
    (a Replicate DTensor, or an array the same on every rank) of no more dims:
    NumPy on each rank's block, then one exchange of rows per sharded dim; the
    output is placed as ``a``. Collective on the mesh when ``a`` is sharded.

    Example: ``np.kron(dt, np.ones((2, 2)))`` of a (4, 3) ``[Shard(0)]`` DTensor is
    an (8, 6) ``[Shard(0)]`` DTensor.
    """
    name = "numpy.kron"
    if type(a) is not DTensor:
        raise _registry.NoRule(f"{name}: a DTensor as the second factor only has no "
                               f"distributed rule")
    mesh = a._spec.mesh
    if type(b) is DTensor:
        D.same_mesh(name, (a, b))
        if any(not p.is_replicate() for p in b._spec.placements):
            raise _registry.NoRule(f"{name}: a second factor that is not Replicate has no "
                                   f"distributed rule")
        b = b.to_local()
    b = np.asarray(b)
    if b.ndim > a.ndim or a.ndim == 0 or b.dtype == object:
        raise _registry.NoRule(f"{name}: a second factor of more dims than the first has "
                               f"no distributed rule")
    b = b.reshape((1,) * (a.ndim - b.ndim) + b.shape)
    dtype = np.result_type(a._spec.dtype, b.dtype)
    X.check_movable(name, dtype)
    cut = {}
    for ax in range(a.ndim):
        a, m = X.sharding_mesh_dim(name, a, ax)
        if m is not None:
            cut[ax] = m
    spec = a._spec
    shape = tuple(n * k for n, k in zip(spec.shape, b.shape))
    out_spec = DTensorSpec(mesh, spec.placements, shape, dtype, contiguous_strides(shape))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), dtype), out_spec)
    local = np.asarray(np.kron(a.to_local(), b), dtype)
    for ax, m in cut.items():
        p, me = mesh.shape[m], mesh.get_coordinate()[m]
        k = b.shape[ax]
        src, dst = X.bounds(spec.shape[ax], p) * k, X.bounds(shape[ax], p)
        send = X.along(local, ax)
        out = np.empty((int(dst[me + 1] - dst[me]),) + send.shape[1:], dtype)
        X.exchange(name, spec, m, send, X.moves(src, dst, 0, 0, shape[ax]), out)
        local = np.moveaxis(out, 0, ax)
    return DTensor(np.ascontiguousarray(local), out_spec)
