"""Activation checkpointing, as torch.utils.checkpoint: a checkpointed
block gives the same loss and gradients (inputs and parameters) as the block
without, with dropout (the recomputation draws the same mask), under tensor
parallelism and fully_shard; its forward runs twice, the second time in backward;
and torch's gradients for the same model."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, nn
from mpitensor.fsdp import fully_shard
from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from mpitensor.utils.checkpoint import CheckpointWrapper, checkpoint, checkpoint_wrapper

W = MPI.COMM_WORLD.Get_size()
X = np.random.default_rng(0).standard_normal((8, 6))
CALLS: list = []


class Block(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.up = nn.Linear(6, 8)
        self.down = nn.Linear(8, 6)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        CALLS.append(mt.autograd.is_grad_enabled())
        return x + self.down(self.drop(np.tanh(self.up(x))))


class Model(nn.Module):
    def __init__(self, dropout=0.0, wrap=False, mesh=None):
        super().__init__()
        mt.manual_seed(3)
        self.blocks = nn.ModuleList([Block(dropout) for _ in range(2)])
        if mesh is not None:  # data parallel: the parameters Replicate
            mt.distribute_module(self, mesh)
        if wrap:
            for i, b in enumerate(self.blocks):
                self.blocks[i] = checkpoint_wrapper(b)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return (x * x).mean()


@pytest.fixture(scope="module")
def mesh():
    return mt.init_device_mesh("cpu", (W,), mesh_dim_names=("dp",))


def run(model, x):
    mt.manual_seed(11)  # the dropout masks
    CALLS.clear()
    loss = model(x)
    loss.backward()
    grads = {n.replace("._checkpoint_wrapped_module", ""): p.grad.full_tensor()
             for n, p in model.named_parameters()}
    return float(loss.full_tensor()), grads, list(CALLS)


def compare(a, b):
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12)
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        np.testing.assert_allclose(a[1][name], b[1][name], rtol=1e-12, atol=1e-14,
                                   err_msg=name)


def batch(mesh, requires_grad=False):
    return mt.distribute_tensor(X, mesh, [Shard(0)], requires_grad=requires_grad)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_same_gradients_as_without(mesh, dropout):
    plain = run(Model(dropout, mesh=mesh), batch(mesh))
    ckpt = run(Model(dropout, wrap=True, mesh=mesh), batch(mesh))
    compare(ckpt, plain)
    assert plain[2] == [True, True]
    # each block's forward without recording, then again in backward, recording
    assert ckpt[2] == [False, False, True, True]


def test_the_input_gets_its_gradient(mesh):
    grads = []
    for wrap in (False, True):
        x = batch(mesh, requires_grad=True)
        m = Model(mesh=mesh)
        if wrap:
            loss = (checkpoint(m.blocks[0], x, use_reentrant=False) ** 2).mean()
        else:
            loss = (m.blocks[0](x) ** 2).mean()
        loss.backward()
        grads.append(x.grad.full_tensor())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)


def test_without_grad_mode_it_is_the_function(mesh):
    m = Model(wrap=True, mesh=mesh)
    with mt.no_grad():
        out = m(batch(mesh))
    assert not out.requires_grad


def test_under_tensor_parallelism(mesh):
    results = []
    for wrap in (False, True):
        m = Model()
        for b in m.blocks:
            parallelize_module(b, mesh, {"up": ColwiseParallel(use_local_output=False),
                                         "down": RowwiseParallel(use_local_output=False)})
        if wrap:
            for i, b in enumerate(m.blocks):
                m.blocks[i] = checkpoint_wrapper(b)
        x = mt.distribute_tensor(X, mesh, [Replicate()])
        results.append(run(m, x))
    compare(results[1], results[0])


def test_under_fully_shard(mesh):
    results = []
    for wrap in (False, True):
        m = Model(wrap=wrap)
        for b in m.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(m, mesh=mesh)
        results.append(run(m, batch(mesh)))
    compare(results[1], results[0])


def test_wrapper_keeps_torchs_state_dict_keys():
    w = checkpoint_wrapper(nn.Linear(2, 3))
    assert isinstance(w, CheckpointWrapper)
    assert sorted(w.state_dict()) == ["_checkpoint_wrapped_module.bias",
                                      "_checkpoint_wrapped_module.weight"]
    with pytest.raises(TypeError, match="Module"):
        checkpoint_wrapper(lambda x: x)


def test_equals_torch(mesh):
    torch = pytest.importorskip("torch")
    import torch.utils.checkpoint as tc

    ours = run(Model(wrap=True, mesh=mesh), batch(mesh))

    class TBlock(torch.nn.Module):
        def __init__(self, b):
            super().__init__()
            self.up = torch.nn.Linear(6, 8, dtype=torch.float64)
            self.down = torch.nn.Linear(8, 6, dtype=torch.float64)
            with torch.no_grad():
                for t, o in ((self.up, b.up), (self.down, b.down)):
                    t.weight.copy_(torch.from_numpy(np.array(o.weight)))
                    t.bias.copy_(torch.from_numpy(np.array(o.bias)))

        def forward(self, x):
            return x + self.down(torch.tanh(self.up(x)))

    blocks = [TBlock(b) for b in Model().blocks]
    x = torch.from_numpy(X)
    for b in blocks:
        x = tc.checkpoint(b, x, use_reentrant=False)
    (x * x).mean().backward()
    for i, b in enumerate(blocks):
        for name in ("up", "down"):
            for what in ("weight", "bias"):
                got = ours[1][f"blocks.{i}.{name}.{what}"]
                want = getattr(getattr(b, name), what).grad.numpy()
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
