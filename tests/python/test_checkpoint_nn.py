"""Checkpoints of mpitensor.nn models: a tensor-parallel GPT's state_dict saved
with one plan loads into a fresh model with another plan, on a slice of a 2-D mesh,
or unsharded (through mpitensor.load(dir, like=...) and through
Module.load_state_dict) and gives the same output; load_state_dict redistributes
DTensors of any placements and meshes into each parameter's placements; a
state_dict entry on a slice of a 2-D mesh is written by one slice only."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, nn
from mpitensor.checkpoint import _tensor
from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from mpi_helpers import Problems, all_ranks, raised
from tp_models import build, model_plan

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
B, S = 2, 12  # S divides by 1..4: sequence shards are even
# 12 heads split evenly over 1..4 ranks, so any tensor-parallel size keeps heads
# whole; the vocabulary and the hidden size split unevenly.
CONFIG = dict(vocab=37, dim=24, heads=12, layers=2, hidden=73)


# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")



def grid():
    """A (dp, tp) mesh with more than one dp slice where the size allows."""
    shape = (2, W // 2) if W % 2 == 0 else (W, 1)
    return mt.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))


def tokens():
    return np.random.default_rng(3).integers(0, CONFIG["vocab"], (B, S))


@pytest.fixture(scope="module")
def saved(tmp):
    """A GPT (seed 0) parallelized with Megatron's plan over all ranks, saved; and
    the single-process model's output."""
    mesh = mt.init_device_mesh("cpu", (W,))
    model = parallelize_module(build(0, **CONFIG), mesh, model_plan())
    path = os.path.join(tmp, "gpt")
    mt.save(model.state_dict(), path)
    return path, build(0, **CONFIG)(tokens())


TARGETS = {
    "unsharded": lambda m: m,
    "tensor parallel on mesh['tp'] of a 2-D mesh, sequence parallel": lambda m:
        parallelize_module(m, grid()["tp"], model_plan(sequence_parallel=True)),
    "tensor parallel over all ranks, loss parallel": lambda m:
        parallelize_module(m, mt.init_device_mesh("cpu", (W,)),
                           model_plan(loss_parallel=True)),
}


def output(model):
    out = model(tokens())
    return out.full_tensor() if isinstance(out, DTensor) else out


