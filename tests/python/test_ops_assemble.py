"""``np.block``, ``np.ix_``, ``np.apply_over_axes`` and ``np.diagflat`` of DTensors
(_assemble.py): NumPy's value on every rank for Shard(0), Shard(1), Replicate and a
2-D mesh, uneven shapes where a rank holds no rows, run by the DTensor rules of their steps
(strict mode: nothing falls back to a gather); NumPy's exceptions for bad
arguments; the gradient of ``block`` flows back to its pieces, and ``diagflat``,
which has no backward, refuses grad mode."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, make, mesh_of

R, S0, S1 = Replicate(), Shard(0), Shard(1)


def layouts():
    out = [((W,), (p,)) for p in (R, S0, S1)]
    if W == 4:
        out += [((2, 2), (S0, S1))]
    return out


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_block_matches_numpy(layout):
    mesh = mesh_of(layout[0])
    a, b = np.arange(6.0).reshape(3, 2), np.arange(3.0).reshape(3, 1) + 10
    c, d = np.ones((1, 2)), np.array([[7.0]])
    da, db, dc = (make(x, mesh, layout[1]) for x in (a, b, c))
    with mt.strict():
        assert_matches(np.block([[da, db], [dc, d]]), np.block([[a, b], [c, d]]))
        assert_matches(np.block([da, db]), np.block([a, b]))
        assert_matches(np.block(da), np.block(a))
        assert_matches(np.block([[[da]]]), np.block([[[a]]]))
        v = make(np.arange(2.0), mesh, (S0,) * len(layout[0]))
        assert_matches(np.block([v, 1.0, v]), np.block([np.arange(2.0), 1.0, np.arange(2.0)]))
    with pytest.raises(ValueError):
        np.block([[da], db])
    with pytest.raises(ValueError):
        np.block([[], [da]])
    with pytest.raises(TypeError):
        np.block((da, db))


def test_block_gradient_reaches_every_piece():
    mesh = mesh_of((W,))
    a = make(np.arange(4.0).reshape(2, 2), mesh, [S0]).requires_grad_(True)
    b = make(np.ones((2, 1)), mesh, [S0]).requires_grad_(True)
    (np.block([a, b]) * 3.0).sum().backward()
    assert_matches(a.grad, np.full((2, 2), 3.0))
    assert_matches(b.grad, np.full((2, 1), 3.0))


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_ix_matches_numpy(layout):
    mesh = mesh_of(layout[0])
    # one mesh dim cuts the vectors: nonzero's rule (of the boolean one) takes that
    pls = (S0 if layout[1][0].is_shard() else R,) + (R,) * (len(layout[0]) - 1)
    rows, cols = np.array([2, 0]), np.array([True, False, True, True, False])
    full = np.arange(15.0).reshape(3, 5)
    with mt.strict():
        got = np.ix_(make(rows, mesh, pls), make(cols, mesh, pls), [1])
        want = np.ix_(rows, cols, [1])
        for g, w in zip(got, want):
            assert_matches(g, w)
        r, c = np.ix_(make(rows, mesh, pls), make(cols, mesh, pls))
        assert r.placements == pls and r.shape == (2, 1) and c.shape == (1, 3)
    with pytest.raises(ValueError):
        np.ix_(make(full, mesh, layout[1]))


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_apply_over_axes_matches_numpy(layout):
    mesh = mesh_of(layout[0])
    full = np.arange(3 * 5 * 2, dtype=np.float64).reshape(3, 5, 2) - 7
    a = make(full, mesh, layout[1])
    with mt.strict():
        for func, axes in ((np.sum, [0, 2]), (np.max, -1), (np.mean, (1,))):
            assert_matches(np.apply_over_axes(func, a, axes),
                           np.apply_over_axes(func, full, axes))
    with pytest.raises(ValueError):
        np.apply_over_axes(lambda x, ax: x.sum(), a, [0])


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_diagflat_matches_numpy(layout):
    mesh = mesh_of(layout[0])
    full = np.arange(6.0).reshape(3, 2) + 1
    a = make(full, mesh, layout[1])
    vec = make(np.arange(1, 4), mesh, (S0,) + (R,) * (len(layout[0]) - 1))
    with mt.strict():
        for k in (0, 2, -1, -4):
            assert_matches(np.diagflat(a, k), np.diagflat(full, k))
            assert_matches(np.diagflat(vec, k), np.diagflat(np.arange(1, 4), k))
    assert np.diagflat(vec).placements == vec.placements


def test_diagflat_of_rows_moves_nothing():
    mesh = mesh_of((W,))
    v = make(np.arange(2.0 * W), mesh, [S0])
    with CommDebugMode() as comm:
        got = np.diagflat(v)
    assert sum(comm.get_comm_bytes().values()) == 0
    assert got.placements == (S0,)
    assert_matches(got, np.diagflat(np.arange(2.0 * W)))
    with pytest.raises(NotImplementedError):
        np.diagflat(v.requires_grad_(True))
