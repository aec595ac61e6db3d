"""fully_shard's ``dp_mesh_dims`` (torch 2.13's SPMD mesh): the parameters are
DTensors on the whole mesh, Replicate over the data-parallel dims, and FSDP shards
them over the named shard dim on that mesh, keeping their other placements; the
unsharded parameters are DTensors on the whole mesh, so a batch sharded over the
data-parallel dim is the global batch. Without torch: the placements, the
gradients (the data-parallel sum divided by the data-parallel size, as torch's
reduce-scatter averages) and the errors. With torch (gloo, side by side): the same
losses, gradients and parameters after SGD steps, in float64, and no collective
run more often than torch's."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, nn
from mpitensor.debug import CommDebugMode
from mpitensor.fsdp import DataParallelMeshDims, fully_shard
from mpitensor.optim import SGD

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
LR, STEPS = 0.1, 2
X = np.random.default_rng(0).standard_normal((4 * W, 6))
T = np.random.default_rng(1).standard_normal((4 * W, 4))
# (in, out) of the two layers; the tp dim (at np 4: 2) splits the hidden width
DIMS = (6, 8, 4)


def weights():
    rng = np.random.default_rng(5)
    return [rng.standard_normal((DIMS[0], DIMS[1])) * 0.5, rng.standard_normal(DIMS[1]) * 0.1,
            rng.standard_normal((DIMS[1], DIMS[2])) * 0.5]


class Net(nn.Module):
    """x @ w1 + b1, tanh, @ w2: column-wise then row-wise over tp when the mesh
    has one (placements given), Replicate elsewhere."""

    def __init__(self, mesh, placements):
        super().__init__()
        w1, b1, w2 = weights()
        self.w1 = nn.Parameter(mt.distribute_tensor(w1, mesh, placements[0]))
        self.b1 = nn.Parameter(mt.distribute_tensor(b1, mesh, placements[1]))
        self.w2 = nn.Parameter(mt.distribute_tensor(w2, mesh, placements[2]))

    def forward(self, x):
        return np.tanh(x @ self.w1 + self.b1) @ self.w2


# The kinds of SPMD mesh: (its dim names, the mesh dims fully_shard is given)
KINDS = {"dp": (("dp",), dict(shard="dp")), "dp-tp": (("dp", "tp"), dict(shard="dp")),
         "hsdp": (("r", "dp"), dict(shard="dp", replicate="r"))}


def layouts(kind):
    """The parameters' placements: Replicate but over tp."""
    if kind != "dp-tp":
        return [[Replicate()] * len(KINDS[kind][0])] * 3
    return [[Replicate(), Shard(1)], [Replicate(), Shard(0)], [Replicate(), Shard(0)]]


def spmd_mesh(kind):
    names = KINDS[kind][0]
    shape = (W,) if len(names) == 1 else (2, 2)
    return mt.init_device_mesh("cpu", shape, mesh_dim_names=names)


def dims(kind):
    return DataParallelMeshDims(**KINDS[kind][1])


def kinds():
    return ["dp"] + (["dp-tp", "hsdp"] if W == 4 else [])


def batch(mesh):
    """The inputs and targets, sharded over the data-parallel dims: the global
    batch."""
    pls = [Shard(0) if n in ("dp", "r") else Replicate() for n in mesh.mesh_dim_names]
    return mt.distribute_tensor(X, mesh, pls), mt.distribute_tensor(T, mesh, pls)


def loss_of(model, x, t):
    d = model(x) - t
    return (d * d).mean()


def reference_grads():
    """The gradients of the mean loss over the whole batch, in NumPy."""
    w1, b1, w2 = weights()
    h = np.tanh(X @ w1 + b1)
    d = h @ w2 - T
    gy = 2 * d / d.size
    gw2 = h.T @ gy
    gh = gy @ w2.T * (1 - h * h)
    return [X.T @ gh, gh.sum(0), gw2]


@pytest.mark.parametrize("kind", kinds())
def test_parameters_shard_over_the_named_dim_on_the_whole_mesh(kind):
    mesh = spmd_mesh(kind)
    model = fully_shard(Net(mesh, layouts(kind)), mesh=mesh, dp_mesh_dims=dims(kind))
    for (name, p), pls in zip(model.named_parameters(), layouts(kind)):
        assert p.device_mesh is mesh or p.device_mesh.mesh_dim_names[-1] == "dp", name
        named = dict(zip(p.device_mesh.mesh_dim_names, p.placements))
        assert named["dp"] == Shard(0), (name, p.placements)
        if kind == "dp-tp":
            assert named["tp"] == pls[1], (name, p.placements)
        if kind == "hsdp":
            assert named["r"] == Replicate(), (name, p.placements)
    loss = loss_of(model, *batch(mesh))
    loss.backward()
    for (name, p), g in zip(model.named_parameters(), reference_grads()):
        assert p.grad.placements == p.placements, name
        # torch's reduce-scatter averages over dp whatever the gradient held
        dp = mesh.size() if kind == "hsdp" else mesh.size(0)
        np.testing.assert_allclose(p.grad.full_tensor(), g / dp, rtol=1e-10, err_msg=name)


