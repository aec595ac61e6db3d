"""np.isin and np.interp of DTensors: NumPy's value and dtype on every rank, for
every layout of the suite's meshes (Partial included) on shapes that leave shards
empty, with the table an array or a DTensor; the looked-up data never moves."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make, mesh_of,
                         mesh_shapes)

R, S0, S1 = Replicate(), Shard(0), Shard(1)
SHAPES = CORNER_SHAPES + ((7,), (4, 5), (3, 2, 4))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_isin_and_interp(shape):
    full = (np.arange(int(np.prod(shape))).reshape(shape) * 5 % 9 - 2).astype(np.float64)
    test = np.array([-2.0, 0.0, 3.0, 5.0])
    xp, fp = np.array([-1.0, 0.5, 2.0, 6.0]), np.array([3.0, -1.0, 4.0, 0.0])
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        dtest = make(test, mesh, (S0,) * mesh.ndim)
        dxp, dfp = make(xp, mesh, (S0,) + (R,) * (mesh.ndim - 1)), make(fp, mesh, (R,) * mesh.ndim)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            for t, plain in ((test, test), (dtest, test), ([0, 6], [0, 6])):
                assert_matches(np.isin(dt, t), np.isin(full, plain))
            assert_matches(np.isin(dt, test, invert=True), np.isin(full, test, invert=True))
            assert_matches(np.interp(dt, xp, fp), np.interp(full, xp, fp))
            assert_matches(np.interp(dt, dxp, dfp, left=-9.0), np.interp(full, xp, fp, left=-9.0))
            assert_matches(np.interp(dt, xp, fp + 1j), np.interp(full, xp, fp + 1j))
            assert_matches(np.interp(dt, xp, fp, period=4.0), np.interp(full, xp, fp, period=4.0))
            placements = np.isin(dt, test).placements
            assert placements == tuple(R if p.is_partial() else p for p in pls)


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_the_data_does_not_move(mesh_shape):
    mesh = mesh_of(mesh_shape)
    full = np.arange(4096.0).reshape(64, 64) % 13
    pls = (S0,) if len(mesh_shape) == 1 else (S0, S1)
    dt = make(full, mesh, pls)
    with CommDebugMode() as mode:
        a, b = np.isin(dt, [1.0, 4.0]), np.interp(dt, [0.0, 12.0], [1.0, -1.0])
    assert mode.get_total_counts() == 0
    assert a.placements == pls and b.placements == pls
    assert_matches(a, np.isin(full, [1.0, 4.0]))
    assert_matches(b, np.interp(full, [0.0, 12.0], [1.0, -1.0]))
