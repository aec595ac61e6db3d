"""enable_2d_with_fsdp: parallelize_module on a 2-D (dp, tp) mesh shards over tp and
keeps parameters Replicate over dp (DDP's replicas): the forward gives the
single-process output of each replica's batch, and the backward the gradients of the
whole batch, averaged over the replicas. (Sharding over dp is fully_shard's:
test_fsdp.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Replicate, Shard, nn
from mpitensor.device_mesh import local_mesh
from mpitensor.debug import CommDebugMode
from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from mpitensor.parallel.fsdp import enable_2d_with_fsdp

W = MPI.COMM_WORLD.Get_size()
DP = 2 if W % 2 == 0 else 1
TP = W // DP


# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")


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


class TanhMLP(nn.Module):
    def __init__(self):
        super().__init__()
        mt.manual_seed(4)
        self.w1 = nn.Linear(6, 4 * TP + 2)
        self.w2 = nn.Linear(4 * TP + 2, 6)

    def forward(self, x):
        return self.w2(np.tanh(self.w1(x)))


def test_replicas_average_gradients(mesh2d):
    """Parameters Replicate over dp are DDP's replicas: each replica's gradient of
    its own batch's loss, averaged over dp, is the gradient of the whole batch's."""
    with mt.enable_grad():
        _replicas_average_gradients(mesh2d)


def _replicas_average_gradients(mesh2d):
    enable_2d_with_fsdp()
    m = parallelize_module(TanhMLP(), mesh2d, dict(PLAN))
    rng = np.random.default_rng(3)
    x, t = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    d = mesh2d.get_local_rank("dp")
    rows = slice(d * 4 // DP, (d + 1) * 4 // DP)
    lm = local_mesh()
    y = m(DTensor.from_local(x[rows], mesh2d["tp"], [Replicate()]))
    ((y - DTensor.from_local(t[rows], lm, [Replicate()])) ** 2).mean().backward()
    ref = TanhMLP()
    for mod in ref.modules():
        for name, p in list(mod._parameters.items()):
            mod._parameters[name] = DTensor.from_local(np.array(p), lm,
                                                       [Replicate()]).requires_grad_()
    y = ref(DTensor.from_local(x, lm, [Replicate()]))
    ((y - DTensor.from_local(t, lm, [Replicate()])) ** 2).mean().backward()
    want = {n: p.grad.to_local() for n, p in ref.named_parameters()}
    for name, p in m.named_parameters():
        np.testing.assert_allclose(p.grad.detach().full_tensor(), want[name], rtol=1e-10,
                                   atol=1e-14, err_msg=name)
