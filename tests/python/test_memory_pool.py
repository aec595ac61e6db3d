"""Large outputs take their memory from the core's block pool and give it back when
dropped, so the next redistribute of that size reuses resident memory."""

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, _comm

W = MPI.COMM_WORLD.Get_size()
BIG = (256 * W, 512)  # 1 MiB of float64 per rank once sharded


@pytest.fixture
def pool_limit():
    limit = _comm.pool_set_limit(0)  # an empty pool: blocks earlier tests left may fill its slots
    _comm.pool_set_limit(limit)
    yield
    _comm.pool_set_limit(limit)


def test_dropped_outputs_return_to_the_pool_and_are_reused(pool_limit):
    mesh = mt.init_device_mesh("cpu", (W,))
    data = np.arange(np.prod(BIG), dtype=np.float64).reshape(BIG)
    dt = mt.distribute_tensor(data, mesh, [Shard(0)])
    local = dt.to_local()
    assert local.nbytes >= 1 << 20
    before = _comm.pool_cached_bytes()
    del dt, local
    assert _comm.pool_cached_bytes() >= before + (1 << 20)
    again = mt.distribute_tensor(data, mesh, [Shard(0)])
    assert _comm.pool_cached_bytes() < before + (1 << 20)  # the block was taken back
    assert np.array_equal(again.full_tensor(), data)


def test_pooled_arrays_behave_like_numpy_arrays(pool_limit):
    mesh = mt.init_device_mesh("cpu", (W,))
    data = np.ones(BIG, dtype=np.float32)
    out = mt.distribute_tensor(data, mesh, [Replicate()]).to_local()
    out.resize((out.size,), refcheck=False)  # realloc through the pool allocator
    assert out.shape == (data.size,) and np.all(out == 1)
    view = out[::2]
    del out
    assert np.all(view == 1)  # a view keeps the pooled block alive


def test_limit_zero_caches_nothing(pool_limit):
    _comm.pool_set_limit(0)
    mesh = mt.init_device_mesh("cpu", (W,))
    dt = mt.distribute_tensor(np.zeros(BIG), mesh, [Shard(0)])
    del dt
    assert _comm.pool_cached_bytes() == 0
