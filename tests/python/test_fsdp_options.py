"""fully_shard's options beside torch 2.13's FSDP2: ``shard_placement_fn``
(each parameter sharded on the dim it names, an uneven dim other than 0 refused as
torch refuses it), ``ignored_params`` (left as they are: not sharded, not
gathered, not reduced by FSDP), ``reshard_after_forward`` as an int (each divisor
of the data-parallel size, torch's errors for the others) and HSDP beside tensor
parallelism on a 3-D (replicate, shard, tp) mesh. Each is compared with torch's
on gloo: the same losses, gradients and parameters after SGD steps in float64,
and no collective run more often than torch's."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, nn
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import local_mesh
from mpitensor.fsdp import fully_shard
from mpitensor.optim import SGD
from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from fsdp_torch import AG, RS, at_most, copy_weights, rank_rows, torch_counts, torch_stack
from tp_models import MLP

COMM = MPI.COMM_WORLD
W, RANK = COMM.Get_size(), COMM.Get_rank()
# Input dims that every world size of 1..4 divides: Shard(1) of each weight is even.
DIMS = (12, 12, 24)
X = np.random.default_rng(0).standard_normal((12, DIMS[0]))
T = np.random.default_rng(1).standard_normal((12, 3))
T5 = np.random.default_rng(2).standard_normal((12, 5))
LR, STEPS = 0.1, 3


class Net(nn.Module):
    """torch_stack's layers in mpitensor.nn."""

    def __init__(self, dims=DIMS, seed=5):
        super().__init__()
        mt.manual_seed(seed)
        self.layers = nn.ModuleList([nn.Linear(dims[i], dims[i + 1])
                                     for i in range(len(dims) - 1)])
        self.head = nn.Linear(dims[-1], 3)

    def forward(self, x):
        for layer in self.layers:
            x = np.tanh(layer(x))
        return self.head(x)


@pytest.fixture(scope="module")
def mesh():
    return mt.init_device_mesh("cpu", (W,), mesh_dim_names=("dp",))


def columns(p):
    """shard_placement_fn: a weight on its input dim, the rest FSDP's default."""
    return Shard(1) if p.ndim == 2 else None


def shard(model, fsdp, **kw):
    """fully_shard (ours or torch's) of each layer, then of the root."""
    for layer in model.layers:
        fsdp(layer, **kw)
    return fsdp(model, **kw)


def train(model, x, t, ours=True, local_loss=False, steps=STEPS):
    """SGD steps: the global losses (with ``local_loss`` each rank's loss is its
    replica's, and the replicas' are averaged), each step's collective counts, and
    the full gradients and parameters after them."""
    if ours:
        from mpitensor.debug import CommDebugMode as Mode
    else:
        from torch.distributed.tensor.debug import CommDebugMode as Mode
    losses, counts = [], []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        with Mode() as mode:
            loss = ((model(x) - t) ** 2).mean()
            loss.backward()
        counts.append({k: n for k, n in mode.get_comm_counts().items() if n} if ours
                      else torch_counts(mode))
        if ours:
            value = float(loss.detach().full_tensor())
            losses.append(COMM.allreduce(value) / W if local_loss else value)
            with mt.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= LR * p.grad
        else:
            losses.append(COMM.allreduce(loss.item()) / W)
            import torch
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p -= LR * p.grad
    full = (lambda a: a.detach().full_tensor()) if ours else \
        (lambda a: a.detach().full_tensor().numpy() if hasattr(a, "full_tensor")
         else a.detach().numpy())
    grads = [None if p.grad is None else full(p.grad) for p in model.parameters()]
    return np.array(losses), counts, grads, [full(p) for p in model.parameters()]


def batch(mesh):
    return (mt.distribute_tensor(X, mesh, [Shard(0)]),
            mt.distribute_tensor(T, mesh, [Shard(0)]))


def torch_side():
    """torch's gloo group and 1-D mesh (skips without torch)."""
    pytest.importorskip("torch")
    from torch.distributed.device_mesh import init_device_mesh
    from mpitensor.testing import init_torch_gloo

    init_torch_gloo()
    if "mesh" not in _torch_meshes:
        _torch_meshes["mesh"] = init_device_mesh("cpu", (W,))
    return _torch_meshes["mesh"]


