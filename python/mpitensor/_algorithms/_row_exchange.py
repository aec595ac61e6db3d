"""Moving runs of rows along a sharded axis: the one exchange behind the rules that
re-chunk, shift or widen an axis a mesh dim shards (concatenate and split along
it, roll, pad, and the halos of diff, gradient, convolve and correlate).

Such an axis is cut by one mesh dim ``m`` into torch.chunk's blocks, so every rank
knows which global rows every other rank holds, and which rows every other rank
needs: the ranks agree on the whole plan without talking. A plan is a list of
transfers ``(src, src_row, dst, dst_row, length)``: ``length`` consecutive rows of
coordinate ``src``'s send buffer go to coordinate ``dst``'s receive buffer, both
counted in local rows. Rows a rank keeps are copied in place; the others move in
one all-to-all of variable parts along ``m`` (each row at most once per
destination), so a rule moves only the rows whose owner changes, never the
whole array.
"""

from __future__ import annotations

import numpy as np

from .. import _comm, _modes, _registry, _trace
from .._bind.core import chunk_sizes
from .._clib import dtype_code
from ..placement_types import Replicate, Shard
from . import _dispatch as D

__all__ = ["bounds", "cut", "moves", "gathers", "exchange", "sharding_mesh_dim", "along",
           "check_movable"]


def bounds(n: int, p: int) -> np.ndarray:
    """The p + 1 row bounds of torch.chunk's blocks of ``n`` rows over ``p`` ranks.

    Example: ``bounds(5, 4).tolist() == [0, 2, 4, 5, 5]``.
    """
    return np.concatenate([[0], np.cumsum(chunk_sizes(n, p), dtype=np.int64)])


def cut(at: np.ndarray, start: int, length: int):
    """The runs ``(rank, local_row, offset, run_length)`` in which the global rows
    ``[start, start + length)`` of an axis chunked at bounds ``at`` lie: ``offset``
    is the run's position within the range. Local.

    Example: ``list(cut(bounds(5, 2), 2, 2)) == [(0, 2, 0, 1), (1, 0, 1, 1)]``.
    """
    row, end = start, start + length
    q = int(np.searchsorted(at, row, side="right")) - 1
    while row < end:
        run = min(end, int(at[q + 1])) - row
        if run > 0:
            yield q, row - int(at[q]), row - start, run
            row += run
        q += 1


def moves(src_at, dst_at, src_start: int, dst_start: int, length: int) -> list:
    """The transfers that take global rows ``[src_start, src_start + length)`` of an
    axis chunked at bounds ``src_at`` to rows ``[dst_start, ...)`` of one chunked at
    ``dst_at`` (each rank's buffer holding its own block). Local.

    Example: ``moves(bounds(4, 2), bounds(4, 2), 0, 1, 3)`` shifts rows down by one.
    """
    out = []
    for c, row, off, run in cut(src_at, src_start, length):
        for q, drow, doff, drun in cut(dst_at, dst_start + off, run):
            out.append((c, row + doff, q, drow, drun))
    return out


def gathers(src_at, ranges) -> list:
    """The transfers that fill each rank q's buffer with global rows
    ``ranges[q] = (start, stop)`` of an axis chunked at ``src_at`` (a halo: rows may
    go to several ranks). Local.

    Example: ``gathers(bounds(4, 2), [(0, 3), (2, 4)])`` gives rank 0 one row of
    rank 1's.
    """
    out = []
    for q, (start, stop) in enumerate(ranges):
        for c, row, off, run in cut(src_at, start, max(stop - start, 0)):
            out.append((c, row, q, off, run))
    return out


def sharding_mesh_dim(name: str, a, ax: int):
    """``(a, m)``: the mesh dim ``m`` (of more than one rank) that shards axis
    ``ax`` of ``a``, with ``a`` moved so that no other mesh dim of more than one
    rank shards that axis (those become Replicate: a gather along them only); m is
    None when no such mesh dim shards it. Collective on the mesh when ``a`` moves.

    Example: ``sharding_mesh_dim("numpy.roll", dt, 0)`` of a ``[Shard(0)]`` DTensor
    is ``(dt, 0)``.
    """
    spec = a._spec
    mesh = spec.mesh
    if any(p.is_shard() and p.dim == ax and type(p) is not Shard for p in spec.placements):
        # A strided shard (of a flatten) holds no run of rows: it becomes the
        # plain Shard first, one redistribution, no gather.
        a = D.relayout(name, a, [Shard(ax) if p.is_shard() and p.dim == ax else p
                                 for p in spec.placements])
        spec = a._spec
    dims = [i for i, p in enumerate(spec.placements)
            if p.is_shard() and p.dim == ax and mesh.shape[i] > 1]
    if not dims:
        return a, None
    if len(dims) > 1:
        a = D.relayout(name, a, [Replicate() if i in dims[1:] else p
                                 for i, p in enumerate(spec.placements)])
    return a, dims[0]


def along(local: np.ndarray, ax: int) -> np.ndarray:
    """``local`` with axis ``ax`` first, C-contiguous: rows are what moves. Local.

    Example: ``along(np.zeros((2, 3)), 1).shape == (3, 2)``.
    """
    return np.ascontiguousarray(np.moveaxis(local, ax, 0))


def exchange(name: str, spec, m: int, send: np.ndarray, transfers, out: np.ndarray):
    """Runs the plan ``transfers`` (the same list on every rank) along mesh dim
    ``m``: rows of ``send`` (this rank's send buffer, rows first) go where the plan
    says, into ``out`` (this rank's receive buffer, rows first), which is returned.
    Rows kept on this rank are copied locally; the rest move in one all-to-all of
    variable parts along ``m``. ``spec`` is the DTensor's the trace names.
    Collective on mesh dim ``m``.

    Example: ``exchange("numpy.roll", dt._spec, 0, rows, [(0, 0, 1, 0, 2)], out)``.
    """
    mesh = spec.mesh
    me = mesh._coordinate[m]
    p = mesh.shape[m]
    outgoing = sorted((t for t in transfers if t[0] == me and t[2] != me),
                      key=lambda t: t[2])
    counts = [0] * p
    for t in outgoing:
        counts[t[2]] += t[4]
    parts = [send[t[1]:t[1] + t[4]] for t in outgoing]
    buf = (np.concatenate(parts) if parts else
           np.empty((0,) + send.shape[1:], send.dtype))
    if _modes.tracing:
        _trace.collective(f"{name}: row exchange", mesh, spec.placements, spec.shape,
                          spec.dtype)
    got, _ = _comm.alltoallv(mesh, np.ascontiguousarray(buf), counts, m)
    for t in transfers:
        if t[0] == me and t[2] == me:
            out[t[3]:t[3] + t[4]] = send[t[1]:t[1] + t[4]]
    at = 0
    for t in sorted((t for t in transfers if t[2] == me and t[0] != me),
                    key=lambda t: t[0]):
        out[t[3]:t[3] + t[4]] = got[at:at + t[4]]
        at += t[4]
    return out


def check_movable(name: str, dtype) -> None:
    """NoRule for a dtype MPI cannot move (the fallback takes the call). Local,
    the same on every rank (a DTensor's dtype is global).

    Example: ``check_movable("numpy.roll", np.dtype(object))`` raises NoRule.
    """
    if dtype_code(np.dtype(dtype)) < 0 or not np.dtype(dtype).isnative:
        raise _registry.NoRule(f"{name}: DTensors of dtype {np.dtype(dtype)} have no "
                               f"distributed rule")