def test_errors_are_torchs():
    mesh = spmd_mesh("dp")
    with pytest.raises(ValueError, match="At least one of shard or replicate"):
        DataParallelMeshDims()
    with pytest.raises(ValueError, match="Mesh dim name 'cp' not found"):
        fully_shard(Net(mesh, layouts("dp")), mesh=mesh,
                    dp_mesh_dims=DataParallelMeshDims(shard="cp"))
    with pytest.raises(NotImplementedError, match="reshard_after_forward as int"):
        fully_shard(Net(mesh, layouts("dp")), mesh=mesh, reshard_after_forward=W,
                    dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    plain = mt.init_device_mesh("cpu", (W,))
    with pytest.raises(ValueError, match="mesh must have mesh_dim_names"):
        fully_shard(Net(plain, layouts("dp")), mesh=plain,
                    dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    if W > 1:
        net = Net(mesh, layouts("dp"))
        net.w2 = nn.Parameter(mt.distribute_tensor(weights()[2], mesh, [Shard(0)]))
        with pytest.raises(ValueError, match="Expected Replicate"):
            fully_shard(net, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    # torch 2.13 has no per-parameter replication through shard_placement_fn
    with pytest.raises(ValueError, match="Invalid shard_placement_fn result"):
        fully_shard(Net(mesh, layouts("dp")), mesh=mesh, dp_mesh_dims=dims("dp"),
                    shard_placement_fn=lambda p: Replicate())
    net = Net(mesh, layouts("dp"))
    net.w2 = nn.Parameter(weights()[2])
    with pytest.raises(ValueError, match="all parameters must be DTensors"):
        fully_shard(net, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))


def run_ours(kind):
    mesh = spmd_mesh(kind)
    model = fully_shard(Net(mesh, layouts(kind)), mesh=mesh, dp_mesh_dims=dims(kind))
    opt = SGD(model.parameters(), lr=LR)
    x, t = batch(mesh)
    losses, counts = [], {}
    for _ in range(STEPS):
        with CommDebugMode() as comm:
            loss = loss_of(model, x, t)
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach().full_tensor()))
        for k, n in comm.get_comm_counts().items():
            counts[k] = counts.get(k, 0) + n
    return losses, [p.detach().full_tensor() for p in model.parameters()], counts


def run_torch(kind):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_api import (
        DataParallelMeshDims as TorchDims)
    from torch.distributed.tensor import Replicate as TR, Shard as TS, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode as TorchComm
    from fsdp_torch import torch_counts
    from torch_helpers import init_gloo

    init_gloo()
    names = KINDS[kind][0]
    tmesh = init_device_mesh("cpu", (W,) if len(names) == 1 else (2, 2),
                             mesh_dim_names=names)
    tpl = ([[TR(), TS(1)], [TR(), TS(0)], [TR(), TS(0)]] if kind == "dp-tp"
           else [[TR()] * len(names)] * 3)

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            w1, b1, w2 = (torch.from_numpy(a.copy()) for a in weights())
            self.w1 = torch.nn.Parameter(distribute_tensor(w1, tmesh, tpl[0]))
            self.b1 = torch.nn.Parameter(distribute_tensor(b1, tmesh, tpl[1]))
            self.w2 = torch.nn.Parameter(distribute_tensor(w2, tmesh, tpl[2]))

        def forward(self, x):
            return torch.tanh(x @ self.w1 + self.b1) @ self.w2

    model = torch_fully_shard(TorchNet(), mesh=tmesh, dp_mesh_dims=TorchDims(**KINDS[kind][1]))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batch = [TS(0) if n in ("dp", "r") else TR() for n in names]
    x = distribute_tensor(torch.from_numpy(X.copy()), tmesh, batch)
    t = distribute_tensor(torch.from_numpy(T.copy()), tmesh, batch)
    losses, counts = [], {}
    for _ in range(STEPS):
        with TorchComm() as comm:
            d = model(x) - t
            loss = (d * d).mean()
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach().full_tensor()))
        for k, n in torch_counts(comm).items():
            counts[k] = counts.get(k, 0) + n
    return losses, [p.detach().full_tensor().numpy() for p in model.parameters()], counts


@pytest.mark.parametrize("kind", kinds())
def test_training_equals_torchs(kind):
    pytest.importorskip("torch")
    from fsdp_torch import at_most

    t_losses, t_params, t_counts = run_torch(kind)
    losses, params, counts = run_ours(kind)
    np.testing.assert_allclose(losses, t_losses, rtol=1e-10)
    for p, q in zip(params, t_params):
        np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-12)
    ours = {k: n for k, n in counts.items() if n}
    assert at_most(ours, t_counts), (ours, t_counts)