_torch_meshes: dict = {}


def assert_same(ours, theirs, skip=()):
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-10, err_msg="losses")
    for k, which in ((2, "grad"), (3, "param")):
        assert len(ours[k]) == len(theirs[k])
        for i, (a, b) in enumerate(zip(ours[k], theirs[k])):
            assert (a is None) == (b is None), f"{which} {i}"
            if i not in skip and a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13,
                                           err_msg=f"{which} {i}")
    for mine, torchs in zip(ours[1], theirs[1]):
        assert at_most(mine, torchs), (mine, torchs)


# -- shard_placement_fn ----------------------------------------------------------------

def test_shard_placement_fn_places_each_parameter(mesh):
    m = shard(Net(), fully_shard, mesh=mesh, shard_placement_fn=columns)
    for (name, p), q in zip(m.named_parameters(), Net().parameters()):
        d = 1 if q.ndim == 2 else 0
        assert p.placements == (Shard(d),), name
        np.testing.assert_array_equal(p.detach().full_tensor(), q, err_msg=name)
        n = -(-q.shape[d] // W)
        cut = (slice(None),) * d + (slice(RANK * n, (RANK + 1) * n),)
        np.testing.assert_array_equal(p.detach().to_local(), q[cut], err_msg=name)
    loss = ((m(batch(mesh)[0]) - batch(mesh)[1]) ** 2).mean()
    with CommDebugMode() as bwd:
        loss.backward()
    if W > 1:  # one all-gather and one reduce-scatter per group, as with Shard(0)
        assert bwd.get_comm_counts()[RS] == len(DIMS)
    for name, p in m.named_parameters():
        assert p.grad.placements == p.placements, name


def test_shard_placement_fn_equals_torch(mesh):
    tmesh = torch_side()
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.tensor import Shard as TShard

    theirs = shard(torch_stack(DIMS, Net()), torch_fully_shard, mesh=tmesh,
                   shard_placement_fn=lambda p: TShard(1) if p.ndim == 2 else None)
    want = train(theirs, *rank_rows(RANK, W, X, T), ours=False)
    got = train(shard(Net(), fully_shard, mesh=mesh, shard_placement_fn=columns),
                *batch(mesh))
    assert_same(got, want)


@pytest.mark.skipif(W == 1, reason="every dim splits evenly over one rank")
def test_shard_placement_fn_errors_as_torch(mesh):
    # 5 input features split over 2, 3 or 4 ranks unevenly
    with pytest.raises(NotImplementedError, match="uneven sharding on dim 1"):
        fully_shard(MLP(), mesh=mesh, shard_placement_fn=columns)
    with pytest.raises(ValueError, match="Invalid shard_placement_fn result"):
        fully_shard(MLP(), mesh=mesh, shard_placement_fn=lambda p: Replicate())
    with pytest.raises(ValueError, match="Shard dim 2 is invalid"):
        fully_shard(MLP(), mesh=mesh, shard_placement_fn=lambda p: Shard(2))
    # one rank's choice differs: every rank raises, none waits in a collective
    with pytest.raises(ValueError, match="shard dims"):
        fully_shard(Net(), mesh=mesh,
                    shard_placement_fn=lambda p: Shard(1) if RANK == 0 and p.ndim == 2
                    else None)


# -- ignored_params ---------------------------------------------------------------------

def with_ignored(mesh, trainable: bool):
    """Net whose head weight is ignored: a Replicate DTensor of the dp mesh."""
    m = Net()
    w = mt.distribute_tensor(np.array(m.head.weight), mesh, [Replicate()])
    m.head.weight = nn.Parameter(w, requires_grad=trainable)
    return m, m.head.weight


@pytest.mark.parametrize("trainable", [False, True])
def test_ignored_params_stay_as_they_are(mesh, trainable):
    m, w = with_ignored(mesh, trainable)
    shard(m, fully_shard, mesh=mesh, ignored_params={w})
    assert m.head.weight is w and w.placements == (Replicate(),)
    assert "head.weight" not in [p.name for p in m.__dict__["_fsdp_state"].params]
    assert m.head.bias.placements == (Shard(0),)
    x, t = batch(mesh)
    with CommDebugMode() as fwd:
        loss = ((m(x) - t) ** 2).mean()
    with CommDebugMode() as bwd:
        loss.backward()
    if W > 1:  # the root group without the ignored weight: still one each
        assert fwd.get_comm_counts()[AG] == len(DIMS)
        assert bwd.get_comm_counts()[RS] == len(DIMS)
        assert bwd.get_comm_counts()[AR] == 0  # FSDP does not reduce it: nor the engine
    assert (w.grad is not None) == trainable
    if trainable:  # the global loss's gradient, left Partial; the optimizer reduces it
        assert w.grad.placements == (Partial(),)
        want = w.detach().full_tensor() - LR * w.grad.full_tensor()
        SGD([w], lr=LR).step()
        assert w.placements == (Replicate(),)
        np.testing.assert_allclose(w.detach().full_tensor(), want, rtol=1e-14)


@pytest.mark.parametrize("trainable", [False, True])
def test_ignored_params_equal_torch(mesh, trainable):
    """Frozen, the step and the collectives are torch's. Trainable, torch leaves
    each rank the gradient of its own rows' loss; ours is a DTensor leaf of the
    global loss, its gradient Partial as torch's DTensor leaves it (checked
    here on torch's own Replicate leaf): the mean of torch's over the ranks, and
    no collective more than torch's. One step: after it torch's replicas of the
    weight differ."""
    tmesh = torch_side()
    import torch
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.tensor import Partial as TPartial
    from torch.distributed.tensor import Replicate as TReplicate
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode as TorchMode

    tw = torch.nn.Parameter(distribute_tensor(torch.ones(DIMS[0], 3, dtype=torch.float64),
                                              tmesh, [TReplicate()]))
    tx = distribute_tensor(torch.from_numpy(X), tmesh, [TShard(0)])
    with TorchMode() as their_leaf:
        (tx @ tw).sum().backward()
    assert torch_counts(their_leaf) == {}
    assert tw.grad.placements == (TPartial(),)

    model = torch_stack(DIMS, Net())
    model.head.weight.requires_grad_(trainable)
    shard(model, torch_fully_shard, mesh=tmesh, ignored_params={model.head.weight})
    steps = 1 if trainable else STEPS
    want = train(model, *rank_rows(RANK, W, X, T), ours=False, steps=steps)
    m, w = with_ignored(mesh, trainable)
    got = train(shard(m, fully_shard, mesh=mesh, ignored_params={w}), *batch(mesh),
                steps=steps)
    head = [n for n, _ in m.named_parameters()].index("head.weight")
    if not trainable:
        assert_same(got, want)
        return
    np.testing.assert_allclose(got[0], want[0], rtol=1e-10, err_msg="losses")
    for i, (a, b) in enumerate(zip(got[2], want[2])):
        if i != head:
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13, err_msg=f"grad {i}")
    np.testing.assert_allclose(got[2][head], COMM.allreduce(want[2][head]) / W,
                               rtol=1e-10, atol=1e-13)
    assert got[2][head].shape == want[2][head].shape
    for mine, torchs in zip(got[1], want[1]):
        assert at_most(mine, torchs), (mine, torchs)


