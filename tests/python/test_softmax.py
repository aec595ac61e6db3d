"""mpitensor.nn.functional.softmax / log_softmax on DTensors and plain arrays:
full_tensor() equals a float64 NumPy reference for random shapes (uneven shards)
and placements; the softmax axis ends Replicate while other Shards are kept, and
a Shard of another dim needs no communication."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpitensor
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from mpitensor.nn import functional as F
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make, mesh_of,
                         mesh_shapes, placements)

R, S0, S1 = Replicate(), Shard(0), Shard(1)


def ref_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def ref_log_softmax(x, axis):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


@settings(max_examples=50)
@given(data=st.data())
def test_softmax_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    x = rng.integers(-8, 9, size=shape).astype(np.float64) / 2
    pls = placements(data.draw, x.ndim, mesh.ndim)
    dx = make(x, mesh, pls)
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    ax = axis % x.ndim
    untouched = W > 1 and Shard(ax) not in pls and not any(p.is_partial() for p in pls)
    for f, ref in ((F.softmax, ref_softmax), (F.log_softmax, ref_log_softmax)):
        with CommDebugMode() as mode:
            got = f(dx, axis=axis)
        assert Shard(ax) not in got.placements
        assert not any(p.is_partial() for p in got.placements)
        if untouched:  # nothing moves; other Shards kept (degenerate size-1
            # dims may be relabelled when that moves no data)
            assert mode.get_total_counts() == 0
            if min(shape) > 1:
                assert got.placements == pls
        assert_matches(got, ref(x, ax))
        np.testing.assert_allclose(f(x, axis), ref(x, ax), rtol=1e-12)


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_softmax_matches_numpy_on_empty_shards(shape):
    """The corners the property test may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included),
    along every axis; an empty array gives an empty one."""
    ndim = len(shape)
    x = np.arange(float(np.prod(shape))).reshape(shape) % 5 - 2
    for mesh, pls in corner_layouts(ndim):
        dx = make(x, mesh, pls)
        for axis in range(ndim):
            if x.size:
                assert_matches(F.softmax(dx, axis=axis), ref_softmax(x, axis))
                assert_matches(F.log_softmax(dx, axis=axis), ref_log_softmax(x, axis))
            else:
                assert_matches(F.softmax(dx, axis=axis), x)
                assert_matches(F.log_softmax(dx, axis=axis), x)


def test_softmax_sharded_rows_no_communication():
    mesh = mesh_of((W,))
    x = np.arange(7 * 5.0).reshape(7, 5) / 3  # uneven rows
    dx = make(x, mesh, [S0])
    with CommDebugMode() as mode:
        y = F.softmax(dx, axis=1)
        z = F.log_softmax(dx, axis=-1)
    assert mode.get_total_counts() == 0
    want = (S0,)
    assert y.placements == want and z.placements == want
    assert_matches(y, ref_softmax(x, 1))
    assert_matches(z, ref_log_softmax(x, 1))
    if W == 4:
        mesh2 = mesh_of((2, 2))
        x3 = np.arange(5 * 3 * 4.0).reshape(5, 3, 4)
        d3 = make(x3, mesh2, [S0, Shard(2)])
        y3 = F.softmax(d3, axis=2)
        assert y3.placements[0] == S0 and Shard(2) not in y3.placements
        assert_matches(y3, ref_softmax(x3, 2))


def test_stable_and_plain_arrays():
    mesh = mesh_of((W,))
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, 0.0, 1000.0]])
    y = F.softmax(make(x, mesh, [S1]), axis=1)
    assert np.isfinite(y.full_tensor()).all()
    assert_matches(y, ref_softmax(x, 1))
    assert np.isfinite(F.log_softmax(x, axis=1)).all()
    assert F.softmax(np.array([1, 2, 3])).dtype == np.float64
    assert mpitensor.nn.functional is F


def test_errors():
    with pytest.raises(np.exceptions.AxisError):
        F.softmax(np.ones((2, 3)), axis=2)
