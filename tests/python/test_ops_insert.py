"""np.insert into DTensors: NumPy's values on every rank for every layout of the
suite's meshes (Partial included) on corner and uneven shapes, every form of
``obj`` NumPy reads (an int, a slice, ints, a bool mask, negatives, repeats) and
``values`` broadcast along the other dims; NumPy's exception type on every rank
for a bad ``obj``; along a sharded axis only the old rows whose owner changes
move, in one exchange, and nothing is gathered."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, corner_layouts, make, matches_or_raises_alike, mesh_of
from test_ops_take import strictly

R, S0, S1 = Replicate(), Shard(0), Shard(1)
LENGTHS = (0, 1, 3, 5, 9)


@pytest.mark.parametrize("n", LENGTHS)
def test_insert_into_a_vector_every_layout(n):
    vec = np.arange(n, dtype=np.float32) * 2
    cases = [(0, 7.0), (n, [1.0, 2.0]), (-1 if n else 0, [[3.0], [4.0]]),
             ([0, n, 0], [5.0, 6.0, 7.0]), (slice(0, n, 2), -1.0), ([], 1.0),
             (np.arange(n) % 2 == 0, 9.0), ([n + 1], 0.0), (np.zeros((1, 1), int), 0.0),
             ([[0, 1]], 0.0), (np.ones((2, 2), bool), 0.0)]
    for mesh, pls in corner_layouts(1):
        dv = make(vec, mesh, pls)

        def check():
            for obj, values in cases:
                matches_or_raises_alike(lambda: np.insert(dv, obj, values),
                                        lambda: np.insert(vec, obj, values))
        strictly(check)


@pytest.mark.parametrize("n", LENGTHS)
def test_insert_into_a_matrix_along_each_axis(n):
    mat = np.arange(n * 3).reshape(n, 3)
    cases = [(0, 1, -5), (n, 0, [7, 8, 9]), ([1, 0], 1, [[1], [2]] if n else 0),
             (1, 1, np.arange(n).reshape(n, 1) if n else 3), ([0, 2], 1, -1),
             (n, None, [1, 2]), ([0, 3 * n], None, 4), (0, 0, [1, 2])]
    for mesh, pls in corner_layouts(2):
        dm = make(mat, mesh, pls)

        def check():
            for obj, axis, values in cases:
                matches_or_raises_alike(lambda: np.insert(dm, obj, values, axis=axis),
                                        lambda: np.insert(mat, obj, values, axis=axis))
            with pytest.raises(np.exceptions.AxisError):
                np.insert(dm, 0, 1, axis=2)
        with warnings.catch_warnings(), mpitensor.strict():
            # Two mesh dims that shard one axis: one of them gathers along it,
            # which the rule reports; the fallback would raise here.
            warnings.simplefilter("ignore", GatherWarning)
            check()


def test_insert_moves_only_the_rows_whose_owner_changes():
    mesh = mesh_of((W,))
    full = np.arange(1000.0)
    dt = make(full, mesh, [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            got = np.insert(dt, [500, 10], [-1.0, -2.0])
    assert_matches(got, np.insert(full, [500, 10], [-1.0, -2.0]))
    assert sum(mode.get_comm_bytes().values()) <= dt.to_local().nbytes + 8 * W
    if W > 1:
        assert got.placements == (S0,)
        assert dict(mode.get_comm_counts()) == {"all_to_all_single": 2}


def test_insert_along_an_unsharded_axis_moves_nothing():
    mesh = mesh_of((W,))
    full = np.arange(8 * 6).reshape(8, 6)
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        got = np.insert(dt, [1, 6], np.arange(8).reshape(8, 1) * 100, axis=1)
    assert mode.get_total_counts() == 0
    assert got.placements == dt.placements
    assert_matches(got, np.insert(full, [1, 6], np.arange(8).reshape(8, 1) * 100, axis=1))
