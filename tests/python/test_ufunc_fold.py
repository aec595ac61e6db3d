"""reduce, accumulate and reduceat of the ufuncs that may not be regrouped
(_algorithms/_fold.py): NumPy's left fold bit for bit, floats included, for sharded and
unsharded axes, uneven blocks and ranks with nothing; no all-gather of the array;
NumPy's errors on every rank. Whichever path runs (a block's own NumPy call, a
regrouping, the fold, the gathered call), the result's dtype decides it, and the
value is NumPy's: ufunc.at and maximum.reduce(dtype=) too."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from mpi_helpers import outcome, same_everywhere
from ops_helpers import W, assert_matches, make, mesh_of

R, S0, S1 = Replicate(), Shard(0), Shard(1)


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


@pytest.mark.world(4, reason="a 2 x 2 mesh")
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


# -- NumPy's value on every path: the result's dtype decides --------------------------

def _methods(ufunc, x, axis, idx):
    """reduce (and keepdims), accumulate and reduceat of ``x`` along ``axis``."""
    return (lambda: ufunc.reduce(x, axis=axis),
            lambda: ufunc.reduce(x, axis=axis, keepdims=True),
            lambda: ufunc.accumulate(x, axis=axis),
            lambda: ufunc.reduceat(x, idx, axis=axis))


@pytest.mark.parametrize("ufunc", [np.power, np.arctan2, np.subtract, np.divide, np.hypot,
                                   np.fmod, np.add, np.multiply])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.uint8])
def test_an_unsharded_axis_gives_numpys_value_in_every_layout(ufunc, dtype):
    """Along an axis no mesh dim cuts (Replicate, or a Shard of another dim, with
    blocks one column wide, several, or none), every method gives NumPy's bits:
    NumPy's own method on each block where that is NumPy's value whatever the
    block (float power's reduce of a column is ``x0 ** x_last`` on a machine with
    vector loops, of a wider block a left fold), else the warned gather."""
    rng = np.random.default_rng(11)
    for shape, pl, axis in (((5, 3), [R], 0), ((5, W), [S1], 0), ((5, 2 * W + 1), [S1], 0),
                            ((W, 5), [S0], 1), ((5, 3), [R], 1), ((5, 1), [S1], 0)):
        g = (rng.integers(1, 4, shape) if dtype == np.uint8
             else rng.uniform(0.5, 2.0, shape)).astype(dtype)
        x = make(g, mesh_of((W,)), pl)
        idx = [i % shape[axis] for i in (0, 3, 1, 1, -1)]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", mt.GatherWarning)
            for ours, numpys in zip(_methods(ufunc, x, axis, idx), _methods(ufunc, g, axis, idx)):
                same(ours(), numpys())


@pytest.mark.parametrize("ufunc", [np.hypot, np.logaddexp, np.logaddexp2])
@pytest.mark.parametrize("dtype", [np.uint8, np.bool_, np.float16])
def test_float16_results_along_a_sharded_axis_are_numpys_bits(ufunc, dtype):
    """hypot and logaddexp of uint8 or bool give float16, which NumPy rounds at
    each step: the fold along the ranks gives its bits (a regrouping was an ulp
    off), with no gather; the input's dtype does not decide, the result's does."""
    rng = np.random.default_rng(4)
    for shape, pl, axis in (((4 * W + 9, 3), [S0], 0), ((3, 4 * W + 9), [S1], 1)):
        g = (rng.random(shape) < 0.5 if dtype == np.bool_
             else rng.integers(0, 256, shape)).astype(dtype)
        x = make(g, mesh_of((W,)), pl)
        idx = [0, 5, 2, 2, 9, shape[axis] - 2]
        with mt.strict():
            for ours, numpys in zip(_methods(ufunc, x, axis, idx), _methods(ufunc, g, axis, idx)):
                same(ours(), numpys())


@pytest.mark.parametrize("pl", [[R], [S0]], ids=str)
def test_reduce_starts_from_the_identity_and_reduceat_from_the_element(pl):
    """NumPy's reduce folds from the ufunc's identity (hypot's reduce of a
    negative number is its magnitude, gcd's too), reduceat from the first element
    (a one-element segment is that element): each method keeps its own start."""
    g8 = np.array([-69, 3, -5, 7, -2, 9, 4], np.int8)
    for ufunc, g in ((np.hypot, g8), (np.gcd, g8.astype(np.int64))):
        x = make(g, mesh_of((W,)), pl)
        for length in (1, 7):
            part = make(g[:length], mesh_of((W,)), pl)
            same(ufunc.reduce(part), ufunc.reduce(g[:length]))
        same(ufunc.reduceat(x, [2, 1, 0, 5]), ufunc.reduceat(g, [2, 1, 0, 5]))
        same(ufunc.reduce(x[2:3]), ufunc.reduce(g[2:3]))


def test_maximum_and_minimum_reduce_take_dtype():
    """``dtype=`` casts the elements first, as NumPy's (uint64 above 2**63 wrap to
    negative int64 before the maximum is taken)."""
    g = np.array([[3, 2 ** 63 + 5, 1], [7, 2, 2 ** 64 - 1]], np.uint64)
    for pl in ([R], [S0], [S1]):
        x = make(g, mesh_of((W,)), pl)
        for ufunc in (np.maximum, np.minimum):
            for axis in (0, 1, None):
                for dtype in (np.float32, np.int64):
                    assert_matches(ufunc.reduce(x, axis=axis, dtype=dtype),
                                   ufunc.reduce(g, axis=axis, dtype=dtype))
    with pytest.raises(TypeError):
        np.maximum.reduce(make(np.ones(4), mesh_of((W,)), [S0]), dtype="U1")


def test_ufunc_at_raises_numpys_error_first_on_every_rank():
    """NumPy resolves ufunc.at's loop before it reads an index: bool subtract's
    TypeError comes before an index out of bounds, on every rank, whichever
    ranks the index would reach."""
    mesh = mesh_of((W,))
    b = make(np.zeros(10, bool), mesh, [S0])
    ints = make(np.zeros(10, np.int64), mesh, [S0])
    for ours, numpys in ((lambda: np.subtract.at(b, [11], True),
                          lambda: np.subtract.at(np.zeros(10, bool), [11], True)),
                         (lambda: np.subtract.at(b, [3], np.ones(1, bool)),
                          lambda: np.subtract.at(np.zeros(10, bool), [3], np.ones(1, bool))),
                         (lambda: np.negative.at(b, [11]),
                          lambda: np.negative.at(np.zeros(10, bool), [11])),
                         (lambda: np.add.at(ints, [11], 1),
                          lambda: np.add.at(np.zeros(10, np.int64), [11], 1))):
        want = outcome(numpys)
        got = same_everywhere(outcome(ours))
        assert got is not None and got[0] == want[0], (got, want)
    np.add.at(ints, [9, 0, 9], 2)
    assert_matches(ints, np.array([2] + [0] * 8 + [4]))
