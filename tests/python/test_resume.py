"""Deterministic resume: the RNG state (get_rng_state/set_rng_state), nested state
dicts saved with mt.save (an optimizer's state_dict inside), Module.to, and a tiny
model trained with AdamW whose run, saved at step 3 and resumed on another mesh,
gives the losses of the uninterrupted run.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor
from mpitensor.device_mesh import local_mesh
from mpitensor.nn import Module, Parameter, init
from ops_helpers import W, mesh_of

COMM = MPI.COMM_WORLD
R, S0, S1 = Replicate(), Shard(0), Shard(1)



def test_rng_state_round_trip():
    mesh = mesh_of((W,))
    mt.manual_seed(9)
    mt.rand(3, device_mesh=mesh)
    state = mt.get_rng_state()
    assert state.dtype == np.uint64 and state.tolist() == [9, 1]
    a = mt.rand(5, 2, device_mesh=mesh, placements=[S0]).full_tensor()
    mt.manual_seed(1)
    mt.set_rng_state(state)
    b = mt.rand(5, 2, device_mesh=mesh, placements=[S1]).full_tensor()
    np.testing.assert_array_equal(a, b)
    assert mt.random.initial_seed() == 9
    with pytest.raises(ValueError, match="RNG state"):
        mt.set_rng_state(np.array([1.5, 2.0]))


def test_nested_dict_round_trip(tmp):
    mesh = mesh_of((W,))
    w = distribute_tensor(np.arange(12.0).reshape(4, 3), mesh, [S0])
    obj = {"model": {"layer.weight": w}, "optim": {"state": {0: {"step": 3.0, "m": w}},
                                                    "param_groups": [{"lr": 0.1,
                                                                      "betas": (0.9, 0.99),
                                                                      "params": [0],
                                                                      "foreach": None}]},
           "rng": mt.get_rng_state(), "epoch": 2, "name": "run", "flag": True}
    path = os.path.join(tmp, "nested")
    mt.save(obj, path)
    back = mt.load(path, mesh)
    assert back["epoch"] == 2 and back["name"] == "run" and back["flag"] is True
    assert back["optim"]["param_groups"] == obj["optim"]["param_groups"]
    assert isinstance(back["optim"]["param_groups"][0]["betas"], tuple)
    assert list(back["optim"]["state"]) == [0] and back["optim"]["state"][0]["step"] == 3.0
    assert back["model"]["layer.weight"].placements == (S0,)
    np.testing.assert_array_equal(back["optim"]["state"][0]["m"].full_tensor(),
                                  w.full_tensor())
    np.testing.assert_array_equal(back["rng"], obj["rng"])
    # Entries are named by their dotted paths, for placements= and in the files.
    back = mt.load(path, mesh, {"optim.state.0.m": [S1]})
    assert back["optim"]["state"][0]["m"].placements == (S1,)
    assert back["model"]["layer.weight"].placements == (S0,)
    if COMM.rank == 0:
        assert os.path.exists(os.path.join(path, "optim.state.0.m.npy"))
    # like= may nest as the checkpoint does.
    like = {"model": {"layer.weight": distribute_tensor(np.zeros((4, 3)), mesh, [R])},
            "optim": {"state": {0: {"m": distribute_tensor(np.zeros((4, 3)), mesh, [S1])}}},
            "rng": np.zeros(2, np.uint64)}
    back = mt.load(path, like=like)
    assert back["model"]["layer.weight"].placements == (R,)
    # A flat dict keeps the index of earlier versions: no tree.
    mt.save({"w": w}, os.path.join(tmp, "flat"))
    if COMM.rank == 0:
        with open(os.path.join(tmp, "flat", "index.json")) as f:
            assert "tree" not in json.load(f)


def test_nested_dicts_that_cannot_be_saved(tmp):
    mesh = mesh_of((W,))
    w = distribute_tensor(np.ones(4), mesh, [S0])
    with pytest.raises(ValueError, match="both named 'a.b'"):
        mt.save({"a.b": w, "a": {"b": w}}, os.path.join(tmp, "clash"))
    with pytest.raises(TypeError, match="keys must be str or int"):
        mt.save({"a": {(1, 2): w}}, os.path.join(tmp, "badkey"))
    with pytest.raises(TypeError, match="save takes DTensors"):
        mt.save({"a": {"b": object()}}, os.path.join(tmp, "badvalue"))


def test_a_tree_that_does_not_match_the_entries_is_refused(tmp):
    mesh = mesh_of((W,))
    path = os.path.join(tmp, "badtree")
    mt.save({"a": {"b": distribute_tensor(np.ones(4), mesh, [S0])}, "n": 1}, path)
    COMM.Barrier()
    if COMM.rank == 0:
        with open(os.path.join(path, "index.json")) as f:
            index = json.load(f)
        index["tree"] = {"d": [["a", {"e": "missing"}]]}
        with open(os.path.join(path, "index.json"), "w") as f:
            json.dump(index, f)
    COMM.Barrier()
    with pytest.raises(ValueError, match="'tree' does not describe its entries"):
        mt.load(path, mesh)


class Tiny(Module):
    """tanh(x @ w1 + b) @ w2, tensor-parallel: w1 by columns, w2 by rows."""

    def __init__(self, mesh, pls):
        super().__init__()
        self.w1 = Parameter(init.normal_(mt.empty(6, 8, device_mesh=mesh,
                                                  placements=pls[0], requires_grad=True),
                                         std=0.5))
        self.b = Parameter(init.zeros_(mt.empty(8, device_mesh=mesh, placements=pls[1],
                                                requires_grad=True)))
        self.w2 = Parameter(init.xavier_uniform_(mt.empty(8, 3, device_mesh=mesh,
                                                          placements=pls[2],
                                                          requires_grad=True)))

    def forward(self, x):
        return np.tanh(x @ self.w1 + self.b) @ self.w2


def train_step(model, opt, mesh):
    # The batch comes from the generator, so the RNG state is part of the run.
    x = mt.randn(4, 6, device_mesh=mesh, placements=[R] * mesh.ndim)
    y = model(x)
    loss = ((y - 0.5) * (y - 0.5)).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss.detach().full_tensor())


def make(mesh, pls):
    mt.manual_seed(2024)
    model = Tiny(mesh, pls)
    return model, mt.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def resume_targets():
    """(mesh, placements) to resume on: every rank alone, and another layout."""
    out = [(local_mesh(), [[R], [R], [R]]), (mesh_of((W,)), [[R], [S0], [S1]])]
    if W == 4:
        out.append((mesh_of((2, 2)), [[R, S1], [S0, R], [S0, S1]]))
    return out


def test_resume_on_another_mesh_continues_the_losses(tmp):
    mesh = mesh_of((W,))
    pls = [[S1], [S0], [S0]]
    model, opt = make(mesh, pls)
    path = os.path.join(tmp, "run")
    losses = []
    for step in range(5):
        losses.append(train_step(model, opt, mesh))
        if step == 2:
            mt.save({"model": model.state_dict(), "optim": opt.state_dict(),
                     "rng": mt.get_rng_state()}, path)
    assert losses[-1] < losses[0]
    for mesh2, pls2 in resume_targets():
        mt.manual_seed(77)  # anything: the checkpoint's state replaces it
        model2, opt2 = make(mesh2, pls2)
        ckpt = mt.load(path, mesh2)
        model2.load_state_dict(ckpt["model"])
        opt2.load_state_dict(ckpt["optim"])
        mt.set_rng_state(ckpt["rng"])
        for p in model2.parameters():
            assert p.device_mesh == mesh2 and p.requires_grad
        resumed = [train_step(model2, opt2, mesh2) for _ in range(2)]
        np.testing.assert_allclose(resumed, losses[3:], rtol=1e-12,
                                   err_msg=f"resumed on {mesh2}")


def test_module_to_keeps_placements_and_requires_grad():
    mesh = mesh_of((W,))
    model, _ = make(mesh, [[S1], [S0], [R]])
    model.register_buffer("mask", np.ones(3))
    model.register_buffer("count", np.arange(3))
    w1 = model.w1
    w1.grad = distribute_tensor(np.ones((6, 8)), mesh, [S1])
    before = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    assert model.to(np.float32) is model
    assert model.w1 is w1 and w1.grad.dtype == np.float32
    for n, p in model.named_parameters():
        assert p.dtype == np.float32 and p.requires_grad
        assert p.detach().to_local().dtype == np.float32
        np.testing.assert_array_equal(p.detach().full_tensor(), before[n].astype(np.float32))
    assert model.w1.placements == (S1,) and model.b.placements == (S0,)
    assert model.mask.dtype == np.float32 and model.count.dtype == np.arange(3).dtype
    x = mt.ones(2, 6, dtype=np.float32, device_mesh=mesh, placements=[R])
    assert model(x).dtype == np.float32
    assert model.to("cpu") is model and model.w1.dtype == np.float32
    model.double()
    assert model.w1.dtype == np.float64 and model.mask.dtype == np.float64
    model.float()
    assert model.w2.dtype == np.float32
    with pytest.raises(ValueError, match="live on 'cpu'"):
        model.to("cuda")
    with pytest.raises(TypeError, match="floating point"):
        model.to(np.int32)