@pytest.mark.parametrize("how", ["like", "load_state_dict"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_transformer_state_dict_round_trip(saved, target, how):
    path, expect = saved
    model = TARGETS[target](build(1, **CONFIG))
    assert not np.allclose(output(model), expect)
    own = model.state_dict()
    sd = mt.load(path, like=own) if how == "like" else mt.load(path)
    if how == "like":  # read straight into each parameter's layout
        for name, value in own.items():
            got = sd[name]
            assert type(got) is type(value), name
            if isinstance(value, DTensor):
                assert got.device_mesh == value.device_mesh, name
                assert got.placements == value.placements, name
                assert got.to_local().shape == value.to_local().shape, name
    before = {name: (v.placements if isinstance(v, DTensor) else None)
              for name, v in own.items()}
    assert model.load_state_dict(sd) == ([], [])
    after = {name: (v.placements if isinstance(v, DTensor) else None)
             for name, v in model.state_dict().items()}
    assert after == before
    np.testing.assert_allclose(output(model), expect, rtol=1e-10, atol=1e-12)


def linear_values():
    """The weight and bias every case below loads, as plain arrays."""
    rng = np.random.default_rng(11)
    return rng.standard_normal((10, 6)), rng.standard_normal(10)


def as_partial(array, mesh):
    """A Partial(sum) DTensor whose shards add up to ``array``."""
    k = mesh.get_coordinate()[0]
    n = mesh.size(0)
    return DTensor.from_local(array * (k + 1) / (n * (n + 1) / 2), mesh,
                              [Partial()] + [Replicate()] * (mesh.ndim - 1))


def sources(mesh):
    """(label, weight value, bias value): DTensors in every placement on the
    parameters' mesh and on other meshes, and ndarrays."""
    w, b = linear_values()
    two = grid()
    out = [("ndarray", w, b)]
    for pl in ([Shard(0)], [Shard(1)], [Replicate()]):
        out.append((f"{pl} on the same mesh", distribute_tensor(w, mesh, pl),
                    distribute_tensor(b, mesh, [Replicate()])))
    out.append(("Partial on the same mesh", as_partial(w, mesh), as_partial(b, mesh)))
    out.append(("[Shard(1), Shard(0)] on a 2-D mesh",
                distribute_tensor(w, two, [Shard(1), Shard(0)]),
                distribute_tensor(b, two, [Shard(0), Replicate()])))
    out.append(("Partial on a 2-D mesh", as_partial(w, two), as_partial(b, two)))
    named = mt.init_device_mesh("cpu", (W,), mesh_dim_names=("tp",))
    out.append(("[Shard(1)] on the same ranks, named", distribute_tensor(w, named, [Shard(1)]),
                distribute_tensor(b, named, [Shard(0)])))
    return out


@pytest.mark.parametrize("style", ["colwise", "rowwise"])
def test_load_state_dict_redistributes_any_placements(style):
    mesh = mt.init_device_mesh("cpu", (W,))
    parallel = ColwiseParallel() if style == "colwise" else RowwiseParallel()
    w, b = linear_values()
    p = Problems()
    for label, wv, bv in sources(mesh):
        lin = parallelize_module(nn.Linear(6, 10), mesh, parallel)
        placements = (lin.weight.placements, lin.bias.placements)
        lin.load_state_dict({"weight": wv, "bias": bv})
        p.expect((lin.weight.placements, lin.bias.placements) == placements,
                 f"{label}: placements changed")
        p.expect(np.allclose(lin.weight.full_tensor(), w, rtol=1e-14, atol=0),
                 f"{label}: weight differs")
        p.expect(np.allclose(lin.bias.full_tensor(), b, rtol=1e-14, atol=0),
                 f"{label}: bias differs")
    assert p == []


def test_load_state_dict_refuses_a_wrong_shape_on_every_rank():
    mesh = mt.init_device_mesh("cpu", (W,))
    lin = parallelize_module(nn.Linear(6, 10), mesh, ColwiseParallel())
    bad = distribute_tensor(np.zeros((10, 5)), mesh, [Shard(1)])
    outcome = raised(lambda: lin.load_state_dict({"weight": bad, "bias": np.zeros(10)}),
                     RuntimeError, "size mismatch for weight")
    assert all_ranks(outcome is True), outcome


def sliced_state(two):
    """An entry on mesh["tp"] whose slices hold different values (the file must
    hold the first slice's), and one on the whole 2-D mesh."""
    g = np.arange(42.0).reshape(7, 6)
    dp = two.get_coordinate()[0]
    w = distribute_tensor(g + 1000.0 * dp, two["tp"], [Shard(0)])
    b = distribute_tensor(np.arange(5.0), two, [Replicate(), Shard(0)])
    return g, {"w": w, "b": b}


def test_entries_on_a_sliced_mesh_are_written_by_one_slice(tmp, monkeypatch):
    two = grid()
    g, state = sliced_state(two)
    writes = []
    real = mt.checkpoint._io.io_save

    def spy(mesh, path, *args, **kw):
        writes.append((os.path.basename(path).split(".")[0], args[-1].nbytes))
        return real(mesh, path, *args, **kw)

    monkeypatch.setattr(mt.checkpoint._io, "io_save", spy)
    path = os.path.join(tmp, "sliced")
    mt.save(state, path)
    monkeypatch.undo()
    calls = COMM.allgather(writes)
    w_calls = sum(1 for rank in calls for name, _ in rank if name == "w")
    w_bytes = sum(n for rank in calls for name, n in rank if name == "w")
    assert w_calls == two.size("tp"), calls  # one collective write, by one slice
    assert w_bytes == g.nbytes, calls
    leftovers = [f for f in os.listdir(path) if f.endswith(".tmp")]
    assert leftovers == []
    np.testing.assert_array_equal(np.load(os.path.join(path, "w.npy")), g)
    with open(os.path.join(path, "index.json")) as f:
        entry = json.load(f)["entries"]["w"]
    assert entry["placements"] == ["S(0)"] and entry["mesh_shape"] == [two.size("tp")]
    back = mt.load(path, like={"w": state["w"], "b": state["b"]})
    assert back["w"].device_mesh == two["tp"] and back["w"].placements == (Shard(0),)
    np.testing.assert_array_equal(back["w"].full_tensor(), g)
    np.testing.assert_array_equal(back["b"].full_tensor(), np.arange(5.0))


def test_a_failed_slice_write_raises_on_every_rank(tmp, monkeypatch):
    """The first slice fails to write an entry; the other slices, which write
    nothing, raise the same error instead of going on into the next collective."""
    two = grid()
    _, state = sliced_state(two)
    real = _tensor.save_dtensor

    def failing(dt, file, **kw):
        if os.path.basename(file) == "w.npy":
            raise PermissionError(f"cannot write {file!r}")
        return real(dt, file, **kw)

    monkeypatch.setattr(_tensor, "save_dtensor", failing)
    outcome = raised(lambda: mt.save(state, os.path.join(tmp, "failing")), PermissionError,
                     "cannot write")
    assert all_ranks(outcome is True), outcome
