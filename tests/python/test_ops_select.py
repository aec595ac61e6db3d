"""np.where, np.clip, DTensor.astype, DTensor.copy / np.copy on DTensors:
full_tensor() equals NumPy on the full arrays for random shapes (uneven shards,
broadcasting, scalars, np.clip's bounds as DTensors) and placements; copy and exact
casts keep every placement without communicating; inexact casts of a Partial
reduce it first."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpitensor import Partial, Shard, strict
from mpitensor.debug import CommDebugMode
from mpitensor.experimental import implicit_replication
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make,
                         matches_or_raises_alike, mesh_of, mesh_shapes, mesh_shapes_1d_2d,
                         next_layout, placements)

S0, S1, PS = Shard(0), Shard(1), Partial("sum")
MESHES_1D_2D = mesh_shapes_1d_2d()


@st.composite
def bshapes(draw, k):
    """k shapes that broadcast together."""
    out = tuple(draw(st.integers(1, 6)) for _ in range(draw(st.integers(1, 3))))
    shapes = []
    for _ in range(k):
        n = draw(st.integers(1, len(out)))
        shapes.append(tuple(draw(st.sampled_from([1, s])) for s in out[len(out) - n:]))
    return shapes


@settings(max_examples=50)
@given(data=st.data())
def test_where_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    sc, sx, sy = data.draw(bshapes(3))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    c = rng.integers(0, 2, size=sc).astype(bool)
    x = rng.integers(-5, 6, size=sx).astype(np.float64)
    y = rng.integers(-5, 6, size=sy).astype(np.int64)
    dc = make(c, mesh, placements(data.draw, c.ndim, mesh.ndim, partial=False))
    dx = make(x, mesh, placements(data.draw, x.ndim, mesh.ndim))
    dy = make(y, mesh, placements(data.draw, y.ndim, mesh.ndim))
    assert_matches(np.where(dc, dx, dy), np.where(c, x, y))
    assert_matches(np.where(dc, dx, 7), np.where(c, x, 7))
    assert_matches(np.where(dc, -1.5, dy), np.where(c, -1.5, y))
    assert_matches(np.where(True, dx, dy), np.where(True, x, y))


@settings(max_examples=50)
@given(data=st.data())
def test_clip_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    dtype = data.draw(st.sampled_from([np.float64, np.int64]))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    a = rng.integers(-5, 6, size=shape).astype(dtype)
    da = make(a, mesh, placements(data.draw, a.ndim, mesh.ndim))
    assert_matches(np.clip(da, -2, 3), np.clip(a, -2, 3))
    assert_matches(np.clip(da, None, 1), np.clip(a, None, 1))
    assert_matches(np.clip(da, -1, None), np.clip(a, -1, None))


@settings(max_examples=60)
@given(data=st.data())
def test_clip_with_dtensor_bounds_matches_numpy(data):
    """DTensor bounds broadcast with ``a`` and each other, one of them None or a
    scalar, ``a`` a scalar, the lower bound above the upper one in places, by
    keyword, and into out= of any layout."""
    mesh = mesh_of(data.draw(st.sampled_from(MESHES_1D_2D)))
    sa, sl, sh = data.draw(bshapes(3))
    ta, tl, th = (data.draw(st.sampled_from([np.float64, np.float32, np.int64]))
                  for _ in range(3))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    a = rng.integers(-5, 6, size=sa).astype(ta)
    lo = rng.integers(-4, 3, size=sl).astype(tl)
    hi = rng.integers(-2, 5, size=sh).astype(th)
    da, dl, dh = (make(x, mesh, placements(data.draw, x.ndim, mesh.ndim))
                  for x in (a, lo, hi))
    assert_matches(np.clip(da, dl, dh), np.clip(a, lo, hi))
    assert_matches(np.clip(da, dl, None), np.clip(a, lo, None))
    assert_matches(np.clip(da, None, dh), np.clip(a, None, hi))
    assert_matches(np.clip(da, -1, dh), np.clip(a, -1, hi))
    assert_matches(np.clip(da, dl, 2.5), np.clip(a, lo, 2.5))
    assert_matches(np.clip(1.5, dl, dh), np.clip(1.5, lo, hi))
    assert_matches(np.clip(da, min=dl, max=dh), np.clip(a, min=lo, max=hi))
    assert_matches(np.clip(da, max=dh), np.clip(a, max=hi))
    expect = np.clip(a, lo, hi)
    out = make(np.zeros(expect.shape, expect.dtype), mesh,
               placements(data.draw, expect.ndim, mesh.ndim))
    assert np.clip(da, dl, dh, out=out) is out
    assert_matches(out, expect)


@pytest.mark.usefixtures("strict_numpy")
@pytest.mark.parametrize("mesh_shape", MESHES_1D_2D, ids=str)
def test_clip_mixes_plain_ndarray_bounds_as_other_elementwise_operations(mesh_shape):
    """A plain ndarray bound is what it is to np.where and np.maximum: a Replicate
    operand (agreed on first outside implicit_replication()); and np.clip's own
    argument errors are NumPy's."""
    mesh = mesh_of(mesh_shape)
    a = np.arange(-6.0, 6.0).reshape(4, 3)
    lo, hi = np.array([-2.0, 0.0, 1.0]), np.array([[3.0], [-1.0], [2.0], [0.0]])
    da, dh = make(a, mesh, [S0] * mesh.ndim), make(hi, mesh, [S1] + [S0] * (mesh.ndim - 1))
    assert_matches(np.clip(da, np.array([0.5]), dh), np.clip(a, np.array([0.5]), hi))
    with implicit_replication():
        assert_matches(np.clip(da, lo, dh), np.clip(a, lo, hi))
        assert_matches(np.clip(da, lo, hi), np.clip(a, lo, hi))
    # Outside the context, the same calls are agreed first, with the same answers.
    assert_matches(np.clip(da, lo, dh), np.clip(a, lo, hi))
    assert_matches(np.where(da > 0, lo, dh), np.where(a > 0, lo, hi))
    assert_matches(np.maximum(da, lo), np.maximum(a, lo))
    matches_or_raises_alike(lambda: np.clip(da, dh), lambda: np.clip(a, hi))
    matches_or_raises_alike(lambda: np.clip(da, dh, 2, min=0), lambda: np.clip(a, hi, 2, min=0))
    matches_or_raises_alike(lambda: np.clip(da, a_max=dh), lambda: np.clip(a, a_max=hi))


