"""numpy.reshape and DTensor.reshape: full_tensor() equals NumPy's reshape of the
full array for random shapes, regroupings and placements (uneven shards, Partial,
1-D and 2-D meshes); merged and split groups keep a Shard exactly when every
rank's share scales, without communication; bad shapes fail on every rank."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from mpitensor.placement_types import _StridedShard
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make, mesh_of,
                         mesh_shapes, placements)

R, S0, S1, PS, PMAX = Replicate(), Shard(0), Shard(1), Partial("sum"), Partial("max")


def _factor(draw, n):
    """A random shape of product n (n >= 1), size-1 dims sprinkled in."""
    dims = []
    while n > 1:
        divisors = [d for d in range(2, n + 1) if n % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        n //= d
    dims = list(draw(st.permutations(dims)))
    for _ in range(draw(st.integers(0, 2))):
        dims.insert(draw(st.integers(0, len(dims))), 1)
    return tuple(dims) or (1,)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_reshape_matches_numpy(data):
    size = data.draw(st.sampled_from([1, 2, 6, 8, 12, 24, 30, 36, 60]))
    src, dst = _factor(data.draw, size), _factor(data.draw, size)
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    full = np.arange(size, dtype=np.int64).reshape(src) - size // 2
    pls = placements(data.draw, len(src), mesh.ndim)
    dt = make(full, mesh, pls)
    if data.draw(st.booleans()) and dst.count(1) < len(dst):
        k = data.draw(st.sampled_from([d for d, n in enumerate(dst) if n != 1]))
        dst = dst[:k] + (-1,) + dst[k + 1:]
    got = data.draw(st.sampled_from(["np", "method", "args"]))
    if got == "np":
        out = np.reshape(dt, dst)
    elif got == "method":
        out = dt.reshape(dst)
    else:
        out = dt.reshape(*dst)
    assert_matches(out, full.reshape(dst))
    # Partials pass through unreduced; a result that kept every Shard moved nothing.
    for m, (p, q) in enumerate(zip(pls, out.placements)):
        assert p.is_partial() == q.is_partial() or mesh.shape[m] == 1


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_reshape_matches_numpy_on_empty_shards(shape):
    """The corners the property test may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included):
    flattened and back, the dims reversed, and a dim of one added in front; a
    merge whose earlier dim is cut unevenly moves the data instead of taking a
    strided view."""
    ndim = len(shape)
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) - 2
    for mesh, pls in corner_layouts(ndim):
        dt = make(full, mesh, pls)
        flat = dt.reshape(-1)
        assert_matches(flat, full.reshape(-1))
        assert_matches(flat.reshape(shape), full)
        assert_matches(np.reshape(dt, shape[::-1]), full.reshape(shape[::-1]))
        assert_matches(dt.reshape((1,) + shape), full.reshape((1,) + shape))


def test_merge_and_split_keep_even_shards_without_communication():
    mesh = mesh_of((W,))
    full = np.arange(4 * W * 6.0).reshape(4 * W, 6)
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        merged = dt.reshape(-1)
        split = np.reshape(dt, (2 * W, 2, 6))
        both = dt.reshape(6 * W, 4)              # (4W, 6) -> (6W, 4): one group
        back = merged.reshape(4 * W, 6)
    assert mode.get_total_counts() == 0
    for got, shape in ((merged, (24 * W,)), (split, (2 * W, 2, 6)),
                       (both, (6 * W, 4)), (back, (4 * W, 6))):
        assert got.placements == (S0,)
        assert got.to_local().size == 24
        assert_matches(got, full.reshape(shape))


def test_partial_passes_through():
    mesh = mesh_of((W,))
    full = np.arange(24.0).reshape(4, 6)
    for p in (PS, PMAX):
        dt = make(full, mesh, [p]) if p is PS else _pmax(full, mesh)
        with CommDebugMode() as mode:
            out = dt.reshape(2, 3, 4)
        assert mode.get_total_counts() == 0
        assert out.placements == (p,)
        assert_matches(out, full.reshape(2, 3, 4))


def _pmax(full, mesh):
    from mpitensor import DTensor

    coord = mesh.get_coordinate()[0]
    local = full if coord == 0 else full - 100
    return DTensor.from_local(local, mesh, [PMAX], shape=full.shape, stride=(6, 1))


def test_uneven_shards_that_scale_stay_sharded():
    # 5 rows of 2 over 3 ranks are (2, 2, 1) rows, (4, 4, 2) of 10 elements.
    if W != 3:
        pytest.skip("needs 3 ranks")
    mesh = mesh_of((3,))
    full = np.arange(10).reshape(5, 2)
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        out = dt.reshape(10)
    assert mode.get_total_counts() == 0
    assert out.placements == (S0,)
    assert_matches(out, full.reshape(10))


def test_shard_that_cannot_stay_moves_the_cheapest_way():
    mesh = mesh_of((W,))
    # A shard on a merged dim that is not the group's leftmost stays where it is,
    # as torch's _StridedShard (tests/python/test_strided_shard.py).
    full = np.arange(2 * W * 2 * W).reshape(2 * W, 2 * W)
    dt = make(full, mesh, [S1])
    with CommDebugMode() as mode:
        out = dt.reshape(-1)
    assert_matches(out, full.reshape(-1))
    assert mode.get_total_counts() == 0
    assert out.placements == (_StridedShard(0, split_factor=2 * W),)
    # A group that merges and splits at once has no such view: an all-to-all onto
    # the leftmost dim (cheaper than the all-gather torch does).
    with CommDebugMode() as mode:
        out = dt.reshape(W, 4 * W)
    assert_matches(out, full.reshape(W, 4 * W))
    assert dict(mode.get_comm_counts()) == ({"all_to_all_single": 1} if W > 1 else {})
    assert out.placements == (S0,) or W == 1
    # Uneven shares: 3 rows of 2 over 2 ranks are (4, 2) elements but 6 over 2 is
    # (3, 3), so the input is gathered.
    if W == 2:
        full = np.arange(6).reshape(3, 2)
        out = make(full, mesh, [S0]).reshape(6)
        assert out.placements == (R,)
        assert_matches(out, full.reshape(6))


def test_reshape_on_2d_mesh():
    if W != 4:
        pytest.skip("needs 4 ranks")
    mesh = mesh_of((2, 2))
    full = np.arange(8 * 6.0).reshape(8, 6)
    a, b = make(full, mesh, [S0, S0]), make(full, mesh, [S0, PS])
    with CommDebugMode() as mode:
        nested = a.reshape(48)
        mixed = b.reshape(4, 2, 6)
    assert mode.get_total_counts() == 0
    assert nested.placements == (S0, S0) and mixed.placements == (S0, PS)
    assert_matches(nested, full.reshape(48))
    assert_matches(mixed, full.reshape(4, 2, 6))


def test_zero_size_and_0d():
    mesh = mesh_of((W,))
    empty = make(np.zeros((0, 4)), mesh, [S1])
    assert_matches(empty.reshape(2, 0, 2), np.zeros((2, 0, 2)))
    scalar = make(np.array(3.0), mesh, [R])
    assert_matches(scalar.reshape(1, 1), np.full((1, 1), 3.0))
    assert_matches(make(np.arange(1.0), mesh, [S0]).reshape(()), np.array(0.0))


@pytest.mark.parametrize("shape, exc, words", [
    ((5, 5), ValueError, "cannot reshape"),
    ((-1, -1), ValueError, "one unknown"),
    ((-2, 12), ValueError, "negative"),
    ((2.5, 2), TypeError, "integer"),
    ((24.0,), TypeError, "integer"),       # after (24,) was cached: still refused
    ([True, 24], TypeError, "booleans"),
])
def test_bad_shapes_fail_on_every_rank(shape, exc, words):
    dt = make(np.arange(24.0).reshape(4, 6), mesh_of((W,)), [S0])
    dt.reshape(24)
    with pytest.raises(exc, match=words):
        dt.reshape(shape)


@pytest.mark.usefixtures("strict_numpy")
def test_order_f_is_refused():
    dt = make(np.arange(24.0).reshape(4, 6), mesh_of((W,)), [S0])
    with pytest.raises(TypeError, match="order='F'"):
        np.reshape(dt, (6, 4), order="F")
    assert math.prod(dt.reshape(6, 4, order="A").shape) == 24


def test_repeated_reshapes_and_shape_kinds():
    mesh = mesh_of((W,))
    full = np.arange(24.0).reshape(4, 6)
    a, b = make(full, mesh, [S0]), make(2 * full, mesh, [S0])
    for _ in range(2):
        assert_matches(a.reshape([2, 12]), full.reshape(2, 12))
        assert_matches(b.reshape(2, 12), 2 * full.reshape(2, 12))
        assert_matches(np.reshape(a, np.array([6, 4])), full.reshape(6, 4))
        assert_matches(a.reshape(np.int64(24)), full.reshape(24))


@pytest.mark.usefixtures("strict_numpy")
def test_ravel_and_flatten_are_reshape_minus_one():
    mesh = mesh_of((W,))
    full = np.arange(4 * W * 6.0).reshape(4 * W, 6)
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        outs = [np.ravel(dt), dt.ravel(), dt.flatten(), np.ravel(dt, order="A")]
    assert mode.get_total_counts() == 0
    for got in outs:
        assert got.shape == (24 * W,) and got.placements == (S0,)
        assert_matches(got, full.ravel())
    # flatten copies: writing its local array leaves the input alone
    flat = dt.flatten()
    flat.to_local()[...] = -1.0
    assert_matches(dt, full)
    # a Shard of a later dim cannot stay: the input moves, the values are NumPy's
    uneven = np.arange(5 * 7.0).reshape(5, 7)
    assert_matches(make(uneven, mesh, [S1]).ravel(), uneven.ravel())
    # the other orders are NumPy's too, and flatten copies in every order
    for order in ("F", "A", "K"):
        assert_matches(np.ravel(dt, order=order), full.ravel(order=order))
        assert_matches(dt.T.flatten(order=order), full.T.flatten(order=order))
        flat = dt.T.flatten(order=order)
        flat[0] = 1000.0
        assert_matches(dt, full)
    with pytest.raises(TypeError, match="order='X'"):
        dt.flatten(order="X")
