"""np.count_nonzero, np.nonzero, np.where(cond), np.argwhere and np.flatnonzero of
DTensors: NumPy's value (and intp dtype) on every rank, for every layout of the
suite's meshes (Partial included) on the corner shapes that leave shards empty and
on uneven ones; the index functions of an input sharded along one mesh dim move
only counts and indices, never the array, and give Shard(0) results."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make,
                         matches_or_raises_alike, mesh_of, mesh_shapes)

R, S0, S1 = Replicate(), Shard(0), Shard(1)
SHAPES = CORNER_SHAPES + ((7,), (5, 4), (3, 5, 2), (6, 1, 3))


def sparse(shape, seed):
    """Values with zeros in about half the places (all-zero rows too)."""
    rng = np.random.default_rng(seed)
    full = rng.integers(-2, 3, size=shape).astype(np.float64)
    full[rng.random(shape) < 0.3] = 0
    if full.ndim >= 2 and full.shape[0] > 1:
        full[1] = 0
    return full


def one_mesh_dim(mesh, pls):
    """Whether at most one mesh dim of more than one rank shards the input (the
    index functions' distributed form)."""
    return sum(1 for m, p in enumerate(pls) if p.is_shard() and mesh.shape[m] > 1) <= 1


def compare_tuple(got, expect):
    assert len(got) == len(expect)
    for g, e in zip(got, expect):
        assert_matches(g, e)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_count_nonzero(shape):
    full = sparse(shape, len(shape))
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        for axis in [None, *range(len(shape))]:
            for keepdims in (False, True):
                matches_or_raises_alike(
                    lambda: np.count_nonzero(dt, axis=axis, keepdims=keepdims),
                    lambda: np.asarray(np.count_nonzero(full, axis=axis, keepdims=keepdims)))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_index_functions(shape):
    full = sparse(shape, 7 + len(shape))
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        with warnings.catch_warnings():
            # Two mesh dims sharding the input go to the fallback.
            if one_mesh_dim(mesh, pls):
                warnings.simplefilter("error", GatherWarning)
            else:
                warnings.simplefilter("ignore", GatherWarning)
            assert_matches(np.argwhere(dt), np.argwhere(full))
            assert_matches(np.flatnonzero(dt), np.flatnonzero(full))
            compare_tuple(np.nonzero(dt), np.nonzero(full))
            compare_tuple(np.where(dt), np.where(full))
            if one_mesh_dim(mesh, pls) and any(p.is_shard() and mesh.shape[m] > 1
                                               for m, p in enumerate(pls)):
                m = next(m for m, p in enumerate(pls) if p.is_shard() and mesh.shape[m] > 1)
                want = tuple(S0 if i == m else R for i in range(mesh.ndim))
                assert np.argwhere(dt).placements == want
                assert np.nonzero(dt)[0].placements == want


def test_bool_and_complex():
    mesh = mesh_of((W,))
    full = np.array([[0, 1j, 0], [2, 0, 1 + 1j], [0, 0, 0], [1, 0, 0], [0, 3, 0]])
    for pls in [(S0,), (S1,), (R,)]:
        dt = make(full, mesh, pls)
        assert_matches(np.argwhere(dt), np.argwhere(full))
        assert_matches(np.count_nonzero(dt, axis=1), np.count_nonzero(full, axis=1))
        b = make(full != 0, mesh, pls)
        compare_tuple(np.nonzero(b), np.nonzero(full != 0))


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_moves_indices_not_the_array(mesh_shape):
    mesh = mesh_of(mesh_shape)
    full = np.zeros((256, 64))
    rng = np.random.default_rng(3)
    full[rng.integers(0, 256, 200), rng.integers(0, 64, 200)] = 1.0
    layouts = [(S0,), (S1,)] if len(mesh_shape) == 1 else [(S0, R), (R, S1), (S1, R)]
    for pls in layouts:
        dt = make(full, mesh, pls)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            with CommDebugMode() as mode:
                got = np.argwhere(dt)
                count = np.count_nonzero(dt, axis=0)
        sent = sum(mode.get_comm_bytes().values())
        # A count per row and rank, and each index (with its position) at most once.
        assert sent <= 8 * (256 * W + 3 * 200), (pls, mode.get_comm_bytes())
        assert sent < full.nbytes // 8
        assert_matches(got, np.argwhere(full))
        assert_matches(count, np.count_nonzero(full, axis=0))
        if W > 1:
            assert got.placements != tuple(R for _ in pls)


def test_outside_mesh_rule_not_needed_for_replicate():
    mesh = mesh_of((W,))
    full = sparse((4, 3), 1)
    dt = make(full, mesh, (R,))
    with CommDebugMode() as mode:
        got = np.flatnonzero(dt)
    assert mode.get_total_counts() == 0
    assert_matches(got, np.flatnonzero(full))
