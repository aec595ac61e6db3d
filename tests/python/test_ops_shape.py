"""Shape operations on DTensors (transpose, .T, swapaxes, moveaxis, squeeze,
expand_dims, broadcast_to, concatenate, stack): full_tensor() equals NumPy on the
full arrays for random shapes (uneven shards included) and placements; permutations
move Shards with their dims and never communicate."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make, mesh_of,
                         mesh_shapes, next_layout, placements)

R, S0, S1, S2, PS = Replicate(), Shard(0), Shard(1), Shard(2), Partial("sum")


def _shape(draw, lo=1, hi=4, maxdim=5):
    return tuple(draw(st.integers(lo, maxdim)) for _ in range(draw(st.integers(lo, hi))))


def _setup(data, shape, dtype=np.float64):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    full = rng.integers(-5, 6, size=shape).astype(dtype)
    return mesh, full, make(full, mesh, placements(data.draw, full.ndim, mesh.ndim))


@settings(max_examples=40)
@given(data=st.data())
def test_permutations_match_numpy_without_communication(data):
    shape = data.draw(st.builds(tuple, st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    mesh, full, dt = _setup(data, shape)
    n = full.ndim
    perm = tuple(data.draw(st.permutations(range(n))))
    i, j = data.draw(st.integers(-n, n - 1)), data.draw(st.integers(-n, n - 1))
    src = data.draw(st.integers(0, n - 1))
    dst = data.draw(st.integers(0, n - 1))
    with CommDebugMode() as mode:
        results = [
            (np.transpose(dt, perm), np.transpose(full, perm), perm),
            (np.transpose(dt), full.T, tuple(range(n - 1, -1, -1))),
            (dt.T, full.T, tuple(range(n - 1, -1, -1))),
            (dt.transpose(*perm), full.transpose(*perm), perm),
            (dt.transpose(perm), full.transpose(perm), perm),
            (np.swapaxes(dt, i, j), np.swapaxes(full, i, j), None),
            (np.moveaxis(dt, src, dst), np.moveaxis(full, src, dst), None),
        ]
    assert mode.get_total_counts() == 0
    for got, expect, p in results:
        if p is not None:
            inv = {q: k for k, q in enumerate(p)}
            want = tuple(Shard(inv[x.dim]) if isinstance(x, Shard) else x
                         for x in dt.placements)
            assert got.placements == want
        assert_matches(got, expect)


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_shape_functions_match_numpy_on_empty_shards(shape):
    """The corners the property tests may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included):
    permutations, squeeze and expand_dims, broadcast_to, and concatenate and
    stack with a second array laid out otherwise."""
    ndim = len(shape)
    full = np.arange(float(np.prod(shape))).reshape(shape) - 2
    for mesh, pls in corner_layouts(ndim):
        dt = make(full, mesh, pls)
        other = make(full + 10, mesh, next_layout(pls, ndim))
        assert_matches(dt.T, full.T)
        assert_matches(np.moveaxis(dt, 0, -1), np.moveaxis(full, 0, -1))
        assert_matches(np.swapaxes(dt, 0, -1), np.swapaxes(full, 0, -1))
        assert_matches(np.squeeze(dt), np.squeeze(full))
        assert_matches(np.expand_dims(dt, (0, -1)), np.expand_dims(full, (0, -1)))
        assert_matches(np.broadcast_to(dt, (2,) + shape), np.broadcast_to(full, (2,) + shape))
        for axis in range(ndim):
            assert_matches(np.concatenate([dt, other], axis=axis),
                           np.concatenate([full, full + 10], axis=axis))
        assert_matches(np.stack([other, dt], axis=-1), np.stack([full + 10, full], axis=-1))


def test_transpose_placements_exact():
    mesh = mesh_of((W,))
    full = np.arange(2 * 3 * 5.0).reshape(2, 3, 5)
    dt, dp = make(full, mesh, [S2]), make(full, mesh, [PS])
    with CommDebugMode() as mode:
        t = np.transpose(dt, (2, 0, 1))
        m = np.moveaxis(dt, 0, -1)
        p = dp.T
    assert mode.get_total_counts() == 0
    assert t.placements == (S0,) and m.placements == (S1,) and p.placements == (PS,)
    assert_matches(t, np.transpose(full, (2, 0, 1)))
    assert_matches(m, np.moveaxis(full, 0, -1))
    assert_matches(p, full.T)
    if W == 4:
        mesh2 = mesh_of((2, 2))
        d2 = make(full, mesh2, [S0, S2])
        with CommDebugMode() as mode:
            t2 = d2.transpose(2, 1, 0)
        assert mode.get_total_counts() == 0
        assert t2.placements == (S2, S0)
        assert_matches(t2, full.transpose(2, 1, 0))


def test_transpose_is_a_view_of_the_local_array():
    # As NumPy's: a copy would cost a full pass over the weight in every x @ w.T
    # (nn.functional.linear), which once halved tensor-parallel speed.
    mesh = mesh_of((W,))
    w = make(np.arange(8 * 6.0).reshape(8, 6), mesh, [S0])
    t = w.T
    assert np.shares_memory(t.to_local(), w.to_local())
    full = np.arange(8 * 6.0).reshape(8, 6)
    assert_matches(t @ make(np.ones((8, 2)), mesh, [S0]), full.T @ np.ones((8, 2)))


@settings(max_examples=40)
@given(data=st.data())
def test_squeeze_expand_dims_match_numpy(data):
    shape = data.draw(st.builds(tuple, st.lists(st.integers(1, 3), min_size=1, max_size=4)))
    mesh, full, dt = _setup(data, shape)
    ones = [d for d in range(full.ndim) if shape[d] == 1]
    assert_matches(np.squeeze(dt), np.squeeze(full))
    if ones:
        ax = data.draw(st.sampled_from(ones))
        assert_matches(np.squeeze(dt, axis=ax), np.squeeze(full, axis=ax))
    ax = data.draw(st.integers(-full.ndim - 1, full.ndim))
    assert_matches(np.expand_dims(dt, ax), np.expand_dims(full, ax))
    assert_matches(np.expand_dims(dt, (0, -1)), np.expand_dims(full, (0, -1)))


@settings(max_examples=40)
@given(data=st.data())
def test_broadcast_to_matches_numpy(data):
    shape = data.draw(st.builds(tuple, st.lists(st.sampled_from([1, 2, 3, 5]),
                                                min_size=1, max_size=3)))
    mesh, full, dt = _setup(data, shape)
    target = tuple(data.draw(st.integers(1, 4)) if s == 1 else s for s in shape)
    lead = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2)))
    target = lead + target
    assert_matches(np.broadcast_to(dt, target), np.broadcast_to(full, target))


@pytest.mark.skipif(W < 2, reason="needs a rank outside the mesh")
def test_transpose_on_a_rank_outside_the_mesh():
    from mpitensor import DeviceMesh, distribute_tensor

    mesh = DeviceMesh("cpu", list(range(W - 1)))
    x = distribute_tensor(np.arange(6.0).reshape(2, 3), mesh, [Shard(0)])
    for y in (x.T, np.swapaxes(x, 0, 1), np.transpose(x, (1, 0))):
        assert y.shape == (3, 2) and y.placements == (Shard(1),)
        if mesh.get_coordinate() is not None:
            np.testing.assert_array_equal(y.full_tensor(), np.arange(6.0).reshape(2, 3).T)


def test_broadcast_to_of_a_0d_dtensor_keeps_its_dims():
    mesh = mesh_of((W,))
    for pls in ([Replicate()], [Partial("sum")]):
        x = make(np.array(2.0), mesh, pls)
        for shape in [(), (1,), (3, 2)]:
            y = np.broadcast_to(x, shape)
            assert y.to_local().shape == shape
            assert_matches(y, np.broadcast_to(np.array(2.0), shape))


@settings(max_examples=40)
@given(data=st.data())
def test_concatenate_stack_match_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    base = data.draw(st.builds(list, st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    ax = data.draw(st.integers(-len(base), len(base) - 1))
    k = data.draw(st.integers(1, 4))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    fulls, dts = [], []
    for _ in range(k):
        shape = list(base)
        shape[ax] = data.draw(st.integers(1, 5))
        f = rng.integers(-5, 6, size=shape).astype(np.float64)
        fulls.append(f)
        dts.append(make(f, mesh, placements(data.draw, f.ndim, mesh.ndim)))
    assert_matches(np.concatenate(dts, axis=ax), np.concatenate(fulls, axis=ax))
    same = [make(rng.integers(-5, 6, size=base).astype(np.float64), mesh,
                 placements(data.draw, len(base), mesh.ndim)) for _ in range(k)]
    sax = data.draw(st.integers(-len(base) - 1, len(base)))
    assert_matches(np.stack(same, axis=sax),
                   np.stack([d.full_tensor() for d in same], axis=sax))


def test_concatenate_keeps_other_shards():
    mesh = mesh_of((W,))
    a, b = np.arange(24.0).reshape(8, 3), np.arange(16.0).reshape(8, 2)
    da, db = make(a, mesh, [S0]), make(b, mesh, [S0])
    with CommDebugMode() as mode:
        c = np.concatenate([da, db], axis=1)
        s = np.stack([da, da], axis=1)
    assert mode.get_total_counts() == 0
    assert c.placements == (S0,)
    assert s.placements == (S0,)
    assert_matches(c, np.concatenate([a, b], axis=1))
    assert_matches(s, np.stack([a, a], axis=1))
    p = np.concatenate([make(a, mesh, [PS]), make(a, mesh, [PS])])
    assert_matches(p, np.concatenate([a, a]))


@pytest.mark.parametrize("count", [9, 13, 70])
def test_joins_of_more_dtensors_than_a_dim_map_takes_are_joined_in_groups(count):
    """np.concatenate, np.stack, hstack and vstack of more DTensors than one dim map
    takes (xarray's resample stacks one per period) join them in groups and then the
    groups: NumPy's answer, nothing gathered (strict()), gradients too; NumPy's
    errors for shapes that do not fit."""
    mesh = mesh_of((W,))
    fulls = [np.arange(15.0).reshape(3, 5) * k for k in range(count)]
    for pls in ([S0], [S1], [R]):
        dts = [make(a, mesh, pls) for a in fulls]
        with mt.strict():
            for f, kw in ((np.stack, {}), (np.stack, {"axis": -1}), (np.concatenate, {}),
                          (np.concatenate, {"axis": 1}), (np.concatenate, {"axis": None}),
                          (np.hstack, {}), (np.vstack, {})):
                assert_matches(f(dts, **kw), f(fulls, **kw))
    odd = [make(np.ones((3, 5)), mesh, [S0])] * count + [make(np.ones((3, 4)), mesh, [S0])]
    for f in (np.stack, np.concatenate):
        with pytest.raises(ValueError):
            f(odd, axis=0)
    x = make(fulls[1], mesh, [S0])
    x.requires_grad_(True)
    np.stack([x * k for k in range(count)]).sum().backward()
    np.testing.assert_allclose(x.grad.full_tensor(), np.full((3, 5), count * (count - 1) / 2))


def test_errors():
    mesh = mesh_of((W,))
    dt = make(np.ones((4, 2)), mesh, [S0])
    # a plain operand is replicated once the ranks agree on it
    assert_matches(np.concatenate([dt, np.ones((4, 2))]), np.ones((8, 2)))
    with pytest.raises(ValueError):
        np.squeeze(dt, axis=0)
    with pytest.raises(ValueError):
        np.broadcast_to(dt, (3, 2))
