"""``np.split``, ``np.array_split``, ``np.hsplit``, ``np.vsplit`` and ``np.dsplit`` of
DTensors: a list of pieces along an axis.

A piece is a dim map with one KEEP label per dim but the axis, whose output label
is a sized REPLICATE label of the piece's length (as concatenate's): every other
Shard follows its dim, Replicate and every Partial stay (splitting is linear), and
each piece is the local slice of the axis. When a mesh dim shards the axis, one
executor call makes the axis whole first (its label REPLICATE, the others KEEP:
the engine moves the shard to a free dim by one all-to-all or gathers it, by
price), so the pieces need no communication of their own; torch gathers the axis
(all-gather, Replicate pieces). Where that would gather (no other dim is free to
take the shard, as in a 1-D array), the pieces stay sharded along the axis
instead: each rank's rows go to the ranks that hold them in the pieces'
torch.chunk blocks, all pieces in one exchange along the mesh dim
(``_row_exchange``), and only rows whose owner changes move.

In grad mode each piece is recorded with split's backward (mpitensor.autograd):
its gradient in the input's shape, zeros outside the piece.
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Shard
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X
from .._algorithms import _views
from ._along_axis import lanes_layout

__all__ = ["split_bounds"]


def split_bounds(name: str, n: int, indices_or_sections, equal: bool) -> list:
    """The ``(start, stop)`` of each piece of an axis of length ``n``, as NumPy's
    ``split`` (``equal``: ValueError unless an int divides ``n``) and
    ``array_split`` cut it: an int N gives N pieces, the first ``n % N`` one
    longer; a sequence gives the pieces between its indices, sliced as
    ``a[i:j]`` (clipped, maybe empty). Local.

    Example: ``split_bounds("numpy.array_split", 5, 2, False) == [(0, 3), (3, 5)]``.
    """
    if np.ndim(indices_or_sections) == 0:
        sections = operator.index(indices_or_sections)
        if sections <= 0:
            raise ValueError(f"{name}: number sections must be larger than 0.")
        if equal and n % sections:
            raise ValueError(f"{name}: array split does not result in an equal division")
        each, extra = divmod(n, sections)
        sizes = [each + 1] * extra + [each] * (sections - extra)
        points = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        return list(zip(points[:-1], points[1:]))
    points = [0] + [operator.index(i) for i in indices_or_sections] + [n]
    out = []
    for start, stop in zip(points[:-1], points[1:]):
        lo, hi, _ = slice(start, stop).indices(n)
        out.append((lo, max(lo, hi)))
    return out


def _whole_along(a: DTensor, ax: int) -> DTensor:
    """``a`` with no mesh dim sharding ``ax``: itself, or moved by one executor
    call whose dim map keeps every other dim (collective on the mesh)."""
    if not any(p.is_shard() and p.dim == ax for p in a._spec.placements):
        return a
    n = a.ndim

    def build():
        kinds = [D.REPLICATE if d == ax else D.KEEP for d in range(n)]
        return D.dimmap([range(n)], range(n), kinds, partial_rule=D.P_LINEAR_ALL)

    return D.execute(("split_whole", ax), (a,), build, lambda x: x)


def _gathering_mesh_dim(a: DTensor, ax: int):
    """The first mesh dim that shards ``ax`` when making the axis whole would
    gather it along every mesh dim that shards it (no other dim is free and long
    enough to take a shard, as for a 1-D array), or None. Local."""
    if any(p.is_partial() for p in a._spec.placements):
        return None
    target = lanes_layout(a, (ax,), True)
    mesh = a._spec.mesh
    dims = [i for i, p in enumerate(a._spec.placements) if p == Shard(ax) and mesh.shape[i] > 1]
    if dims and all(target[i].is_replicate() for i in dims):
        return dims[0]
    return None


def _split_sharded(name, a, ax, m, bounds) -> list:
    """The pieces of ``a`` along ``ax``, which mesh dim ``m`` shards, each
    ``Shard(ax)`` on ``m`` in torch.chunk's blocks: every rank sends the runs of
    its rows to the ranks that hold them in their pieces, all pieces in one
    exchange along ``m`` (only rows whose owner changes move). Collective on the
    mesh."""
    a, m = X.sharding_mesh_dim(name, a, ax)
    X.check_movable(name, a._spec.dtype)
    spec = a._spec
    mesh = spec.mesh
    placements = spec.placements

    def piece_spec(length):
        shape = spec.shape[:ax] + (length,) + spec.shape[ax + 1:]
        return DTensorSpec(mesh, placements, shape, spec.dtype, contiguous_strides(shape))

    if mesh.get_coordinate() is None:
        return [DTensor(np.empty((0,), spec.dtype), piece_spec(hi - lo)) for lo, hi in bounds]
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    src = X.bounds(spec.shape[ax], p)
    transfers = []
    base = np.zeros(p, np.int64)   # where each piece starts in each rank's buffer
    mine = []                       # (start, length) of each piece in this rank's buffer
    for lo, hi in bounds:
        dst = X.bounds(hi - lo, p)
        for c, row, off, run in X.cut(src, lo, hi - lo):
            for q, drow, doff, drun in X.cut(dst, off, run):
                transfers.append((c, row + doff, q, int(base[q]) + drow, drun))
        mine.append((int(base[me]), int(dst[me + 1] - dst[me])))
        base += np.diff(dst)
    send = X.along(a.to_local(), ax)
    out = np.empty((int(base[me]),) + send.shape[1:], spec.dtype)
    X.exchange(name, spec, m, send, transfers, out)
    return [DTensor(np.ascontiguousarray(np.moveaxis(out[s:s + n], 0, ax)),
                    piece_spec(hi - lo)) for (s, n), (lo, hi) in zip(mine, bounds)]


def _piece(a: DTensor, ax: int, lo: int, hi: int) -> DTensor:
    """``a[..., lo:hi, ...]`` along the whole axis ``ax``: local."""
    n = a.ndim
    cut = (slice(None),) * ax + (slice(lo, hi),)

    def build():
        kinds = [D.KEEP] * n + [D.REPLICATE]
        kinds[ax] = D.REPLICATE
        labels = [n if d == ax else d for d in range(n)]
        return D.dimmap([labels], range(n), kinds, partial_rule=D.P_LINEAR_ALL,
                        sizes={ax: hi - lo})

    return D.execute(("split_piece", ax, lo, hi), (a,), build, lambda x: x[cut])


def _split(name, func, ary, indices_or_sections, axis, equal) -> list:
    """The pieces of ``ary`` split along ``axis``; a program's call of ``func``
    gets them as NumPy's, views of ``ary`` (mpitensor._algorithms._views): a write
    into a piece reaches ``ary`` and a piece shows the writes into ``ary``, also
    where its elements moved."""
    program = _registry.program_call(func)
    pieces = _pieces(name, ary, indices_or_sections, axis, equal)
    if not program:
        return pieces
    ax = normalize_axis_index(operator.index(axis), ary.ndim)
    bounds = split_bounds(name, ary.shape[ax], indices_or_sections, equal)

    redo = _views.shared(lambda p: _pieces(name, p, indices_or_sections, axis, equal))

    def each(i, lo, hi):
        key = (slice(None),) * ax + (slice(lo, hi),)

        def back(p, view, written):
            p[key] = np.where(written, view, p[key])
        return pieces[i], redo(i), back
    return _views.keep_each(ary, [each(i, lo, hi) for i, (lo, hi) in enumerate(bounds)])


def _pieces(name, ary, indices_or_sections, axis, equal) -> list:
    if type(ary) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(ary).__name__}")
    if ary.ndim == 0:
        raise ValueError(f"{name}: a 0-d DTensor has no axis to split")
    ax = normalize_axis_index(operator.index(axis), ary.ndim)
    bounds = split_bounds(name, ary.shape[ax], indices_or_sections, equal)
    m = _gathering_mesh_dim(ary, ax)
    if m is not None:
        return _split_sharded(name, ary, ax, m, bounds)
    whole = _whole_along(ary, ax)
    return [_piece(whole, ax, lo, hi) for lo, hi in bounds]


@_registry.implements(np.split, views=True)
def split(ary, indices_or_sections, axis=0):
    """``np.split`` of a DTensor: a list of DTensors, each placed as the input
    except along ``axis``, which is whole in every piece. Local unless a mesh dim
    shards ``axis`` (then one collective for all the pieces). Collective on the
    mesh then.

    Example: ``np.split(dt, 2, axis=1)`` of a ``[Shard(0)]`` (4, 6) DTensor gives
    two ``[Shard(0)]`` (4, 3) pieces with no communication.
    """
    return _split("numpy.split", np.split, ary, indices_or_sections, axis, True)


@_registry.implements(np.array_split, views=True)
def array_split(ary, indices_or_sections, axis=0):
    """``np.array_split`` of a DTensor: as :func:`split`, the pieces' lengths
    differing by at most one when ``indices_or_sections`` is an int that does not
    divide the axis. Local unless a mesh dim shards ``axis``; collective then.

    Example: ``[p.shape for p in np.array_split(dt, 2)]`` of a (5, 2) DTensor is
    ``[(3, 2), (2, 2)]``.
    """
    return _split("numpy.array_split", np.array_split, ary, indices_or_sections, axis, False)


def _split_axis(name, ary, least, axis_of):
    if type(ary) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(ary).__name__}")
    if ary.ndim < least:
        raise ValueError(f"{name.split('.')[-1]} only works on arrays of {least} or more "
                         f"dimensions")
    return axis_of(ary.ndim)


@_registry.implements(np.hsplit, views=True)
def hsplit(ary, indices_or_sections):
    """``np.hsplit`` of a DTensor: ``np.split`` along axis 1 (axis 0 of a 1-D
    DTensor). Local unless that axis is sharded; collective then.

    Example: ``np.hsplit(dt, 2)`` of a (4, 6) ``[Shard(0)]`` DTensor moves nothing.
    """
    ax = _split_axis("numpy.hsplit", ary, 1, lambda n: 1 if n > 1 else 0)
    return _split("numpy.hsplit", np.hsplit, ary, indices_or_sections, ax, True)


@_registry.implements(np.vsplit, views=True)
def vsplit(ary, indices_or_sections):
    """``np.vsplit`` of a DTensor of 2 or more dims: ``np.split`` along axis 0.
    Local unless axis 0 is sharded; collective then.

    Example: ``np.vsplit(dt, 2)`` of a (4, 6) ``[Shard(1)]`` DTensor moves nothing.
    """
    _split_axis("numpy.vsplit", ary, 2, lambda n: 0)
    return _split("numpy.vsplit", np.vsplit, ary, indices_or_sections, 0, True)


@_registry.implements(np.dsplit, views=True)
def dsplit(ary, indices_or_sections):
    """``np.dsplit`` of a DTensor of 3 or more dims: ``np.split`` along axis 2.
    Local unless axis 2 is sharded; collective then.

    Example: ``np.dsplit(dt, 2)`` of a (2, 3, 4) ``[Shard(0)]`` DTensor moves nothing.
    """
    _split_axis("numpy.dsplit", ary, 3, lambda n: 2)
    return _split("numpy.dsplit", np.dsplit, ary, indices_or_sections, 2, True)
