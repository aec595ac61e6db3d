"""enable_2d_with_fsdp: parallelize_module on a 2-D (dp, tp) mesh shards over tp and
keeps parameters Replicate over dp; shard_over_dp shards them over dp as well, and
the forward, which all-gathers them over dp first, still gives the single-process
output of each replica's batch."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, nn
from mpitensor.debug import CommDebugMode
from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from mpitensor.parallel.fsdp import enable_2d_with_fsdp, shard_over_dp

W = MPI.COMM_WORLD.Get_size()
DP = 2 if W % 2 == 0 else 1
TP = W // DP


@pytest.fixture(autouse=True)
def _forward_only():
    """These tests check forward values and communication. Module parameters
    require grad (as torch's nn.Parameter), so in grad mode outputs would be
    recorded and local results be local DTensors; torch's own forward checks run
    under no_grad too (test_nn_autograd.py checks the backward)."""
    with mt.no_grad():
        yield


@pytest.fixture(scope="module")
def mesh2d():
    return mt.init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))


@pytest.fixture(autouse=True)
def disabled_after():
    """enable_2d_with_fsdp is process-wide, as torch's: other tests expect it off."""
    yield
    mt.parallel.fsdp._enabled[0] = False


def mlp():
    mt.manual_seed(4)
    return nn.FeedForward(6, 4 * TP + 2)


PLAN = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}


def batch(mesh2d):
    """Each data-parallel replica its own batch."""
    dp_rank = mesh2d.get_local_rank("dp")
    return np.random.default_rng(10 + dp_rank).standard_normal((3, 6))


def test_2d_needs_enabling_then_replicates_over_dp(mesh2d):
    with pytest.raises(ValueError, match="1D DeviceMesh"):
        parallelize_module(mlp(), mesh2d, dict(PLAN))
    assert enable_2d_with_fsdp() is True
    m = parallelize_module(mlp(), mesh2d, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    assert m.w1.weight.placements == (Replicate(), Shard(0))
    assert m.w2.weight.placements == (Replicate(), Shard(1))
    assert m.w2.bias.placements == (Replicate(), Replicate())
    np.testing.assert_array_equal(m.w1.weight.full_tensor(), mlp().w1.weight)
    x = batch(mesh2d)
    with CommDebugMode() as comm:
        y = m(x)
    assert dict(comm.get_comm_counts()) == ({"all_reduce": 1} if TP > 1 else {})
    np.testing.assert_allclose(y, mlp()(x), rtol=1e-10, atol=1e-12)
    assert m.w1.weight.device_mesh == mesh2d  # restored after the forward


def test_shard_over_dp_gathers_before_forward(mesh2d):
    enable_2d_with_fsdp()
    m = shard_over_dp(parallelize_module(mlp(), mesh2d, {"w1": ColwiseParallel(),
                                                          "w2": RowwiseParallel()}))
    if DP > 1:
        assert m.w1.weight.placements == (Shard(1), Shard(0))
        assert m.w2.weight.placements == (Shard(0), Shard(1))
    np.testing.assert_array_equal(m.w2.weight.full_tensor(), mlp().w2.weight)
    x = batch(mesh2d)
    with CommDebugMode() as comm:
        y = m(x)
    np.testing.assert_allclose(y, mlp()(x), rtol=1e-10, atol=1e-12)
    if DP > 1:
        assert comm.get_comm_counts()["all_gather_into_tensor"] >= 2
    assert m.w1.weight.placements == (Shard(1), Shard(0))  # restored after the forward
