"""np.meshgrid of 1-D DTensors: NumPy's grids (values, shapes, dtypes) on every rank
for every layout of the suite's meshes (Partial included), lengths that leave
shards empty, both indexings, sparse or not; no communication, and each input's
Shard kept on its own axis."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import assert_matches, corner_layouts, make, mesh_of, mesh_shapes

R, S0 = Replicate(), Shard(0)


def compare(got, want):
    assert type(got) is tuple and len(got) == len(want)
    for g, w in zip(got, want):
        assert_matches(g, w)


@pytest.mark.parametrize("lengths", [(0, 3), (1, 2), (3, 5), (4, 1, 2), (2,)], ids=str)
def test_meshgrid(lengths):
    fulls = [np.arange(n, dtype=[np.float64, np.int32, np.float32][i % 3]) * (i + 2) - 1
             for i, n in enumerate(lengths)]
    layouts = corner_layouts(1)
    for k, (mesh, pls) in enumerate(layouts):
        # Each input in another layout of the same mesh.
        same_mesh = [p for m, p in layouts if m is mesh]
        ins = [make(f, mesh, same_mesh[(k + i) % len(same_mesh)]) for i, f in enumerate(fulls)]
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            for indexing, sparse in itertools.product(("xy", "ij"), (False, True)):
                with CommDebugMode() as mode:
                    got = np.meshgrid(*ins, indexing=indexing, sparse=sparse)
                partial = any(p.is_partial() for x in ins for p in x.placements)
                assert partial or mode.get_total_counts() == 0
                compare(got, np.meshgrid(*fulls, indexing=indexing, sparse=sparse))


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_shards_follow_their_axis(mesh_shape):
    mesh = mesh_of(mesh_shape)
    pls = (S0,) * len(mesh_shape)
    x, y = make(np.arange(9.0), mesh, pls), make(np.arange(5.0), mesh, pls)
    xx, yy = np.meshgrid(x, y)
    assert xx.placements == (Shard(1),) * len(mesh_shape)
    assert yy.placements == (Shard(0),) * len(mesh_shape)
    compare((xx, yy), np.meshgrid(np.arange(9.0), np.arange(5.0)))
    with pytest.raises(ValueError):
        np.meshgrid(x, y, indexing="yx")
