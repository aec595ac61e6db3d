"""The core's strided layouts (mpitensor/core/strided.h) against torch's meaning.

A ``_StridedShard(d, sf)`` on a mesh dim cuts the indices a rank holds along
dim d into ``sf`` equal pieces and keeps, of each piece, the chunk ``torch.chunk``
gives this rank; placements apply in mesh-dim order. The oracle below applies
exactly that to index lists, so each rank's elements (as flat indices of the
whole tensor, in local order) are known without the core. Every expansion, local
box and common plain form the core gives must hold those elements in that
order, on every rank of the mesh. Local math: no communication.
"""

import itertools
import math
import random

import numpy as np
import pytest

from mpitensor import _strided
from mpitensor.placement_types import Partial, Replicate, Shard, _StridedShard

pytestmark = pytest.mark.np(1)  # local layout math

SIZES = (1, 2, 3, 4, 5, 6, 8, 12)
MESHES = ((2,), (3,), (2, 2), (3, 2), (2, 2, 2), (2, 3, 2))


def chunk(idx, ranks, c):
    size = -(-len(idx) // ranks)
    return idx[c * size:(c + 1) * size]


def held(shape, placements, mesh_shape, coord):
    """Flat indices of the whole tensor a rank holds, in local order; None when
    torch's meaning is undefined (a split factor that does not divide)."""
    idx = [np.arange(n) for n in shape]
    for m, p in enumerate(placements):
        if type(p) is _StridedShard:
            if len(idx[p.dim]) % p.split_factor:
                return None
            rows = idx[p.dim].reshape(p.split_factor, -1)
            idx[p.dim] = np.concatenate([chunk(r, mesh_shape[m], coord[m]) for r in rows])
        elif isinstance(p, Shard):
            idx[p.dim] = chunk(idx[p.dim], mesh_shape[m], coord[m])
    if any(len(i) == 0 for i in idx):
        return np.zeros(0, dtype=np.int64)
    grids = np.meshgrid(*idx, indexing="ij")
    return np.ravel_multi_index(tuple(grids), shape).ravel() if shape else np.zeros(1, int)


def plain_held(shape, placements, mesh_shape, coord):
    """The same for a plain layout, from the core's box."""
    size, offset = _strided.local_box(shape, placements, mesh_shape, coord)
    if 0 in size:
        return np.zeros(0, dtype=np.int64)
    grids = np.meshgrid(*[np.arange(o, o + n) for o, n in zip(offset, size)], indexing="ij")
    return np.ravel_multi_index(tuple(grids), shape).ravel() if shape else np.zeros(1, int)


def random_layout(rng, mesh_shape):
    shape = tuple(rng.choice(SIZES) for _ in range(rng.randint(1, 3)))
    placements = []
    for _ in mesh_shape:
        kind = rng.random()
        d = rng.randrange(len(shape))
        if kind < 0.2:
            placements.append(Replicate())
        elif kind < 0.3:
            placements.append(Partial())
        elif kind < 0.6:
            placements.append(Shard(d))
        else:
            placements.append(_StridedShard(d, sf=rng.choice((1, 2, 3, 4, 6))))
    return shape, tuple(placements)


def coords(mesh_shape):
    return itertools.product(*(range(n) for n in mesh_shape))


def cases(seed, n=1500):
    """n random (rng, mesh shape, shape, placements)."""
    rng = random.Random(seed)
    for _ in range(n):
        mesh_shape = rng.choice(MESHES)
        yield (rng, mesh_shape) + random_layout(rng, mesh_shape)


def test_expansion_and_boxes_hold_torchs_elements():
    expanded = 0
    for _, mesh_shape, shape, placements in cases(7):
        try:
            eshape, eplacements, groups = _strided.expand(shape, placements, mesh_shape)
        except ValueError as e:
            assert "into whole pieces" in str(e) or "more than" in str(e)
            continue
        expanded += 1
        assert math.prod(eshape) == math.prod(shape)
        assert all(math.prod(eshape[g.start:g.stop]) == n for g, n in zip(groups, shape))
        for c in coords(mesh_shape):
            want = held(shape, placements, mesh_shape, c)
            assert want is not None, (shape, placements)
            got = plain_held(eshape, eplacements, mesh_shape, c)
            assert np.array_equal(got, want), (shape, placements, mesh_shape, c)
            size, first = _strided.local_box(shape, placements, mesh_shape, c)
            assert math.prod(size) == want.size
            if want.size:
                assert first == tuple(int(i) for i in np.unravel_index(want[0], shape))
    assert expanded > 800


def test_common_plain_form_holds_both_layouts():
    found = 0
    for rng, mesh_shape, shape, a in cases(11):
        b = tuple(_fit(p, len(shape)) for p in random_layout(rng, mesh_shape)[1])
        got = _strided.refine(shape, a, b, mesh_shape)
        if got is None:
            continue
        found += 1
        rshape, ra, rb = got
        assert math.prod(rshape) == math.prod(shape)
        for c in coords(mesh_shape):
            for p, rp in ((a, ra), (b, rb)):
                want = held(shape, p, mesh_shape, c)
                assert np.array_equal(plain_held(rshape, rp, mesh_shape, c), want), (
                    shape, a, b, mesh_shape, c)
    assert found > 500


def _fit(p, ndim):
    if isinstance(p, Shard):
        return Shard(p.dim % ndim)
    if type(p) is _StridedShard:
        return _StridedShard(p.dim % ndim, sf=p.split_factor)
    return p


def test_known_forms():
    s8 = _StridedShard(0, sf=8)
    assert _strided.expand((48,), (s8,), (2,)) == ((8, 6), (Shard(1),), (range(0, 2),))
    # FSDP over TP: the row cut by mesh dim 1 first, then each half by mesh dim 0.
    got = _strided.refine((8, 6), (_StridedShard(0, sf=2), Shard(0)),
                          (Shard(0), Shard(0)), (2, 2))
    assert got == ((2, 4, 6), (Shard(1), Shard(0)), (Shard(0), Shard(1)))
    # Pieces of 2 and of 3 do not nest: no shape splits at both.
    assert _strided.refine((6,), (_StridedShard(0, sf=2),), (_StridedShard(0, sf=3),),
                           (3,)) is None
    with pytest.raises(ValueError, match="does not cut dim 0 into whole pieces"):
        _strided.expand((6,), (Shard(0), _StridedShard(0, sf=2)), (4, 2))


def test_plain_of_gathers_only_strided_shards():
    got = _strided.plain_of((Shard(1), _StridedShard(0, sf=4), Partial("max"), Replicate()))
    assert got == (Shard(1), Replicate(), Partial("max"), Replicate())
    assert _strided.plain_of((_StridedShard(2, sf=3),)) == (Replicate(),)


def test_reshape_groups_from_the_core():
    assert _strided.reshape_groups((1, 8, 6), (8, 2, 3)) == [
        ((0,), ()), ((1,), (0,)), ((2,), (1, 2))]
    assert _strided.reshape_groups((6, 4), (4, 6)) == [((0, 1), (0, 1))]
    assert _strided.reshape_groups((), (1, 1)) == [((), (0,)), ((), (1,))]
    assert _strided.reshape_groups((), ()) == []
    assert _strided.reshape_groups((6,), (4, 2)) is None
    with pytest.raises(ValueError, match="at most"):
        _strided.reshape_groups((1,) * 17, (1,))


def test_normal_forms_and_views_from_the_core():
    s8 = (_StridedShard(0, sf=8),)
    assert _strided.canonical((48,), s8, (2,)) == ((8, 6), (Shard(1),))
    assert _strided.canonical((4, 12), (Shard(0),), (2,)) == ((48,), (Shard(0),))
    assert _strided.canonical((6,), (Shard(0), _StridedShard(0, sf=2)), (4, 2)) is None
    assert _strided.same_elements((1, 8, 6), (Shard(2),), (48,), s8, (2,))
    assert not _strided.same_elements((8, 6), (Shard(0),), (48,), s8, (2,))
    assert not _strided.same_elements((8, 6), (Shard(5),), (48,), s8, (2,))
    assert _strided.view_placements((8, 6), (Shard(1),), (48,), (2,)) == s8
    assert _strided.view_placements((48,), s8, (8, 6), (2,)) is None
