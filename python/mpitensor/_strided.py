"""Strided shards as plain layouts of a reshaped view.

A dim placed ``_StridedShard(d, split_factor=f)`` is, on every rank, the local
data of a plain layout in which that dim is split into factors (``f`` pieces,
each cut as ``Shard`` cuts): its *expansion*, the same local array reshaped. The
core knows strided layouts (mpitensor/core/strided.h: expansion, local boxes, the
common plain form of two layouts, normal forms) and reshape (reshape.h: groups of
dims, views; bound in :mod:`mpitensor._bind.core`); this module is their
Python face. Local, no data, no MPI. Two
layouts of the same mesh hold the same elements on every rank, in the same order,
exactly when their :func:`canonical` forms are equal; that is how every view
between them is checked.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from . import _clib
from ._bind import core
from ._clib import (_STATUS_CODES, Error, I, MAX_NDIM, _Box, _int64s, _Layout, _Placement,
                    call, check)
from .placement_types import Placement, _StridedShard, from_code
from ._bind.core import (_layout, _placements, mt_strided_init, mt_strided_expand,
                         mt_strided_local_box, mt_strided_refine, mt_strided_plain,
                         mt_strided_canonical, mt_strided_same, mt_reshape_view,
                         mt_reshape_groups)

__all__ = ["has_strided", "expand", "refine", "canonical", "reshape_groups", "view_placements",
           "same_elements", "local_shape", "local_box", "held_indices", "plain_of"]


def has_strided(placements: Sequence[Placement]) -> bool:
    """Whether any placement is a :class:`_StridedShard`. Local.

    Example: ``has_strided((Replicate(), _StridedShard(0, sf=8)))`` is True.
    """
    for p in placements:  # a loop: every reshape and view asks, and a generator costs
        if type(p) is _StridedShard:
            return True
    return False


def _codes(placements) -> tuple:
    return tuple(p._code for p in placements)


def _code_of(p: _Placement) -> tuple:
    return (p.kind, p.dim, p.reduce_op, p.split_factor)


def _codes_of(layout: _Layout) -> tuple:
    return tuple(map(_code_of, layout.placements[:layout.mesh_ndim]))


def _found(rc: int, err: Error) -> bool:
    """Whether a core function found what it looks for: MT_EINVAL from the ones
    bound here says there is none (no common form, normal form, groups or view);
    any other failure raises."""
    if rc == _STATUS_CODES["MT_EINVAL"]:
        return False
    check(rc, err)
    return True


@functools.lru_cache(maxsize=4096)
def _expansion(shape: tuple, mesh_shape: tuple, codes: tuple):
    out, group = _Layout(), (I * (len(shape) + 1))()
    call(mt_strided_expand, _layout(shape, mesh_shape, codes, mt_strided_init), out, group)
    return (tuple(out.shape[:out.ndim]), _codes_of(out),
            tuple(range(group[d], group[d + 1]) for d in range(len(shape))))


@functools.lru_cache(maxsize=4096)
def _strided_box(shape: tuple, mesh_shape: tuple, coordinate: tuple, codes: tuple):
    if len(coordinate) != len(mesh_shape):
        raise ValueError(f"a coordinate of {len(coordinate)} entries on a "
                         f"{len(mesh_shape)}-D mesh")
    box = _Box()
    call(mt_strided_local_box, _layout(shape, mesh_shape, codes, mt_strided_init),
         (_clib.I64 * max(len(coordinate), 1))(*coordinate), box)
    return tuple(box.shape[:box.ndim]), tuple(box.offset[:box.ndim])


@functools.lru_cache(maxsize=4096)
def _common(shape: tuple, mesh_shape: tuple, a: tuple, b: tuple):
    ra, rb, err = _Layout(), _Layout(), Error()
    rc = mt_strided_refine(_layout(shape, mesh_shape, a, mt_strided_init),
                           _layout(shape, mesh_shape, b, mt_strided_init),
                 ra, rb, err)
    if not _found(rc, err):
        return None
    return tuple(ra.shape[:ra.ndim]), _codes_of(ra), _codes_of(rb)


def expand(shape: Sequence[int], placements: Sequence[Placement],
           mesh_shape: Sequence[int]):
    """The plain layout whose local arrays, reshaped, are this layout's: ``(shape,
    placements, groups)`` with ``groups[d]`` the range of expanded dims of dim
    ``d``: the core's mt_strided_expand. A layout without strided shards is its
    own expansion. ValueError when a strided shard has no plain form (a split
    factor that does not divide the local dim, or a cut after an uneven one).
    Local.

    Example::

        >>> expand((48,), (_StridedShard(0, sf=8),), (2,))
        ((8, 6), (Shard(dim=1),), (range(0, 2),))
    """
    shape = tuple(int(n) for n in shape)
    if not has_strided(placements):
        return shape, tuple(placements), tuple(range(d, d + 1) for d in range(len(shape)))
    eshape, codes, groups = _expansion(shape, tuple(mesh_shape), _codes(placements))
    return eshape, tuple(from_code(c) for c in codes), groups


def refine(shape: Sequence[int], a: Sequence[Placement], b: Sequence[Placement],
           mesh_shape: Sequence[int]):
    """Two layouts of one tensor as plain layouts of one finer shape, holding on
    every rank the same elements in the same order: ``(shape, a_placements,
    b_placements)``, so a move between them is one planned move of reshaped local
    arrays (the core's mt_strided_refine). None when there is no such shape.
    Local.

    Example: ``refine((48,), (_StridedShard(0, sf=8),), (Replicate(),), (2,)) ==
    ((8, 6), (Shard(dim=1),), (Replicate(),))``.
    """
    got = _common(tuple(int(n) for n in shape), tuple(mesh_shape), _codes(a), _codes(b))
    if got is None:
        return None
    rshape, ca, cb = got
    return rshape, tuple(map(from_code, ca)), tuple(map(from_code, cb))


def canonical(shape: Sequence[int], placements: Sequence[Placement],
              mesh_shape: Sequence[int]):
    """A normal form of a layout, ``(shape, placements)``: expanded, dims of size 1
    no mesh dim cuts dropped, and neighbouring dims merged wherever the merge is
    still a plain layout (the core's mt_strided_canonical). Layouts with equal
    normal forms hold the same elements in the same order on every rank, so a
    local reshape turns one into the other. None when the layout has no plain
    expansion. Local.

    Example: ``canonical((8, 6), (Shard(1),), (2,)) ==
    canonical((48,), (_StridedShard(0, sf=8),), (2,))``.
    """
    got = _canonical_codes(tuple(map(int, shape)), tuple(mesh_shape), _codes(placements))
    return None if got is None else (got[0], tuple(map(from_code, got[1])))


@functools.lru_cache(maxsize=4096)
def _canonical_codes(shape: tuple, mesh_shape: tuple, codes: tuple):
    out, err = _Layout(), Error()
    rc = mt_strided_canonical(_layout(shape, mesh_shape, codes, mt_strided_init), out, err)
    if not _found(rc, err):
        return None
    return tuple(out.shape[:out.ndim]), _codes_of(out)


def reshape_groups(src: Sequence[int], dst: Sequence[int]):
    """A reshape's groups of dims, (input dims, output dims) of equal products left
    to right, as torch's view_groups makes them: a size-1 dim facing a larger one
    stands alone, otherwise dims are taken from the side with the smaller product
    until the products agree. None when the sizes do not line up. The one rule of
    reshape's dim map (mpitensor._ops._shape) and of its views here: the core's
    mt_reshape_groups. Local.

    Example: ``reshape_groups((1, 8, 6), (8, 2, 3)) == [((0,), ()), ((1,), (0,)),
    ((2,), (1, 2))]``.
    """
    got = _reshape_groups(tuple(map(int, src)), tuple(map(int, dst)))
    return None if got is None else list(got)


@functools.lru_cache(maxsize=4096)
def _reshape_groups(src: tuple, dst: tuple):
    s, ns = _int64s(src, MAX_NDIM, "shape")
    d, nd = _int64s(dst, MAX_NDIM, "shape")
    n, si, di, err = (I * 1)(), (I * (ns + nd + 1))(), (I * (ns + nd + 1))(), Error()
    rc = mt_reshape_groups(ns, s, nd, d, n, si, di, err)
    if not _found(rc, err):
        return None
    return tuple((tuple(range(si[g], si[g + 1])), tuple(range(di[g], di[g + 1])))
                 for g in range(n[0]))


def view_placements(shape: Sequence[int], placements: Sequence[Placement],
                    new_shape: Sequence[int], mesh_shape: Sequence[int]):
    """torch's placements of ``reshape(new_shape)`` of a plain layout when the
    reshape moves no data: a merged group keeps a Shard on its first dim and turns
    a Shard on a later dim into ``_StridedShard`` (split factor: the local sizes
    of the dims before it), a split group keeps a Shard on its first dim (the
    core's mt_reshape_view). None when there is no such view, as when a dim before
    a later Shard of its group is cut unevenly (the caller then moves the data).
    Local.

    Example: ``view_placements((8, 6), (Shard(1),), (48,), (2,)) ==
    (_StridedShard(0, sf=8),)``.
    """
    got = _view_codes(tuple(map(int, shape)), tuple(mesh_shape), _codes(placements),
                      tuple(map(int, new_shape)))
    return None if got is None else tuple(map(from_code, got))


@functools.lru_cache(maxsize=4096)
def _view_codes(shape: tuple, mesh_shape: tuple, codes: tuple, new_shape: tuple):
    sh, n = _int64s(new_shape, MAX_NDIM, "shape")
    out, err = _Layout(), Error()
    rc = mt_reshape_view(_layout(shape, mesh_shape, codes, mt_strided_init), n, sh, out, err)
    if not _found(rc, err):
        return None
    return _codes_of(out)


def same_elements(a_shape, a_placements, b_shape, b_placements, mesh_shape) -> bool:
    """Whether two layouts hold the same elements in the same order on every rank
    (then a local reshape turns one into the other): the core's mt_strided_same.
    False also when either is no layout of the mesh (a dim out of range). Local.

    Example: ``same_elements((8, 6), (Shard(1),), (48,), (_StridedShard(0, sf=8),),
    (2,))`` is True.
    """
    mesh_shape = tuple(mesh_shape)
    try:
        a = _layout(a_shape, mesh_shape, _codes(a_placements), mt_strided_init)
        b = _layout(b_shape, mesh_shape, _codes(b_placements), mt_strided_init)
    except (ValueError, IndexError):
        return False
    return bool(mt_strided_same(a, b))


def _box(shape, placements, mesh_shape, coordinate):
    """The core's box (local shape, global offset) of a plain layout."""
    return core.local_box(tuple(shape), tuple(mesh_shape), tuple(coordinate),
                           _codes(placements))


def local_box(shape: Sequence[int], placements: Sequence[Placement],
              mesh_shape: Sequence[int], coordinate: Sequence[int]) -> tuple:
    """A strided layout's local shape, and as offset the global index, along each
    dim, of this coordinate's first element (its elements are not one box; an
    empty part reports the dim's size, as the core does): mt_strided_local_box.
    Local.

    Example: ``local_box((48,), (_StridedShard(0, sf=8),), (2,), (1,)) ==
    ((24,), (3,))``.
    """
    return _strided_box(tuple(int(n) for n in shape), tuple(mesh_shape),
                        tuple(int(c) for c in coordinate), _codes(placements))


def local_shape(shape: Sequence[int], placements: Sequence[Placement],
                mesh_shape: Sequence[int], coordinate: Sequence[int]) -> tuple:
    """This coordinate's local shape of a layout, strided shards included. Local.

    Example: ``local_shape((48,), (_StridedShard(0, sf=8),), (2,), (1,)) == (24,)``.
    """
    return local_box(shape, placements, mesh_shape, coordinate)[0]


def plain_of(placements: Sequence[Placement]) -> tuple:
    """The placements with each strided shard replaced by Replicate: where an
    operation without a strided rule takes a strided input (the core's
    mt_strided_plain). Local.

    Example: ``plain_of((Shard(0), _StridedShard(0, sf=4))) == (Shard(0), Replicate())``.
    """
    return tuple(map(from_code, _plain_codes(_codes(placements))))


def copies(placements: Sequence[Placement], mesh_shape: Sequence[int]) -> bool:
    """Whether the plain layout of these placements is new memory: a strided mesh
    dim of more than one rank. One of a single rank holds its whole dim in order,
    so the plain copy is the strided local array itself. Decided on the layout
    alone, so that every rank answers alike. Local.

    Example: ``copies((_StridedShard(0, sf=4),), (2,))`` is True, with ``(1,)`` False.
    """
    return any(type(p) is _StridedShard and n > 1 for p, n in zip(placements, mesh_shape))


@functools.lru_cache(maxsize=1024)
def _plain_codes(codes: tuple) -> tuple:
    pl, n = _placements(codes)
    out = (_Placement * len(pl))()
    call(mt_strided_plain, pl, n, 0, out)
    return tuple(map(_code_of, out[:n]))


def held_indices(shape: Sequence[int], placements: Sequence[Placement],
                 mesh_shape: Sequence[int], coordinate: Sequence[int]) -> list:
    """The global indices this coordinate holds along each dim, in local order (a
    layout's local block is the product of them, strided shards included). For
    drawing and checks on small arrays: the index arrays have the dims' local
    lengths. Local.

    Example: ``held_indices((12,), (_StridedShard(0, sf=2),), (2,), (1,))[0]``
    is ``array([3, 4, 5, 9, 10, 11])``.
    """
    eshape, eplacements, groups = expand(shape, placements, mesh_shape)
    size, offset = _box(eshape, eplacements, mesh_shape, coordinate)
    out = []
    for g in groups:
        idx = np.zeros(1, dtype=np.int64)
        for i in g:
            idx = (idx[:, None] * eshape[i] + offset[i]
                   + np.arange(size[i], dtype=np.int64)[None, :]).reshape(-1)
        out.append(idx)
    return out
