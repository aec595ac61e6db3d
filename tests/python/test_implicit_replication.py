"""implicit_replication(): plain ndarrays mixed with DTensors count as Replicate."""

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from mpitensor.experimental import implicit_replication


def test_outside_the_context_mixing_is_agreed(mesh):
    """Outside the context a plain ndarray beside a DTensor is replicated too, as
    NumPy's libraries mix them, once the ranks agree that they hold the same one:
    a different one on some rank is a ValueError on every rank, and the next call
    pairs."""
    g = np.arange(15.0).reshape(5, 3)
    dt = mt.distribute_tensor(g, mesh, [Shard(0)])
    bias = np.array([1.0, 2.0, 3.0])
    for got in (dt + bias, bias + dt, np.add(dt, bias), np.dot(dt, bias),
                dt == np.arange(3.0)):
        assert isinstance(got, mt.DTensor)
    assert np.array_equal((dt + bias).full_tensor(), g + bias)
    assert np.array_equal(np.dot(dt, bias).full_tensor(), g @ bias)
    if mesh.size() > 1:
        mine = bias * (1 + mesh.get_rank())
        with pytest.raises(ValueError, match="different calls"):
            dt + mine
        with pytest.raises(ValueError, match="different calls"):
            np.dot(dt, mine)
    assert np.array_equal((dt - bias).full_tensor(), g - bias)


def test_elementwise_with_a_plain_array_is_local(mesh):
    g = np.arange(15.0).reshape(5, 3)
    dt = mt.distribute_tensor(g, mesh, [Shard(0)])
    bias = np.array([1.0, 2.0, 3.0])
    with implicit_replication(), CommDebugMode() as comm:
        out = dt + bias
    assert comm.get_total_counts() == 0
    assert out.placements == (Shard(0),)
    assert np.array_equal(out.full_tensor(), g + bias)


def test_matmul_dot_einsum_concatenate_where(mesh):
    g = np.arange(12.0).reshape(4, 3)
    w = np.arange(6.0).reshape(3, 2)
    dt = mt.distribute_tensor(g, mesh, [Shard(0)])
    with implicit_replication():
        assert np.allclose((dt @ w).full_tensor(), g @ w)
        assert np.allclose(np.dot(dt, w).full_tensor(), g @ w)
        assert np.allclose(np.einsum("ij,jk->ik", dt, w).full_tensor(), g @ w)
        assert np.array_equal(np.concatenate([dt, g], axis=1).full_tensor(),
                              np.concatenate([g, g], axis=1))
        assert np.array_equal(np.where(dt > 5, dt, g * 0).full_tensor(),
                              np.where(g > 5, g, 0))
    # Outside the context the same call is agreed first, with the same answer.
    assert np.allclose((dt @ w).full_tensor(), g @ w)


def test_nesting(mesh):
    dt = mt.distribute_tensor(np.zeros(4), mesh, [Replicate()])
    with implicit_replication():
        with implicit_replication():
            pass
        assert np.array_equal((dt + np.ones(4)).full_tensor(), np.ones(4))
