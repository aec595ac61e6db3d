"""``dt[rows, cols]``: an integer array (or int) per dim picks points, as NumPy picks
them (scikit-learn's weighted percentile indexes ``array[argsort[-1], arange]``):
NumPy's values, shapes and IndexError on every rank, nothing gathered."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import GatherWarning, Replicate, Shard
from ops_helpers import W, assert_matches, make, mesh_layouts, mesh_of

R, S0, S1 = Replicate(), Shard(0), Shard(1)
FULL = np.random.default_rng(0).standard_normal((9, 5))


def _keys(dt_of):
    """(our key, NumPy's key) pairs; ``dt_of(array)`` makes a DTensor index."""
    am = np.argmax(FULL, axis=0)
    return [((dt_of(am), np.arange(5)), (am, np.arange(5))),
            (([0, -1, 3], [4, 0, -2]),) * 2,
            ((np.array([[1], [2]]), np.array([0, 1, 2])),) * 2,
            ((dt_of(np.array([8, 0, 1])), 2), (np.array([8, 0, 1]), 2)),
            ((dt_of(np.array([8, 0, 1])), dt_of(np.array([4, 4, 0]))),
             (np.array([8, 0, 1]), np.array([4, 4, 0])))]


@pytest.mark.parametrize("mesh_shape, pls", mesh_layouts((S0, S1), (S1, S0)), ids=str)
def test_points_are_numpys(mesh_shape, pls):
    mesh = mesh_of(mesh_shape)
    dt = make(FULL, mesh, pls)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        for ours, numpys in _keys(lambda a: make(a, mesh, [S0] + [R] * (mesh.ndim - 1))):
            assert_matches(dt[ours], FULL[numpys])


@pytest.mark.parametrize("key", [([0, 9], [0, 1]), ([0, 1], [0, 5]), ([0, -10], [0, 1])],
                         ids=str)
def test_points_out_of_bounds_are_numpys_index_error(key):
    """Each index is checked against its own dim: (0, 5) of a 9 x 5 array is not
    the flat element 5."""
    dt = make(FULL, mesh_of((W,)), [S0])
    with pytest.raises(IndexError):
        FULL[key]
    with pytest.raises(IndexError):
        dt[key]
    with pytest.raises(IndexError):
        dt[make(np.array(key[0]), mesh_of((W,)), [S0]), np.array(key[1])]
