"""``np.flip`` along an axis a mesh dim shards, when no other dim can take the
shard (a 1-D array): one exchange of reversed runs of rows, not a gather; and
``np.fliplr`` / ``np.flipud``, which are ``np.flip`` along axis 1 / 0.

Rank ``c``'s block, reversed, is the run of output rows ``[n - hi, n - lo)``, so
every rank knows where its rows land in the output's torch.chunk blocks: one
all-to-all of variable parts along the mesh dim (``_row_exchange``) moves them,
and the output keeps ``Shard(axis)``. Flipping is a permutation, so a Partial is
kept.
"""

from __future__ import annotations

import numpy as np

from .. import _comm, _modes, _registry, _trace
from .._dtensor import DTensor
from .._algorithms import _row_exchange as X
from .._algorithms import _views

__all__ = ["flip_sharded", "fliplr", "flipud"]


def flip_sharded(a, ax: int):
    """``np.flip(a, ax)`` by one exchange along the mesh dim that shards ``ax``,
    placed as ``a``. Collective on the mesh.

    Example: ``flip_sharded(dt, 0)`` of a (10,) ``[Shard(0)]`` DTensor.
    """
    name = "numpy.flip"
    X.check_movable(name, a._spec.dtype)
    a, m = X.sharding_mesh_dim(name, a, ax)
    spec = a._spec
    mesh = spec.mesh
    if mesh.get_coordinate() is None:
        return DTensor(np.array(a.to_local(), copy=True), spec)
    n, p, me = spec.shape[ax], mesh.shape[m], mesh._coordinate[m]
    at = X.bounds(n, p).tolist()
    local = X.along(a.to_local(), ax)
    out = np.empty((at[me + 1] - at[me],) + local.shape[1:], local.dtype)

    def run(c, q):
        """The global input rows [g0, g1) coordinate c sends to q (empty: g0 >= g1);
        they land reversed at q's local rows [n - g1 - at[q], n - g0 - at[q])."""
        return max(at[c], n - at[q + 1]), min(at[c + 1], n - at[q])

    # The runs move in input order, each reversed once, where it lands: no reversed
    # copy is made to be sent, and a block that goes to one rank is sent as it is.
    parts, counts = [], [0] * p
    for q in range(p):
        g0, g1 = run(me, q)
        if g0 >= g1:
            continue
        rows = local[g0 - at[me]:g1 - at[me]]
        if q == me:
            out[n - g1 - at[me]:n - g0 - at[me]] = rows[::-1]
        else:
            parts.append(rows)
            counts[q] = g1 - g0
    send = (parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else
            np.empty((0,) + local.shape[1:], local.dtype))
    if _modes.tracing:
        _trace.collective(f"{name}: row exchange", mesh, spec.placements, spec.shape,
                          spec.dtype)
    got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(send), counts, m)
    pos = 0
    for c in range(p):
        g0, g1 = run(c, me)
        if c == me or g0 >= g1:
            continue
        out[n - g1 - at[me]:n - g0 - at[me]] = got[pos:pos + g1 - g0][::-1]
        pos += g1 - g0
    return DTensor(np.ascontiguousarray(np.moveaxis(out, 0, ax)), spec)


def _at_least(name, m, ndim):
    if type(m) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(m).__name__}")
    if m.ndim < ndim:
        raise ValueError(f"Input must be >= {ndim}-d.")


@_registry.implements(np.fliplr, views=True)
def fliplr(m):
    """``np.fliplr``: ``np.flip(m, 1)`` of a DTensor of 2 or more dims. Local unless
    axis 1 is sharded.

    Example: ``np.fliplr(dt)`` of a ``[Shard(0)]`` DTensor moves nothing.
    """
    _at_least("numpy.fliplr", m, 2)
    program = _registry.program_call(np.fliplr)
    out = np.flip(m, 1)
    return as_view(m, out, 1, lambda p: np.flip(p, 1)) if program else out


@_registry.implements(np.flipud, views=True)
def flipud(m):
    """``np.flipud``: ``np.flip(m, 0)`` of a DTensor of 1 or more dims. Local unless
    axis 0 is sharded; a sharded 1-D array flips by one exchange.

    Example: ``np.flipud(dt)`` of a ``[Shard(1)]`` DTensor moves nothing.
    """
    _at_least("numpy.flipud", m, 1)
    program = _registry.program_call(np.flipud)
    out = np.flip(m, 0)
    return as_view(m, out, 0, lambda p: np.flip(p, 0)) if program else out


def as_view(m, out, axis, redo):
    """A program's flip ``out`` of ``m`` (``redo(m)``, along ``axis``) as NumPy's,
    a view of ``m`` whose writes reach it and which shows the writes into ``m``,
    also where the elements moved (mpitensor._algorithms._views). Collective on
    the mesh.

    Example: ``as_view(m, out, 0, lambda p: np.flip(p, 0))``.
    """
    def back(p, view, written):
        np.copyto(p, np.flip(view, axis), where=np.flip(written, axis))
    return _views.keep(m, out, redo, back)