# -- reshard_after_forward as an int ------------------------------------------------------

AR = "all_reduce"
DIVISORS = [n for n in range(1, W + 1) if W % n == 0]


@pytest.mark.parametrize("n", DIVISORS)
def test_reshard_after_forward_int_equals_torch(mesh, n):
    tmesh = torch_side()
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    want = train(shard(torch_stack(DIMS, Net()), torch_fully_shard, mesh=tmesh,
                       reshard_after_forward=n), *rank_rows(RANK, W, X, T), ours=False)
    got = train(shard(Net(), fully_shard, mesh=mesh, reshard_after_forward=n), *batch(mesh))
    assert_same(got, want)


def test_reshard_after_forward_errors_as_torch(mesh):
    for bad in (0, W + 1, 2 * W):
        with pytest.raises(ValueError, match=f"should be a factor of {W}, not {bad}"):
            fully_shard(Net(), mesh=mesh, reshard_after_forward=bad)
    with pytest.raises(ValueError, match="should be a bool or an int"):
        fully_shard(Net(), mesh=mesh, reshard_after_forward=1.5)
    m = fully_shard(Net(), mesh=mesh, reshard_after_forward=None)  # torch's default
    assert m.head.weight.placements == (Shard(0),)


# -- HSDP beside tensor parallelism: a 3-D (replicate, shard, tp) mesh -------------------

