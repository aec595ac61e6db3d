"""parallelize_module: plan dict keys matched per path segment with fnmatch, ""
for the root, unmatched keys warned about, bad plans and meshes refused, no plan
warned about, and src_data_rank passed to the styles."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Replicate, Shard, nn
from mpitensor.debug import CommDebugMode
from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

W = MPI.COMM_WORLD.Get_size()


# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        mt.manual_seed(0)
        self.net1 = nn.Linear(8, 8)
        self.net2 = nn.Linear(8, 8)
        self.net3 = nn.Linear(8, 8)
        self.layers = nn.ModuleList([nn.FeedForward(8, 12) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def placements(net):
    return {n: p.placements for n, p in net.named_parameters() if isinstance(p, DTensor)}


def test_fnmatch_keys(mesh):
    net = parallelize_module(Net(), mesh, {"net[1-2]": ColwiseParallel(),
                                           "layers.*.w1": ColwiseParallel(),
                                           "layers.1.w2": RowwiseParallel()})
    got = placements(net)
    assert got["net1.weight"] == (Shard(0),) and got["net2.weight"] == (Shard(0),)
    assert "net3.weight" not in got
    assert got["layers.0.w1.weight"] == (Shard(0),) and got["layers.1.w1.weight"] == (Shard(0),)
    assert "layers.0.w2.weight" not in got and got["layers.1.w2.weight"] == (Shard(1),)
    net = parallelize_module(Net(), mesh, {"net*": ColwiseParallel()})
    assert len(placements(net)) == 6


def test_root_key_and_single_style(mesh):
    lin = parallelize_module(nn.Linear(4, 4), mesh, {"": ColwiseParallel()})
    assert lin.weight.placements == (Shard(0),)
    lin = parallelize_module(nn.Linear(4, 4), mesh, RowwiseParallel())
    assert lin.weight.placements == (Shard(1),)


def test_plan_gives_single_process_output(mesh):
    x = np.random.default_rng(0).standard_normal((3, 8))
    ref = Net()(x)
    net = parallelize_module(Net(), mesh, {"layers.*.w1": ColwiseParallel(),
                                           "layers.*.w2": RowwiseParallel()})
    with CommDebugMode() as comm:
        y = net(x)
    assert dict(comm.get_comm_counts()) == ({"all_reduce": 2} if W > 1 else {})
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-12)


def test_unmatched_key_warns(mesh):
    with pytest.warns(UserWarning, match="'layers.*.nothing' could not be resolved"):
        parallelize_module(Net(), mesh, {"layers.*.nothing": ColwiseParallel()})
    with pytest.warns(UserWarning, match="token 'zz'"):
        parallelize_module(Net(), mesh, {"zz": ColwiseParallel()})


def test_no_plan_warns_and_returns_module(mesh):
    net = Net()
    with pytest.warns(UserWarning, match="No parallelize_plan"):
        assert parallelize_module(net, mesh) is net
    assert placements(net) == {}


def test_bad_plans_and_meshes(mesh):
    with pytest.raises(TypeError, match="parallelize_plan"):
        parallelize_module(Net(), mesh, [ColwiseParallel()])
    with pytest.raises(TypeError, match="ParallelStyle"):
        parallelize_module(Net(), mesh, {"net1": "colwise"})
    with pytest.raises(TypeError, match="nn.Module"):
        parallelize_module(object(), mesh, ColwiseParallel())
    if W == 4:
        mesh2 = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        with pytest.raises(ValueError, match=r'1D DeviceMesh.*device_mesh\["tp"\]'):
            parallelize_module(Net(), mesh2, {"net1": ColwiseParallel()})
        net = parallelize_module(Net(), mesh2["tp"], {"net1": ColwiseParallel()})
        assert net.net1.weight.to_local().shape == (4, 8)
    with pytest.raises(ValueError, match="src_data_rank"):
        parallelize_module(Net(), mesh, ColwiseParallel(), src_data_rank=3)


def test_src_data_rank(mesh):
    """0 scatters the first rank's values; None lets every rank cut its own copy."""
    def differing():
        mt.manual_seed(MPI.COMM_WORLD.Get_rank())  # a different model on each rank
        return nn.Linear(4, 4 * W)

    mt.manual_seed(0)
    first = nn.Linear(4, 4 * W)
    a = parallelize_module(differing(), mesh, ColwiseParallel(), src_data_rank=0)
    np.testing.assert_array_equal(a.weight.full_tensor(), first.weight)
    mine = differing()
    b = parallelize_module(differing(), mesh, ColwiseParallel(), src_data_rank=None)
    r = MPI.COMM_WORLD.Get_rank()
    np.testing.assert_array_equal(b.weight.to_local(), mine.weight[4 * r:4 * r + 4])
