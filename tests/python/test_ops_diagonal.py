"""np.triu, np.tril, np.trace and np.diagonal of DTensors: NumPy's value and dtype
on every rank, for every layout of the suite's meshes (Partial included) on shapes
that leave shards empty, every diagonal offset that cuts a shard; triu and tril
communicate nothing and keep the placements, trace and diagonal leave a Partial of
the result's size."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import Partial, Replicate, Shard
from mpitensor._ops import _diagonal
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import (W, assert_matches, corner_layouts, make, matches_or_raises_alike,
                         mesh_of, mesh_shapes)

R, S0, S1 = Replicate(), Shard(0), Shard(1)
SHAPES = ((0, 3), (3, 0), (1, 3), (2, 1), (3, 3), (5, 4), (4, 7), (3, 4, 5), (2, 0, 3))


def values(shape, k):
    full = np.arange(1, int(np.prod(shape)) + 1).reshape(shape) % 7 - 2
    return full.astype([np.float64, np.int32, np.complex128][k % 3])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_triangles_trace_and_diagonal(shape):
    full = values(shape, len(shape) + shape[-1])
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
            for k in (-2, -1, 0, 1, 3):
                assert_matches(np.triu(dt, k), np.triu(full, k))
                assert_matches(np.tril(dt, k=k), np.tril(full, k=k))
                assert_matches(np.trace(dt, k), np.asarray(np.trace(full, k)))
                assert_matches(np.diagonal(dt, k), np.diagonal(full, k))
            if len(shape) == 3:
                for axes in ((0, 2), (2, 1), (-1, 0)):
                    assert_matches(np.diagonal(dt, 1, *axes), np.diagonal(full, 1, *axes))
                    assert_matches(np.trace(dt, -1, *axes, dtype=np.float32),
                                   np.trace(full, -1, *axes, dtype=np.float32))


def test_triangles_of_blocks_written_band_by_band(monkeypatch):
    """Blocks above the cached-mask size are written band by band (rows wholly
    kept, wholly zeroed, and bands across the diagonal, the last one short): the
    same values, on small arrays with the size and band made small."""
    monkeypatch.setattr(_diagonal, "_SMALL", 0)
    monkeypatch.setattr(_diagonal, "_BAND", 3)
    for shape in ((11, 7), (6, 13), (2, 9, 8)):
        full = values(shape, shape[-1])
        layouts = [(S0,), (S1,)] if len(shape) == 2 else [(S0,), (Shard(1),), (Shard(2),)]
        for pls in layouts:
            dt = make(full, mesh_of((W,)), pls)
            for k in (-12, -4, -1, 0, 2, 5, 14):
                assert_matches(np.triu(dt, k), np.triu(full, k))
                assert_matches(np.tril(dt, k), np.tril(full, k))


def test_numpys_errors_and_dtypes():
    mesh = mesh_of((W,))
    full = np.arange(12).reshape(3, 4) % 3 == 0
    dt = make(full, mesh, (S0,))
    assert_matches(np.trace(dt), np.asarray(np.trace(full)))
    assert_matches(np.triu(dt), np.triu(full))
    matches_or_raises_alike(lambda: np.diagonal(dt, 0, 1, 1), lambda: np.diagonal(full, 0, 1, 1))
    matches_or_raises_alike(lambda: np.trace(dt, 0, 0, 2), lambda: np.trace(full, 0, 0, 2))
    v = make(np.arange(5.0), mesh, (S0,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherWarning)
        assert_matches(np.triu(v), np.triu(np.arange(5.0)))  # NumPy makes it square


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_nothing_moves_until_read(mesh_shape):
    mesh = mesh_of(mesh_shape)
    full = np.arange(64.0 * 48).reshape(64, 48) % 11
    layouts = [(S0,), (S1,)] if len(mesh_shape) == 1 else [(S0, S1), (R, S1), (S1, S0)]
    for pls in layouts:
        dt = make(full, mesh, pls)
        with CommDebugMode() as mode:
            up, tr, dg = np.triu(dt, 2), np.trace(dt, -3), np.diagonal(dt, 5)
        assert mode.get_total_counts() == 0
        assert up.placements == pls
        if W > 1:
            assert all(p == Partial("sum") for p in tr.placements if not p.is_replicate())
        with CommDebugMode() as mode:
            assert_matches(dg, np.diagonal(full, 5))
        # Reading the diagonal moves about its size, not the matrix.
        assert sum(mode.get_comm_bytes().values()) <= 4 * 43 * 8
        assert_matches(up, np.triu(full, 2))
        assert_matches(tr, np.asarray(np.trace(full, -3)))
