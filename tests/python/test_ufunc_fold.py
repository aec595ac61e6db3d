"""reduce, accumulate and reduceat of the ufuncs that may not be regrouped
(_ops/_fold.py): NumPy's left fold bit for bit, floats included, for sharded and
unsharded axes, uneven blocks and ranks with nothing; no all-gather of the array;
NumPy's errors on every rank."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, make, mesh_of

S0, S1 = Shard(0), Shard(1)


def operand(ufunc, shape):
    rng = np.random.default_rng(7)
    if ufunc in (np.less, np.greater_equal):
        return rng.random(shape) < 0.5
    if ufunc in (np.floor_divide, np.lcm, np.left_shift, np.power):
        return rng.integers(1, 4, shape).astype(np.int64)
    if ufunc is np.divide:
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return rng.uniform(-2.0, 2.0, shape)


def same(got, want):
    full = got.full_tensor()
    assert full.dtype == want.dtype and full.shape == want.shape
    np.testing.assert_array_equal(full, want)


@pytest.mark.parametrize("ufunc", [np.subtract, np.divide, np.power, np.copysign,
                                   np.floor_divide, np.lcm, np.less, np.left_shift])
@pytest.mark.parametrize("shape,pl,axis", [((7,), [S0], 0), ((2, 3), [S0], 0),
                                           ((5, 3), [S0], 1), ((3, 6), [S1], 1)])
def test_fold_is_numpys_bit_for_bit(ufunc, shape, pl, axis):
    g = operand(ufunc, shape)
    x = make(g, mesh_of((W,)), pl)
    same(ufunc.reduce(x, axis=axis), ufunc.reduce(g, axis=axis))
    same(ufunc.reduce(x, axis=axis, keepdims=True), ufunc.reduce(g, axis=axis, keepdims=True))
    same(ufunc.accumulate(x, axis=axis), ufunc.accumulate(g, axis=axis))
    idx = [i % shape[axis] for i in (0, 3, 1, 1, 2)]
    same(ufunc.reduceat(x, idx, axis=axis), ufunc.reduceat(g, idx, axis=axis))


@pytest.mark.skipif(W != 4, reason="a 2 x 2 mesh")
@pytest.mark.parametrize("pl,axis", [([S0, S1], 1), ([S1, S0], 0)])
def test_fold_along_one_dim_of_a_2d_mesh(pl, axis):
    g = np.random.default_rng(3).uniform(-2.0, 2.0, (5, 7))
    x = make(g, mesh_of((2, 2)), pl)
    same(np.subtract.reduce(x, axis=axis), np.subtract.reduce(g, axis=axis))
    same(np.divide.accumulate(x, axis=axis), np.divide.accumulate(g, axis=axis))
    same(np.fmod.reduceat(x, [0, 3, 1], axis=axis), np.fmod.reduceat(g, [0, 3, 1], axis=axis))


def test_fold_moves_slices_and_never_gathers_the_array():
    g = np.linspace(1.0, 2.0, 4 * W * 3).reshape(4 * W, 3)
    x = make(g, mesh_of((W,)), [S0])
    with CommDebugMode() as mode:
        r = np.divide.reduce(x, axis=0)
        s = np.subtract.accumulate(x, axis=0)
    counts = mode.get_comm_counts()
    assert counts.get("all_gather_into_tensor", 0) == 0
    # Shifts of one slice: W for reduce, W - 1 for accumulate, and one broadcast.
    assert mode.get_total_counts() == (2 * W if W > 1 else 0)
    # A rank sends at most two slices and their flags, and the broadcast delivers
    # one to each other rank: never a block.
    assert sum(mode.get_comm_bytes().values()) <= 2 * (3 * 8 + 1) + 3 * 8 * (W - 1)
    assert r.placements == (Replicate(),) and s.placements == (S0,)
    same(r, np.divide.reduce(g, axis=0))
    same(s, np.subtract.accumulate(g, axis=0))


def test_fold_raises_numpys_errors_on_every_rank():
    x = make(np.arange(1.0, 8.0), mesh_of((W,)), [S0])
    with pytest.raises(TypeError, match="ldexp"):
        np.ldexp.reduce(x)
    with pytest.raises(TypeError, match="less"):
        np.less.accumulate(x)
    with pytest.raises(ValueError, match="single value"):
        np.divmod.reduce(x)
    empty = make(np.zeros((0, 2)), mesh_of((W,)), [S0])
    with pytest.raises(ValueError, match="no identity"):
        np.subtract.reduce(empty, axis=0)
    ints = make(np.array([6, 3, 1, 1, 1, 1, 1, 0]), mesh_of((W,)), [S0])
    with np.errstate(divide="raise"), pytest.raises(FloatingPointError):
        np.floor_divide.accumulate(ints)


@pytest.mark.parametrize("ufunc,dtype", [(np.power, np.float64), (np.arctan2, np.float64),
                                         (np.subtract, np.float16)])
def test_floats_numpy_does_not_fold_gather_and_answer_numpys_value(ufunc, dtype):
    g = np.linspace(0.5, 1.5, 18).astype(dtype).reshape(9, 2)
    x = make(g, mesh_of((W,)), [S0])
    with pytest.warns(mt.GatherWarning):
        got = ufunc.reduce(x)
    same(got, ufunc.reduce(g))
