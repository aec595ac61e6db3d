"""CommDebugMode's module and operation trace, on an MLP parallelized Colwise ->
Rowwise by hand (duck_modules: a stand-in with exactly the Module methods the
tracker uses): per-module counts added to parents, the tracing table at noise
levels 0..3 and its file form, the JSON dump, get_sharding_info /
get_parameter_info, summary(), and hooks removed on exit."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.debug import CommDebugMode
from duck_modules import MLP, Linear, replicated_input

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
Y, RED, Z = "\033[1;33m", "\033[1;31m", "\033[0m"


@pytest.fixture(scope="module")
def mesh():
    return init_device_mesh("cpu", (W,))


@pytest.fixture
def traced(mesh):
    model = MLP(mesh)
    x = replicated_input(mesh)
    with CommDebugMode(model) as mode:
        out = model(x)
    return model, x, out, mode


def ring_share(nbytes: int) -> int:
    """Bytes this rank sends in a ring all-reduce of an nbytes buffer over W ranks:
    2 (W - 1) / W of it, the remainder going to the lowest ranks."""
    total = 2 * (W - 1) * nbytes
    return total // W + (RANK < total % W)


def op(name, shapes, shardings, mesh_text):
    lines = [f"{Y}            **{name}{Z}"]
    if shapes:
        lines += [f"{RED}              shape: {shapes}{Z}",
                  f"{RED}              sharding: {shardings}{Z}",
                  f"{RED}              device mesh: {mesh_text}{Z}"]
    return lines


def expected_table(level: int) -> str:
    """The MLP's table at W > 1, written out: one all-reduce in net2 (Rowwise
    output), counted in MLP and Global too; operations by noise level."""
    b = ring_share(4 * 8 * 8)
    m = f"DeviceMesh('cpu', {list(range(W))})"
    coll = "*all_reduce: 1 ({} B)".format(b)
    R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()
    trivial, plain, detail = level >= 3, level >= 2, level >= 1
    lines = ["Global", "  FORWARD PASS", f"{Y}    {coll}{Z}", "    MLP"]
    if detail:
        lines.append("    *module type: class 'duck_modules.MLP'")
    lines += ["      FORWARD PASS", f"{Y}        {coll}{Z}", "        MLP.net1"]
    if detail:
        lines += ["        *module type: class 'duck_modules.Linear'",
                  "        *Parameter List",
                  "         *weight: (Shard(dim=0),)", "         *bias: (Shard(dim=0),)",
                  "          FORWARD PASS"]
        if trivial:
            lines += op("numpy.transpose", [(16, 8)], [(S0,)], m)
        lines += op("numpy.matmul", [(4, 8), (8, 16)], [(R,), (S1,)], m)
        lines += op("numpy.add", [(4, 16), (16,)], [(S1,), (S0,)], m)
    lines.append("        MLP.relu")
    if detail:
        lines += ["        *module type: class 'duck_modules.ReLU'", "          FORWARD PASS"]
        lines += op("numpy.maximum", [(4, 16)], [(S1,)], m)
    lines.append("        MLP.net2")
    if detail:
        lines += ["        *module type: class 'duck_modules.Linear'",
                  "        *Parameter List",
                  "         *weight: (Shard(dim=1),)", "         *bias: (Replicate(),)"]
    lines += ["          FORWARD PASS", f"{Y}            {coll}{Z}"]
    if detail:
        if trivial:
            lines += op("numpy.transpose", [(8, 16)], [(S1,)], m)
        lines += op("numpy.matmul", [(4, 16), (16, 8)], [(S1,), (S0,)], m)
        lines += op("DTensor.redistribute", [(4, 8)], [(P,)], m)
        if plain:
            lines += op("all_reduce", [], [], m)
        lines += op("numpy.add", [(4, 8), (8,)], [(R,), (R,)], m)
    return "".join(line + "\n" for line in lines)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_tracing_table_exact(traced, level):
    _, _, _, mode = traced
    table = mode.generate_comm_debug_tracing_table(noise_level=level)
    if W == 1:
        # A mesh of one rank needs no collective: the module tree alone at level 0.
        if level == 0:
            assert table == "Global\n    MLP\n        MLP.net1\n        MLP.relu\n        MLP.net2\n"
        else:
            assert "all_reduce" not in table and "**numpy.matmul" in table
        return
    assert table == expected_table(level)


def test_module_counts_added_to_parents(traced):
    _, _, _, mode = traced
    counts = {fqn: dict(v["forward"]) for fqn, v in mode.comm_module_counts.items()}
    if W == 1:
        assert counts == {}
        return
    one = {"all_reduce": 1}
    assert counts == {"Global": one, "MLP": one, "MLP.net2": one}
    assert dict(mode.get_comm_counts()) == one
    assert mode.comm_module_bytes["MLP.net2"]["forward"]["all_reduce"] == ring_share(256)
    assert mode.get_comm_bytes()["all_reduce"] == ring_share(256)


def test_result_is_the_dense_mlp(traced):
    """The trace does not change what runs: the output is the dense computation."""
    model, x, out, _ = traced
    dense = x.full_tensor()
    for lin in (model.net1, model.net2):
        dense = dense @ lin._params["weight"].full_tensor().T + lin._params["bias"].full_tensor()
        if lin is model.net1:
            dense = np.maximum(dense, 0.0)
    np.testing.assert_allclose(out.full_tensor(), dense, rtol=1e-12, atol=1e-12)


def test_sharding_and_parameter_info(traced):
    model, _, _, mode = traced
    assert mode.get_sharding_info() == {
        "MLP.net1.weight": (Shard(0),), "MLP.net1.bias": (Shard(0),),
        "MLP.net2.weight": (Shard(1),), "MLP.net2.bias": (Replicate(),),
    }
    info = mode.get_parameter_info()
    assert list(info) == ["MLP.net1", "MLP.net2"]
    assert list(info["MLP.net1"]) == ["weight", "bias"]
    assert info["MLP.net2"]["weight"] is model.net2._params["weight"]


def test_json_dump_exact(traced, tmp_path_factory):
    _, _, _, mode = traced
    path = tmp_path_factory.mktemp(f"json{RANK}") / "comm.json"
    mode.generate_json_dump(str(path), noise_level=1)
    root = json.loads(path.read_text())
    keys = ["fqn", "module_type", "parameters", "children", "collectives_forward",
            "collective_bytes_forward", "collectives_backward", "operations_forward",
            "operations_backward", "operations_checkpointing"]
    assert list(root) == keys
    mlp = root["children"][0]
    assert [root["fqn"], mlp["fqn"]] == ["Global", "MLP"]
    assert [c["fqn"] for c in mlp["children"]] == ["MLP.net1", "MLP.relu", "MLP.net2"]
    net1, _, net2 = mlp["children"]
    assert net1["module_type"] == "class 'duck_modules.Linear'"
    assert net1["parameters"] == [["weight", "(Shard(dim=0),)"], ["bias", "(Shard(dim=0),)"]]
    # a one-rank mesh too: the contraction leaves a Partial there, as in torch
    assert [o["name"] for o in net2["operations_forward"]] == [
        "numpy.matmul", "DTensor.redistribute", "numpy.add"]
    first = net1["operations_forward"][0]
    assert list(first) == ["name", "input_shape", "input_sharding", "device_mesh", "is_bw",
                           "is_activation_checkpointing"]
    assert first["input_shape"] == ["(4, 8)", "(8, 16)"]
    expect = [["all_reduce", 1]] if W > 1 else []
    for node in (root, mlp, net2):
        assert node["collectives_forward"] == expect
        assert node["collective_bytes_forward"] == (
            [["all_reduce", ring_share(256)]] if W > 1 else [])
    assert net1["collectives_forward"] == [] and root["operations_forward"] == []


def test_json_noise_level_zero_has_no_operations(traced, tmp_path_factory):
    _, _, _, mode = traced
    path = tmp_path_factory.mktemp(f"json0{RANK}") / "comm.json"
    mode.generate_json_dump(str(path), noise_level=0)
    root = json.loads(path.read_text())

    def walk(node):
        yield node
        for child in node["children"]:
            yield from walk(child)

    nodes = list(walk(root))
    assert [n["fqn"] for n in nodes] == ["Global", "MLP", "MLP.net1", "MLP.relu", "MLP.net2"]
    assert all(n["operations_forward"] == [] and n["module_type"] == "" for n in nodes)


def test_log_to_file_has_no_colour_codes(traced, tmp_path_factory):
    _, _, _, mode = traced
    path = tmp_path_factory.mktemp(f"txt{RANK}") / "comm.txt"
    mode.log_comm_debug_tracing_table_to_file(str(path), noise_level=2)
    text = path.read_text()
    assert "\033" not in text
    assert text == re.sub(r"\x1b\[[0-9;]*m", "", mode.generate_comm_debug_tracing_table(2))
    if W > 1:
        assert f"            *all_reduce: 1 ({ring_share(256)} B)\n" in text


def test_summary(traced):
    _, _, _, mode = traced
    if W == 1:
        assert mode.summary() == "0 collectives, 0 B sent by this rank"
    else:
        b = ring_share(256)
        assert mode.summary() == f"1 collective, {b} B sent by this rank: all_reduce 1 ({b} B)"


def test_hooks_removed_on_exit_and_reentry_resets(mesh):
    model = MLP(mesh)
    x = replicated_input(mesh)
    mode = CommDebugMode(model)
    assert model.hook_count() == 0
    with mode:
        assert model.hook_count() == 2 * 4  # pre and post on MLP, net1, relu, net2
        model(x)
    assert model.hook_count() == 0
    with mode:
        pass
    assert mode.get_sharding_info() == {} and mode.comm_module_counts == {}
    mode.track(model).track(model.net1)  # tracked twice: still one pair of hooks each
    with mode:
        assert model.hook_count() == 2 * 4
        model(x)
    assert model.hook_count() == 0
    assert list(mode.get_sharding_info())[:2] == ["MLP.net1.weight", "MLP.net1.bias"]


def test_track_inside_and_collectives_outside_modules(mesh):
    """track() inside the context attaches at once; collectives outside every
    module count for Global only; a sub-module called alone is named by its root."""
    model = MLP(mesh)
    x = replicated_input(mesh)
    sharded = distribute_tensor(np.zeros((8, 4)), mesh, [Shard(0)])
    with CommDebugMode() as mode:
        sharded.full_tensor()  # an all-gather outside every module
        mode.track(model)
        model.net2(model.relu(model.net1(x)))
    counts = {fqn: dict(v["forward"]) for fqn, v in mode.comm_module_counts.items()}
    if W > 1:
        assert counts == {"Global": {"all_gather_into_tensor": 1, "all_reduce": 1},
                          "MLP.net2": {"all_reduce": 1}}
    assert list(mode.advanced_module_tracker.module_helper_dict) == [
        "Global", "MLP.net1", "MLP.relu", "MLP.net2"]
    assert mode.advanced_module_tracker.module_helper_dict["MLP.net1"]["depth"] == 1


def test_operations_outside_modules_and_standalone_module(mesh):
    lin = Linear(mesh, 4, 6, [Shard(0)], [Shard(0)])
    x = DTensor.from_local(np.ones((2, 4)), mesh, [Replicate()])
    with CommDebugMode(lin) as mode:
        lin(x)
        x + 1.0
    ops = mode.comm_module_operation_counts
    assert [o["name"] for o in ops["Linear"]["operations_list"]] == [
        "numpy.transpose", "numpy.matmul", "numpy.add"]
    assert [o["name"] for o in ops["Global"]["operations_list"]] == ["numpy.add"]


def test_noise_level_checked(traced):
    _, _, _, mode = traced
    for bad in (-1, 4, 1.0, True, "3"):
        with pytest.raises(ValueError, match="noise_level"):
            mode.generate_comm_debug_tracing_table(bad)
