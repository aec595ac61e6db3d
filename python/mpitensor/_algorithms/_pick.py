"""Rows of a DTensor picked by indices that are themselves a DTensor: ``dt[idx]`` and
``np.take(dt, idx, axis)`` with ``idx`` an integer DTensor, as ``a[np.argsort(a)]``
makes it.

The result has the index's shape (followed by the rows' other dims) and the
index's layout: each rank answers for its own block of indices. When a mesh dim
``m`` shards the picked dim, each rank sends each index it holds to the rank of
``m`` that owns that row, and the owners send the rows back: two all-to-alls of
variable parts along ``m`` (the indices, then the rows), each row at most once
per request, never the whole array; when every rank's indices fall in its own
block, one flag says so and nothing moves. A mesh dim that shards another dim of the
array keeps it in the result, with the indices made Replicate there (they move,
not the array). Indices out of bounds are an IndexError on every rank (one
agreement).
"""

from __future__ import annotations

import numpy as np

from .. import _comm, _modes, _trace
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from . import _dispatch as D
from . import _row_exchange as X

__all__ = ["pick_rows"]


def _layouts(a, idx):
    """(``a``'s placements, ``idx``'s, the result's, the mesh dim whose rows move)
    for picking rows of ``a`` by ``idx``, per mesh dim: the first that shards dim 0
    of ``a`` exchanges rows, and the result takes ``idx``'s placement there; one
    that shards another dim of ``a``, or holds it Partial, keeps it (picking is
    linear), with ``idx`` Replicate there (the indices move, not the array); a
    Replicate ``a`` takes ``idx``'s placement. A Partial ``idx`` is reduced."""
    mesh, k = a._spec.mesh, idx.ndim
    pa, pi, out, rows = [], [], [], None
    for m, (p, q) in enumerate(zip(a._spec.placements, idx._spec.placements)):
        q = Replicate() if q.is_partial() else q
        if type(q) not in (Shard, Replicate):  # a strided shard: made plain
            q = Replicate()
        if type(p) not in (Shard, Replicate) and not p.is_partial():
            p = Shard(0) if p.dim == 0 else Replicate()
        if isinstance(p, Shard) and p.dim == 0:
            if rows is None and mesh.shape[m] > 1:
                rows = m
            elif mesh.shape[m] > 1:  # a second mesh dim on the rows
                p = Replicate()
            pa.append(p), pi.append(q), out.append(q)
        elif isinstance(p, Shard) or p.is_partial():
            pa.append(p), pi.append(Replicate())
            out.append(Shard(k + p.dim - 1) if isinstance(p, Shard) else p)
        else:
            pa.append(p), pi.append(q), out.append(q)
    return pa, pi, tuple(out), rows


def pick_rows(name: str, a, idx, mode: str = "raise"):
    """``a[idx]`` for an integer DTensor ``idx`` on ``a``'s mesh: rows of dim 0 of
    ``a``, laid out as ``idx`` (see ``_layouts``). ``mode``: NumPy's ``take`` modes
    ('raise', 'wrap', 'clip'). Collective on the mesh.

    Example: ``pick_rows("numpy.take", dt, np.argsort(dt))`` is ``dt`` sorted.
    """
    D.same_mesh(name, [a, idx])
    if idx.dtype.kind not in "iu":
        raise IndexError(f"{name}: arrays used as indices must be of integer (or "
                         f"boolean) type")
    X.check_movable(name, a._spec.dtype)
    pa, pi, out_placements, m = _layouts(a, idx)
    a, idx = D.relayout(name, a, pa), D.relayout(name, idx, pi)
    spec, ispec = a._spec, idx._spec
    mesh = spec.mesh
    n = spec.shape[0]
    shape = tuple(ispec.shape) + tuple(spec.shape[1:])
    if mesh._coordinate is None:
        return _wrap(mesh, out_placements, shape, D.outside_local(shape, spec.dtype))
    want = idx.to_local().astype(np.intp, copy=False).reshape(-1)
    if mode == "wrap":
        want = want % max(n, 1)
    elif mode == "clip":
        want = np.clip(want, 0, max(n - 1, 0))
    bad = want[(want < -n) | (want >= n)] if mode == "raise" else want[:0]
    empty_axis = n == 0 and want.size > 0
    # Every rank learns whether any rank's indices were out of bounds, before any
    # request moves: the exception is every rank's.
    _comm.agree(mesh, not (bad.size or empty_axis), 0,
                "cannot do a non-empty take from an empty axes." if empty_axis else
                f"index {int(bad[0]) if bad.size else 0} is out of bounds for axis 0 "
                f"with size {n}", IndexError)
    want = np.where(want < 0, want + n, want)
    local = a.to_local()
    if m is None:
        got = local[want]
    elif not _comm.any_member(mesh, not _in_block(spec, m, want)):
        # Every rank's indices fall in its own block (rows picked by indices that
        # follow them, as a flat take of a row-sharded prediction by its labels):
        # one flag instead of the exchange.
        got = local[want - int(X.bounds(n, mesh.shape[m])[mesh._coordinate[m]])]
    else:
        got = _exchange(name, spec, m, local, want)
    return _wrap(mesh, out_placements, shape,
                 got.reshape(idx.to_local().shape + got.shape[1:]))


def _in_block(spec, m, want) -> bool:
    """Whether every index of ``want`` is a row of this rank's block along mesh dim
    ``m``."""
    at = X.bounds(spec.shape[0], spec.mesh.shape[m])
    me = spec.mesh._coordinate[m]
    return not want.size or bool(want.min() >= at[me] and want.max() < at[me + 1])


def _exchange(name, spec, m, local, want):
    """The rows ``want`` (global, in bounds) of the array whose dim 0 mesh dim
    ``m`` shards (this rank's block ``local``): each index to its owner, each row
    back. Collective on mesh dim ``m``."""
    mesh = spec.mesh
    p, me = mesh.shape[m], mesh._coordinate[m]
    at = X.bounds(spec.shape[0], p)
    owner = np.searchsorted(at, want, side="right") - 1
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=p).tolist()
    if _modes.tracing:
        _trace.collective(f"{name}: indices to the rows' owners, rows back", mesh,
                          spec.placements, spec.shape, spec.dtype)
    asked, asked_counts = _comm.alltoallv(mesh,
        np.ascontiguousarray(want[order], dtype=np.int64), counts, m)
    rows = np.ascontiguousarray(local[asked - int(at[me])])
    back, _ = _comm.alltoallv(mesh, rows, list(asked_counts), m)
    got = np.empty((len(want),) + local.shape[1:], local.dtype)
    got[order] = back
    return got


def _wrap(mesh, placements, shape, local):
    return DTensor(np.ascontiguousarray(local), DTensorSpec(
        mesh, tuple(placements), tuple(shape), local.dtype, contiguous_strides(shape)))
