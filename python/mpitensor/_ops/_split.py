"""``np.split`` and ``np.array_split`` of DTensors: a list of pieces along an axis.

A piece is a dim map with one KEEP label per dim but the axis, whose output label
is a sized REPLICATE label of the piece's length (as concatenate's): every other
Shard follows its dim, Replicate and every Partial stay (splitting is linear), and
each piece is the local slice of the axis. When a mesh dim shards the axis, one
executor call makes the axis whole first (its label REPLICATE, the others KEEP:
the engine moves the shard to a free dim by one all-to-all or gathers it, by
price), so the pieces need no communication of their own; torch gathers the axis
(all-gather, Replicate pieces).

In grad mode each piece is recorded with split's backward (mpitensor.autograd):
its gradient in the input's shape, zeros outside the piece.
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from . import _dispatch as D

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


def _split(name, ary, indices_or_sections, axis, equal) -> list:
    if type(ary) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(ary).__name__}")
    if ary.ndim == 0:
        raise ValueError(f"{name}: a 0-d DTensor has no axis to split")
    ax = normalize_axis_index(operator.index(axis), ary.ndim)
    bounds = split_bounds(name, ary.shape[ax], indices_or_sections, equal)
    whole = _whole_along(ary, ax)
    return [_piece(whole, ax, lo, hi) for lo, hi in bounds]


@_registry.implements(np.split)
def split(ary, indices_or_sections, axis=0):
    """``np.split`` of a DTensor: a list of DTensors, each placed as the input
    except along ``axis``, which is whole in every piece. Local unless a mesh dim
    shards ``axis`` (then one collective for all the pieces). Collective on the
    mesh then.

    Example: ``np.split(dt, 2, axis=1)`` of a ``[Shard(0)]`` (4, 6) DTensor gives
    two ``[Shard(0)]`` (4, 3) pieces with no communication.
    """
    return _split("numpy.split", ary, indices_or_sections, axis, True)


@_registry.implements(np.array_split)
def array_split(ary, indices_or_sections, axis=0):
    """``np.array_split`` of a DTensor: as :func:`split`, the pieces' lengths
    differing by at most one when ``indices_or_sections`` is an int that does not
    divide the axis. Local unless a mesh dim shards ``axis``; collective then.

    Example: ``[p.shape for p in np.array_split(dt, 2)]`` of a (5, 2) DTensor is
    ``[(3, 2), (2, 2)]``.
    """
    return _split("numpy.array_split", ary, indices_or_sections, axis, False)
