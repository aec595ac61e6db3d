"""np.concatenate along a sharded axis, the joining shorthands (hstack, vstack,
column_stack, dstack, append) and the splits (split, array_split, hsplit, vsplit, dsplit)
of 1-D arrays: NumPy's value and dtype on every rank for every layout of the
suite's meshes on corner and uneven shapes; along a sharded axis nothing is
gathered (no GatherWarning, no fallback under strictness), the result stays
sharded, and only rows whose owner changes move, in one exchange (the counts,
then the rows)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, corner_layouts, make, mesh_of, next_layout

R, S0, S1 = Replicate(), Shard(0), Shard(1)
LENGTHS = (0, 1, 3, 5, 9)


@pytest.mark.parametrize("n", LENGTHS)
def test_concatenate_1d_every_layout(n):
    a = np.arange(n, dtype=np.float64) + 0.5
    b = -np.arange(n + 2, dtype=np.int32)
    for mesh, pls in corner_layouts(1):
        da, db = make(a, mesh, pls), make(b, mesh, next_layout(pls, 1))
        with warnings.catch_warnings(), mpitensor.strict():
            warnings.simplefilter("error", GatherWarning)
            assert_matches(np.concatenate([da, db, da]), np.concatenate([a, b, a]))
            assert_matches(np.hstack([db, da]), np.hstack([b, a]))
            assert_matches(np.vstack([da, da]), np.vstack([a, a]))
            assert_matches(np.column_stack([da, da]), np.column_stack([a, a]))
            assert_matches(np.dstack([da, da]), np.dstack([a, a]))


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (1, 2), (5, 3), (7, 2, 2)], ids=str)
def test_concatenate_nd_every_axis(shape):
    full = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        other = make(full * 2, mesh, next_layout(pls, len(shape)))
        with warnings.catch_warnings(), mpitensor.strict():
            warnings.simplefilter("error", GatherWarning)
            for axis in range(len(shape)):
                assert_matches(np.concatenate([dt, other], axis=axis),
                               np.concatenate([full, full * 2], axis=axis))
            if len(shape) >= 2:
                assert_matches(np.vstack([dt, other]), np.vstack([full, full * 2]))
                assert_matches(np.hstack([other, dt]), np.hstack([full * 2, full]))
                assert_matches(np.column_stack([dt, dt]), np.column_stack([full, full]))


def test_concatenate_along_the_shard_moves_rows_once():
    mesh = mesh_of((W,))
    a, b = np.arange(1000.0), np.arange(600.0)
    da, db = make(a, mesh, [S0]), make(b, mesh, [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            c = np.concatenate([da, db])
    assert_matches(c, np.concatenate([a, b]))
    sent = sum(mode.get_comm_bytes().values())
    # This rank's rows at most once (plus one count per rank), never the whole.
    assert sent <= da.to_local().nbytes + db.to_local().nbytes + 8 * W, mode.get_comm_bytes()
    if W > 1:
        assert c.placements == (S0,)
        assert dict(mode.get_comm_counts()) == {"all_to_all_single": 2}
    else:
        assert mode.get_total_counts() == 0


def test_concatenate_of_a_non_sharded_axis_moves_nothing():
    mesh = mesh_of((W,))
    full = np.arange(24.0).reshape(8, 3)
    dt, col = make(full, mesh, [S0]), make(full[:, 0], mesh, [S0])
    with CommDebugMode() as mode:
        c = np.hstack([dt, dt])
        s = np.column_stack([col, col])
    assert mode.get_total_counts() == 0
    assert c.placements == s.placements == (S0,)
    assert_matches(c, np.hstack([full, full]))
    assert_matches(s, np.column_stack([full[:, 0]] * 2))


def test_concatenate_errors_on_every_rank():
    mesh = mesh_of((W,))
    a = make(np.zeros((4, 3)), mesh, [S0])
    b = make(np.zeros((4, 2)), mesh, [S0])
    with pytest.raises(ValueError, match="except for the concatenation axis must match"):
        np.concatenate([a, b], axis=0)
    with pytest.raises(ValueError, match="same number of dimensions"):
        np.concatenate([a, make(np.zeros(4), mesh, [S0])], axis=0)
    with pytest.raises(ValueError, match="zero-dimensional"):
        np.concatenate([make(np.zeros(()), mesh, [R])] * 2)
    with pytest.raises(np.exceptions.AxisError):
        np.concatenate([a, a], axis=2)
    other = mpitensor.init_device_mesh("cpu", (1, W))
    with pytest.raises(ValueError, match="mesh"):
        np.concatenate([a, make(np.zeros((4, 3)), other, [R, S0])], axis=1)
    with pytest.raises(ValueError):
        np.vsplit(make(np.zeros(4), mesh, [S0]), 2)
    with pytest.raises(ValueError):
        np.dsplit(a, 2)
    with pytest.raises(ValueError):
        np.split(make(np.zeros(5), mesh, [S0]), 2)


SECTIONS = [1, 2, 3, [1, 4], [0, 2, 9], [5, 2], [3, 3]]


@pytest.mark.parametrize("n", LENGTHS + (12,))
def test_split_1d_every_layout(n):
    full = np.arange(n, dtype=np.int64) * 3
    for mesh, pls in corner_layouts(1):
        dt = make(full, mesh, pls)
        with warnings.catch_warnings(), mpitensor.strict():
            warnings.simplefilter("error", GatherWarning)
            for sections in SECTIONS:
                got, want = np.array_split(dt, sections), np.array_split(full, sections)
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    assert_matches(g, w)
            if n % 3 == 0:
                for g, w in zip(np.hsplit(dt, 3), np.hsplit(full, 3)):
                    assert_matches(g, w)


def test_split_along_the_shard_keeps_it_and_moves_rows_once():
    mesh = mesh_of((W,))
    full = np.arange(1001.0)
    dt = make(full, mesh, [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            pieces = np.array_split(dt, [100, 700])
    for g, w in zip(pieces, np.array_split(full, [100, 700])):
        assert_matches(g, w)
        assert g.placements == (S0 if W > 1 else R,)
    sent = sum(mode.get_comm_bytes().values())
    assert sent <= dt.to_local().nbytes + 8 * W, mode.get_comm_bytes()
    if W > 1:
        assert dict(mode.get_comm_counts()) == {"all_to_all_single": 2}


def test_hsplit_vsplit_dsplit():
    full = np.arange(4 * 6 * 2.0).reshape(4, 6, 2)
    for mesh, pls in corner_layouts(3, partial=False):
        dt = make(full, mesh, pls)
        for f, k in [(np.hsplit, 3), (np.vsplit, [1, 3]), (np.dsplit, 2)]:
            got, want = f(dt, k), f(full, k)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert_matches(g, w)


@pytest.mark.parametrize("n", LENGTHS)
def test_append(n):
    full = np.arange(n, dtype=np.float32)
    mat = np.arange(n * 2).reshape(n, 2)
    for mesh, pls in corner_layouts(1):
        dt = make(full, mesh, pls)

        def check():
            assert_matches(np.append(dt, [1.5, 2.5]), np.append(full, [1.5, 2.5]))
            assert_matches(np.append([7], dt), np.append([7], full))
            assert_matches(np.append(dt, dt), np.append(full, full))
        with warnings.catch_warnings(), mpitensor.strict():
            warnings.simplefilter("error", GatherWarning)
            check()
    for mesh, pls in corner_layouts(2, partial=False):
        dm = make(mat, mesh, pls)
        with warnings.catch_warnings(), mpitensor.strict():
            warnings.simplefilter("error", GatherWarning)
            assert_matches(np.append(dm, [[1, 2]], axis=0), np.append(mat, [[1, 2]], axis=0))
            assert_matches(np.append(dm, [9]), np.append(mat, [9]))
    mesh = mesh_of((W,))
    with pytest.raises(ValueError):
        np.append(make(full, mesh, [S0]), 3.0, axis=0)
