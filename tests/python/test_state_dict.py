"""torch.distributed.checkpoint.state_dict's functions: a model and
optimizer state saved under one plan load into another plan and mesh and the next
step is the same; full state dicts (on rank 0 only with cpu_offload) and
broadcast_from_rank0; wrappers' prefixes taken out; flat optimizer state dicts;
the same keys as torch's."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, nn
from mpitensor.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict, get_state_dict,
    set_model_state_dict, set_optimizer_state_dict, set_state_dict)
from mpitensor.fsdp import fully_shard
from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from mpitensor.utils.checkpoint import checkpoint_wrapper

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
X = np.random.default_rng(0).standard_normal((4 * N, 6))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        mt.manual_seed(5)
        self.up = nn.Linear(6, 4 * N)
        self.down = nn.Linear(4 * N, 6)

    def forward(self, x):
        return self.down(np.tanh(self.up(x)))


def tp_model(mesh):
    m = MLP()
    parallelize_module(m, mesh, {"up": ColwiseParallel(use_local_output=False),
                                 "down": RowwiseParallel(use_local_output=False)})
    return m


def fsdp_model(mesh):
    return fully_shard(MLP(), mesh=mesh)


def step(model, opt, mesh, layout):
    x = mt.distribute_tensor(X, mesh, layout)
    loss = (model(x) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def full_params(model) -> dict:
    return {n: p.detach().full_tensor() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def mesh():
    return mt.init_device_mesh("cpu", (N,), mesh_dim_names=("dp",))


@pytest.fixture
def folder(tmp_path_factory):
    return COMM.bcast(str(tmp_path_factory.mktemp("dsd")) if RANK == 0 else None)


def test_tp_checkpoint_resumes_under_fully_shard(mesh, folder):
    src = tp_model(mesh)
    opt = mt.optim.Adam(src.parameters(), lr=0.01)
    step(src, opt, mesh, [Replicate()])
    model_sd, optim_sd = get_state_dict(src, opt)
    assert sorted(model_sd) == ["down.bias", "down.weight", "up.bias", "up.weight"]
    assert sorted(optim_sd["state"]) == sorted(model_sd)
    assert optim_sd["param_groups"][0]["params"] == ["up.weight", "up.bias", "down.weight",
                                                     "down.bias"]
    path = os.path.join(folder, "ckpt")
    mt.save({"model": model_sd, "optim": optim_sd}, path)
    step(src, opt, mesh, [Replicate()])  # the step the resumed run must repeat

    dst = fsdp_model(mesh)
    opt2 = mt.optim.Adam(dst.parameters(), lr=0.5)  # the loaded lr wins
    loaded = mt.load(path)
    keys = set_state_dict(dst, opt2, model_state_dict=loaded["model"],
                          optim_state_dict=loaded["optim"])
    assert keys.missing_keys == [] and keys.unexpected_keys == []
    assert opt2.param_groups[0]["lr"] == 0.01
    step(dst, opt2, mesh, [Shard(0)])
    want, got = full_params(src), full_params(dst)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-14,
                                   err_msg=name)


def test_full_state_dict_and_cpu_offload(mesh):
    m = tp_model(mesh)
    full = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True))
    assert all(type(v) is np.ndarray for v in full.values())
    np.testing.assert_array_equal(full["up.weight"], m.up.weight.detach().full_tensor())
    offloaded = get_model_state_dict(
        m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    assert (offloaded.keys() == full.keys()) if RANK == 0 else offloaded == {}


def test_broadcast_from_rank0(mesh):
    src = tp_model(mesh)
    opt = mt.optim.SGD(src.parameters(), lr=0.1, momentum=0.9)
    step(src, opt, mesh, [Replicate()])
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(src, opt, options=opts)
    dst = fsdp_model(mesh)
    opt2 = mt.optim.SGD(dst.parameters(), lr=0.3)
    bcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(dst, model_sd, options=bcast)
    set_optimizer_state_dict(dst, opt2, optim_sd, options=bcast)
    for name, p in full_params(src).items():
        np.testing.assert_array_equal(full_params(dst)[name], p)
    assert opt2.param_groups[0]["lr"] == 0.1
    buf = opt2.state[dst.up.weight]["momentum_buffer"]
    np.testing.assert_array_equal(buf.full_tensor(),
                                  opt.state[src.up.weight]["momentum_buffer"].full_tensor())


def test_wrapper_prefixes_are_taken_out(mesh):
    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            inner = MLP()
            self.up, self.down = checkpoint_wrapper(inner.up), checkpoint_wrapper(inner.down)

    w = Wrapped()
    mt.distribute_module(w, mesh)
    sd = get_model_state_dict(w)
    assert sorted(sd) == ["down.bias", "down.weight", "up.bias", "up.weight"]
    plain = MLP()
    mt.distribute_module(plain, mesh)
    assert set_model_state_dict(plain, sd) == ([], [])
    # and back: a plain model's state dict into the wrapped one
    assert set_model_state_dict(w, get_model_state_dict(plain)) == ([], [])


def test_flat_optimizer_state_dict_round_trips(mesh):
    m = tp_model(mesh)
    opt = mt.optim.AdamW(m.parameters(), lr=0.02)
    step(m, opt, mesh, [Replicate()])
    flat = get_optimizer_state_dict(
        m, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))
    assert "state.up.weight.exp_avg" in flat and flat["param_groups.up.weight.lr"] == 0.02
    m2 = tp_model(mesh)
    opt2 = mt.optim.AdamW(m2.parameters(), lr=1.0)
    set_optimizer_state_dict(m2, opt2, flat)
    assert opt2.param_groups[0]["lr"] == 0.02
    np.testing.assert_array_equal(opt2.state[m2.down.weight]["exp_avg"].full_tensor(),
                                  opt.state[m.down.weight]["exp_avg"].full_tensor())


def test_strict_reports_missing_keys_as_torch(mesh):
    m = tp_model(mesh)
    sd = get_model_state_dict(m)
    del sd["up.bias"]
    with pytest.raises(RuntimeError, match="Missing key"):
        set_model_state_dict(m, sd)
    keys = set_model_state_dict(m, sd, options=StateDictOptions(strict=False))
    assert keys.missing_keys == ["up.bias"]


def test_the_same_keys_as_torch(mesh):
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint.state_dict import get_state_dict as torch_get

    from mpitensor.testing import init_torch_gloo

    init_torch_gloo()

    class TorchMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(6, 4 * N), torch.nn.Linear(4 * N, 6)

        def forward(self, x):
            return self.down(torch.tanh(self.up(x)))

    t = TorchMLP()
    topt = torch.optim.Adam(t.parameters())
    t(torch.ones(2, 6)).sum().backward()
    topt.step()
    tm, to = torch_get(t, topt)
    m = tp_model(mesh)
    opt = mt.optim.Adam(m.parameters())
    step(m, opt, mesh, [Replicate()])
    om, oo = get_state_dict(m, opt)
    assert list(om) == list(tm)
    assert list(oo["state"]) == list(to["state"])
    assert sorted(oo["state"]["up.weight"]) == sorted(to["state"]["up.weight"])
    assert oo["param_groups"][0]["params"] == to["param_groups"][0]["params"]
