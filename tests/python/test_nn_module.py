"""mpitensor.nn.Module: attribute registration, traversal by dotted names, forward
hooks and their handles, state_dict/load_state_dict (also into DTensor
parameters), train/eval, containers, and the errors of misuse."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, init_device_mesh, nn

W = MPI.COMM_WORLD.Get_size()


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(np.full(3, 2.0))
        self.register_buffer("offset", np.ones(3))
        self.scale = 10.0  # a plain attribute: neither parameter nor buffer

    def forward(self, x):
        return x * self.w + self.offset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Affine()
        self.layers = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])
        self.shared = self.a  # a module reachable twice is listed once

    def forward(self, x):
        x = self.a(x)
        for layer in self.layers:
            x = layer(x)
        return x


def test_registration_and_traversal():
    net = Net()
    assert [n for n, _ in net.named_modules()] == ["", "a", "layers", "layers.0", "layers.1"]
    assert [n for n, _ in net.named_children()] == ["a", "layers", "shared"]
    assert [n for n, _ in net.named_parameters()] == [
        "a.w", "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]
    assert [n for n, _ in net.named_buffers()] == ["a.offset"]
    assert len(list(net.parameters())) == 5
    assert net.a.scale == 10.0 and "scale" not in net.a._parameters
    assert isinstance(net.a.w, np.ndarray)
    assert net.get_submodule("layers.1") is net.layers[1]
    with pytest.raises(AttributeError, match="no submodule 'x'"):
        net.get_submodule("layers.x")
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        net.nope


def test_assignment_rules():
    m = Affine()
    m.w = np.zeros(3)  # stays a parameter
    assert [n for n, _ in m.named_parameters()] == ["w"]
    with pytest.raises(TypeError, match="parameter 'w'"):
        m.w = "text"
    m.register_parameter("w", None)
    assert list(m.named_parameters()) == []
    with pytest.raises(KeyError):
        m.register_parameter("a.b", np.ones(1))
    del m.offset
    assert list(m.named_buffers()) == []

    class Early(nn.Module):
        def __init__(self):
            self.x = 1

    with pytest.raises(AttributeError, match="super"):
        Early()


def test_forward_hooks_replace_inputs_and_outputs_and_remove():
    m = Affine()
    x = np.arange(3.0)
    calls = []
    h1 = m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    h2 = m.register_forward_hook(lambda mod, args, out: out * 10)
    h3 = m.register_forward_hook(lambda mod, args, out: calls.append(mod) or None)
    np.testing.assert_array_equal(m(x), ((x + 1) * 2 + 1) * 10)
    assert calls == [m]
    h1.remove()
    h2.remove()
    np.testing.assert_array_equal(m(x), x * 2 + 1)
    h3.remove()
    h3.remove()  # removing twice is harmless
    with m.register_forward_pre_hook(lambda mod, args: args[0] * 0):  # non-tuple result
        np.testing.assert_array_equal(m(x), np.ones(3))
    np.testing.assert_array_equal(m(x), x * 2 + 1)


def test_hooks_with_kwargs_and_order():
    m = Affine()
    seen = []
    m.register_forward_pre_hook(lambda mod, args: seen.append("second"))
    m.register_forward_pre_hook(lambda mod, args: seen.append("first"), prepend=True)
    m.register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] * 0,), kwargs),
                                with_kwargs=True)
    m.register_forward_hook(lambda mod, args, kwargs, out: out + 1, with_kwargs=True)
    np.testing.assert_array_equal(m(np.ones(3)), np.full(3, 2.0))
    assert seen == ["first", "second"]
    with pytest.raises(TypeError, match="callable"):
        m.register_forward_hook(3)


def test_state_dict_round_trip_and_strictness():
    mt.manual_seed(0)
    a = Net()
    mt.manual_seed(1)
    b = Net()
    assert not np.array_equal(a.layers[0].weight, b.layers[0].weight)
    sd = a.state_dict()
    assert list(sd) == ["a.w", "a.offset", "layers.0.weight", "layers.0.bias",
                        "layers.1.weight", "layers.1.bias"]
    b.load_state_dict(sd)
    x = np.linspace(-1, 1, 6).reshape(2, 3)
    np.testing.assert_array_equal(a(x), b(x))
    with pytest.raises(RuntimeError, match="Missing key"):
        b.load_state_dict({"a.w": np.ones(3)})
    missing, unexpected = b.load_state_dict({"a.w": np.ones(3), "zz": 1}, strict=False)
    assert "layers.0.weight" in missing and unexpected == ["zz"]
    with pytest.raises(RuntimeError, match="size mismatch for a.w"):
        b.load_state_dict({**sd, "a.w": np.ones(4)})


def test_load_state_dict_into_dtensor_parameters():
    mesh = init_device_mesh("cpu", (W,))
    mt.manual_seed(0)
    plain = nn.Linear(5, 7)
    mt.manual_seed(5)
    dist = mt.distribute_module(nn.Linear(5, 7), mesh, lambda n, m, mesh: m.register_parameter(
        "weight", mt.distribute_tensor(m.weight, mesh, [Shard(0)])) if n == "" else None)
    dist.load_state_dict(plain.state_dict())
    np.testing.assert_array_equal(dist.weight.detach().full_tensor(), plain.weight)
    assert dist.weight.placements == (Shard(0),) and dist.bias.placements == (Replicate(),)
    back = nn.Linear(5, 7)
    back.load_state_dict(dist.state_dict())  # DTensors into ndarrays: gathered
    np.testing.assert_array_equal(back.weight, plain.weight)


def test_train_eval_and_containers():
    seq = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.ReLU())
    assert seq.training and seq[1].training
    seq.eval()
    assert not any(m.training for m in seq.modules())
    seq.train()
    assert all(m.training for m in seq.modules())
    assert len(seq) == 3 and isinstance(seq[0], nn.Linear) and len(seq[1:]) == 2
    layers = nn.ModuleList()
    layers.append(nn.ReLU()).extend([nn.GELU()])
    layers[0] = nn.Linear(2, 2)
    assert [type(m).__name__ for m in layers] == ["Linear", "GELU"]
    assert [n for n, _ in layers.named_children()] == ["0", "1"]
    text = repr(nn.Sequential(nn.Linear(4, 8)))
    assert "(0): Linear(in_features=4, out_features=8, bias=True)" in text


def test_manual_seed_makes_initialisation_reproducible():
    mt.manual_seed(7)
    a = nn.TransformerBlock(8, 2)
    mt.manual_seed(7)
    b = nn.TransformerBlock(8, 2)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p, q, err_msg=n)
    lin = nn.Linear(16, 4)
    assert np.abs(lin.weight).max() <= 0.25 and lin.weight.dtype == np.float64


def test_global_hooks_see_every_module_call():
    seen = []
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    own = seq[0].register_forward_pre_hook(lambda m, a: seen.append("own"))
    h1 = nn.register_module_forward_pre_hook(lambda m, a: seen.append(("pre", type(m).__name__)))
    h2 = nn.register_module_forward_hook(lambda m, a, out: seen.append(("post", type(m).__name__)))
    try:
        seq(np.ones((1, 2)))
    finally:
        h1.remove()
        h2.remove()
    assert seen == [("pre", "Sequential"), ("pre", "Linear"), "own", ("post", "Linear"),
                    ("pre", "ReLU"), ("post", "ReLU"), ("post", "Sequential")]
    seen.clear()
    own.remove()
    seq(np.ones((1, 2)))
    assert seen == []


def test_load_state_dict_of_plain_arrays_communicates_nothing(monkeypatch):
    """Nothing distributed: the checks stay local, no agreement is run (a bad
    state dict then raises torch's RuntimeError on this rank alone)."""
    monkeypatch.setattr(mt._comm, "agree", lambda *a: pytest.fail("agreed on " + repr(a)))
    lin = nn.Linear(2, 3)
    lin.load_state_dict({"weight": np.ones((3, 2)), "bias": np.zeros(3)})
    assert np.array_equal(lin.weight, np.ones((3, 2)))
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "x"'):
        lin.load_state_dict({"weight": np.ones((3, 2)), "bias": np.zeros(3), "x": 1})