@settings(max_examples=50)
@given(data=st.data())
def test_astype_copy_match_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    src = data.draw(st.sampled_from([np.float32, np.float64, np.int32, np.int64]))
    dst = data.draw(st.sampled_from([np.float32, np.float64, np.int8, np.int64,
                                     np.complex128, np.bool_]))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    a = (rng.integers(-300, 300, size=shape) / 4).astype(src)
    pls = placements(data.draw, a.ndim, mesh.ndim)
    da = make(a, mesh, pls)
    assert_matches(da.astype(dst), a.astype(dst))
    c = da.copy()
    assert c.placements == da.placements and c.dtype == da.dtype
    assert_matches(c, a)
    c2 = np.copy(da)
    assert c2.placements == da.placements
    assert_matches(c2, a)


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_where_clip_astype_match_numpy_on_empty_shards(shape):
    """The corners the property tests may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included),
    with operands laid out otherwise and scalars."""
    ndim = len(shape)
    a = (np.arange(int(np.prod(shape))).reshape(shape) % 5 - 2) / 2
    b = a[::-1] * 3
    for mesh, pls in corner_layouts(ndim):
        da, db = make(a, mesh, pls), make(b, mesh, next_layout(pls, ndim))
        dc = make(b > 0, mesh, next_layout(pls, ndim, partial=False))
        assert_matches(np.where(dc, da, db), np.where(b > 0, a, b))
        assert_matches(np.where(dc, da, 7), np.where(b > 0, a, 7))
        assert_matches(np.clip(da, -0.5, 0.5), np.clip(a, -0.5, 0.5))
        assert_matches(np.clip(da, db, 0.5), np.clip(a, b, 0.5))
        assert_matches(np.clip(-0.5, da, db), np.clip(-0.5, a, b))
        for dtype in (np.float32, np.int8, np.bool_):
            assert_matches(da.astype(dtype), a.astype(dtype))
        assert_matches(np.copy(db), b)


def test_copy_and_exact_cast_keep_partial_locally():
    mesh = mesh_of((W,))
    a = np.arange(12.0).reshape(4, 3) / 4  # exact in float32, partials too
    dp = make(a.astype(np.float32), mesh, [PS])
    ds = make(a, mesh, [S1])
    with CommDebugMode() as mode:
        c = dp.copy()
        w = dp.astype(np.float64)
        s = ds.astype(np.int32)
    assert mode.get_total_counts() == 0
    assert c.placements == (PS,) and w.placements == (PS,) and s.placements == (S1,)
    assert_matches(w, a.astype(np.float32).astype(np.float64))
    assert_matches(s, a.astype(np.int32))
    # c is a copy: writing it leaves dp alone
    c.to_local()[...] = 0
    assert_matches(dp, a.astype(np.float32))


def test_inexact_cast_of_partial_reduces_first():
    mesh = mesh_of((W,))
    a = np.full((4, 4), 2.5)  # partials 3 and 2.5 - 3(n-1): truncating each is wrong
    dp = make(a, mesh, [PS])
    with CommDebugMode() as mode:
        got = dp.astype(np.int64)
    assert not any(p.is_partial() for p in got.placements)
    assert mode.get_total_counts() == (1 if W > 1 else 0)
    assert_matches(got, a.astype(np.int64))


@pytest.mark.usefixtures("strict_numpy")
def test_errors():
    mesh = mesh_of((W,))
    dt = make(np.ones((4, 2)), mesh, [S0])
    # a plain operand is replicated once the ranks agree on it
    assert_matches(np.where(dt > 0, dt, np.ones((4, 2))), np.ones((4, 2)))
    assert_matches(np.clip(dt, dt, np.ones((4, 2))), np.ones((4, 2)))
    with strict(), pytest.raises(TypeError, match="x and y"):
        np.where(dt, dt)
    # The one-argument form is np.nonzero (test_ops_nonzero.py), not an error.
    assert_matches(np.where(dt)[1], np.where(np.ones((4, 2)))[1])