NAMES = ("replicate", "shard", "tp")
SHAPES3 = [(1, 2, 2), (2, 1, 2), (2, 2, 1)] if W == 4 else \
    [(1, 1, 2), (1, 2, 1), (2, 1, 1)] if W == 2 else [(1, W, 1)]
PLAN = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
_meshes3: dict = {}


def mesh3(shape):
    if shape not in _meshes3:
        _meshes3[shape] = mt.init_device_mesh("cpu", shape, mesh_dim_names=NAMES)
    return _meshes3[shape]


def hsdp_tp(mesh):
    m = parallelize_module(MLP((5, 6, 5)), mesh["tp"], PLAN)
    dp = mesh["replicate", "shard"]
    fully_shard(m.w1, mesh=dp)
    fully_shard(m.w2, mesh=dp)
    return fully_shard(m, mesh=dp)


def dp_index(mesh):
    return mesh.get_local_rank("replicate") * mesh.shape[1] + mesh.get_local_rank("shard")


@pytest.mark.parametrize("shape", SHAPES3)
def test_hsdp_tp_placements(shape):
    mesh = mesh3(shape)
    m = hsdp_tp(mesh)
    # TP shards w1 on dim 0 too: the shard dim splits each TP shard, on the mesh
    # whose dims run (replicate, tp, shard)
    assert m.w1.weight.placements == (Replicate(), Shard(0), Shard(0))
    assert m.w1.weight.device_mesh.mesh_dim_names == ("replicate", "tp", "shard")
    assert m.w2.weight.placements == (Replicate(), Shard(0), Shard(1))
    assert m.w2.weight.device_mesh is mesh
    assert m.w2.bias.placements == (Replicate(), Shard(0), Replicate())
    for (name, p), q in zip(m.named_parameters(), MLP((5, 6, 5)).parameters()):
        np.testing.assert_array_equal(p.detach().full_tensor(), q, err_msg=name)


@pytest.mark.parametrize("shape", SHAPES3)
def test_hsdp_tp_equals_torch(shape):
    """torch's HSDP over mesh["replicate", "shard"] of the MLP parallelized over
    mesh["tp"]; each data-parallel rank its own rows, the same over tp."""
    pytest.importorskip("torch")
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel as TCol, RowwiseParallel as TRow, parallelize_module as tparallelize)
    from mpitensor.testing import init_torch_gloo

    init_torch_gloo()
    if shape not in _torch_meshes:
        _torch_meshes[shape] = init_device_mesh("cpu", shape, mesh_dim_names=NAMES)
    tmesh = _torch_meshes[shape]

    class TorchMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = torch.nn.Linear(5, 6), torch.nn.Linear(6, 5)

        def forward(self, x):
            return self.w2(torch.tanh(self.w1(x)))

    model = TorchMLP().double()
    copy_weights(model, MLP((5, 6, 5)))
    tparallelize(model, tmesh["tp"], {"w1": TCol(), "w2": TRow()})
    dp = tmesh["replicate", "shard"]
    for part in (model.w1, model.w2, model):
        torch_fully_shard(part, mesh=dp)
    mesh = mesh3(shape)
    d, count = dp_index(mesh), shape[0] * shape[1]
    xt, tt = rank_rows(d, count, X[:, :5], T5)
    want = train(model, xt, tt, ours=False)
    x = DTensor.from_local(xt.numpy(), mesh["tp"], [Replicate()])
    t = DTensor.from_local(tt.numpy(), local_mesh(), [Replicate()])
    assert_same(train(hsdp_tp(mesh), x, t, local_loss=True), want)
