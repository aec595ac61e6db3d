"""NumPy operations on bfloat16 DTensors (ml_dtypes; skipped without it) give what
NumPy gives on the whole array: running sums and products round every step as
ml_dtypes' ufuncs do (bit for bit on one or two ranks; from three, the ranks'
offsets are sums of whole shards, rounded once), the first extreme is found as
numpy.argmax finds it, and numpy.dot keeps NumPy's result dtype (bfloat16),
though matmul's is float32. Runs at any number of ranks.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
W = MPI.COMM_WORLD.Get_size()


@pytest.fixture(scope="module")
def mesh():
    return mt.init_device_mesh("cpu", (W,))


def _same_scan(got, want):
    assert got.dtype == want.dtype == BF16
    if W <= 2:
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    else:
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                   rtol=2e-2)


def _data(shape, seed=0):
    # Values near 1 keep running products finite and sums' rounding visible.
    rng = np.random.default_rng(seed)
    return (1 + 0.1 * rng.standard_normal(shape)).astype(BF16)


@pytest.mark.parametrize("func", [np.cumsum, np.cumprod])
@pytest.mark.parametrize("axis", [0, 1])
def test_running_sums_and_products_round_each_step_as_numpy(mesh, func, axis):
    x = _data((9, 7))
    d = mt.distribute_tensor(x, mesh, [Shard(axis)])
    _same_scan(func(d, axis=axis).full_tensor(), func(x, axis=axis))


def test_running_sum_of_the_flattened_rows(mesh):
    x = _data((4 * W, 3), seed=1)
    d = mt.distribute_tensor(x, mesh, [Shard(0)])
    _same_scan(np.cumsum(d).full_tensor(), np.cumsum(x))


@pytest.mark.parametrize("func", [np.argmax, np.argmin])
@pytest.mark.parametrize("axis", [0, 1])
def test_first_extreme_along_a_sharded_axis(mesh, func, axis):
    x = _data((8, 6), seed=2)
    x[3, :] = x[5, :]  # ties: the first one wins
    d = mt.distribute_tensor(x, mesh, [Shard(axis)])
    np.testing.assert_array_equal(func(d, axis=axis).full_tensor(), func(x, axis=axis))


@pytest.mark.parametrize("placements", [[Shard(0)], [Replicate()]])
def test_dot_keeps_numpys_result_dtype(mesh, placements):
    a = _data((4, 6), seed=3)
    b = _data((6, 5), seed=4)
    da = mt.distribute_tensor(a, mesh, placements)
    db = mt.distribute_tensor(b, mesh, [Replicate()])
    got = np.dot(da, db).full_tensor()
    want = np.dot(a, b)
    assert got.dtype == want.dtype == BF16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2)
    assert np.matmul(da, db).dtype == np.matmul(a, b).dtype
