"""CommDebugMode's module and operation trace on an mpitensor.nn MLP parallelized
Colwise -> Rowwise with parallelize_module, traced as torch traces it (no module
named: global module hooks): per-module counts added to parents, the tracing table
at noise levels 0..3 and its file form, the JSON dump, get_sharding_info /
get_parameter_info, summary(), the naming of modules, and hooks removed on exit."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, nn
from mpitensor.debug import CommDebugMode, _comm_mode
from mpitensor.nn import module as nn_module
from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
Y, RED, Z = "\033[1;33m", "\033[1;31m", "\033[0m"
MLP_TYPE = f"class '{__name__}.MLP'"
LINEAR_TYPE = "class 'mpitensor.nn.linear.Linear'"
RELU_TYPE = "class 'mpitensor.nn.activation.ReLU'"


class MLP(nn.Module):
    """torch's MLPModule in small: net1 -> relu -> net2."""

    def __init__(self, dim: int = 8, hidden: int = 16):
        super().__init__()
        mt.manual_seed(5)
        self.net1 = nn.Linear(dim, hidden)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


PLAN = {"net1": ColwiseParallel(), "net2": RowwiseParallel()}


def parallel_mlp(mesh):
    return parallelize_module(MLP(), mesh, PLAN)


def batch():
    return np.random.default_rng(7).standard_normal((4, 8))


@pytest.fixture
def traced(mesh):
    model = parallel_mlp(mesh)
    x = batch()
    with CommDebugMode() as mode:
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
    """The MLP's table, written out: one all-reduce in net2 (RowwiseParallel's
    output, counted in MLP and Global too; none on one rank); relu gets net1's
    local output (use_local_output), so it runs no DTensor operation."""
    b = ring_share(4 * 8 * 8)
    m = f"DeviceMesh('cpu', {list(range(W))})"
    coll = [f"*all_reduce: 1 ({b} B)"] if W > 1 else []
    R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()
    plain, detail = level >= 2, level >= 1

    def forward(indent, ops=()):
        if not coll and not ops:
            return []
        return [f"{indent}  FORWARD PASS"] + [f"{Y}{indent}    {c}{Z}" for c in coll] + list(ops)

    lines = ["Global"] + forward("") + ["    MLP"]
    if detail:
        lines.append(f"    *module type: {MLP_TYPE}")
    lines += forward("    ") + ["        MLP.net1"]
    if detail:
        lines += [f"        *module type: {LINEAR_TYPE}", "        *Parameter List",
                  "         *weight: (Shard(dim=0),)", "         *bias: (Shard(dim=0),)",
                  "          FORWARD PASS"]
        # Linear is one operation, x @ w.T with the bias added in the same step
        # (the Shard(0) bias lines up with the output's Shard(1)), as torch's
        # aten.addmm.
        lines += op("linear", [(4, 8), (16, 8)], [(R,), (S0,)], m)
    lines.append("        MLP.relu")
    if detail:
        lines.append(f"        *module type: {RELU_TYPE}")
    lines.append("        MLP.net2")
    ops = []
    if detail:
        lines += [f"        *module type: {LINEAR_TYPE}", "        *Parameter List",
                  "         *weight: (Shard(dim=1),)", "         *bias: (Replicate(),)"]
        # The Replicate bias joins the Partial product inside the same operation,
        # on the first rank only.
        ops += op("linear", [(4, 16), (8, 16)], [(S1,), (S1,)], m)
        ops += op("DTensor.redistribute", [(4, 8)], [(P,)], m)
        if plain and W > 1:
            ops += op("all_reduce", [], [], m)
    lines += forward("        ", ops)
    return "".join(line + "\n" for line in lines)


class Terminal:
    """A stand-in for sys.stdout that says it is a terminal."""

    def isatty(self):
        return True

    def write(self, text):
        return len(text)

    def flush(self):
        pass


@pytest.fixture
def terminal(monkeypatch):
    """Tables as printed to a terminal (pytest's capture is not one)."""
    monkeypatch.setattr(_comm_mode, "_colours", lambda: True)


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_tracing_table_exact(traced, level, terminal):
    _, _, _, mode = traced
    assert mode.generate_comm_debug_tracing_table(noise_level=level) == expected_table(level)


def plain(text):
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_colours_only_for_a_terminal_without_no_color(traced, monkeypatch):
    _, _, _, mode = traced
    for name in ("NO_COLOR", "FORCE_COLOR", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with monkeypatch.context() as m:
        m.setattr(sys, "stdout", Terminal())
        assert _comm_mode._colours()
        m.setenv("OMPI_COMM_WORLD_SIZE", "4")  # a rank's terminal is mpiexec's pty
        assert not _comm_mode._colours()
        m.setenv("FORCE_COLOR", "1")
        assert _comm_mode._colours()
        assert mode.generate_comm_debug_tracing_table(noise_level=2) == expected_table(2)
        m.setenv("NO_COLOR", "1")
        assert not _comm_mode._colours()
        assert mode.generate_comm_debug_tracing_table(noise_level=2) == plain(expected_table(2))
    with open(os.devnull, "w") as devnull, monkeypatch.context() as m:
        m.setattr(sys, "stdout", devnull)  # a file, not a terminal
        assert not _comm_mode._colours()
        assert mode.generate_comm_debug_tracing_table(noise_level=2) == plain(expected_table(2))


def test_log_to_file_has_no_colour_codes(traced, tmp_path_factory):
    _, _, _, mode = traced
    path = tmp_path_factory.mktemp(f"txt{RANK}") / "comm.txt"
    mode.log_comm_debug_tracing_table_to_file(str(path), noise_level=2)
    text = path.read_text()
    assert "\033" not in text
    assert text == plain(expected_table(2))


def test_summary(traced):
    _, _, _, mode = traced
    if W == 1:
        assert mode.summary() == "0 collectives, 0 B sent by this rank"
    else:
        b = ring_share(256)
        assert mode.summary() == f"1 collective, {b} B sent by this rank: all_reduce 1 ({b} B)"


def hook_counts(model):
    return (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks),
            sum(len(m._forward_hooks) for m in model.modules()))


def test_hooks_removed_on_exit_and_reentry_resets(mesh):
    model = parallel_mlp(mesh)
    before = hook_counts(model)
    mode = CommDebugMode()
    with mode:
        assert hook_counts(model)[0] == before[0] + 1
        model(batch())
        assert hook_counts(model) == (before[0] + 1,) + before[1:]  # per-call hooks gone
    assert hook_counts(model) == before
    with mode:
        pass
    assert mode.get_sharding_info() == {}
    assert mode.comm_module_counts == {"Global": {"forward": {}, "backward": {}}}
    assert list(mode.advanced_module_tracker.module_helper_dict) == ["Global"]
    boom = Boom()
    with pytest.raises(RuntimeError, match="boom"), mode:
        boom()  # its per-call hook never ran: it is removed on exit
    assert hook_counts(model) == before and hook_counts(boom) == (before[0], before[1], 0)


class Boom(nn.Module):
    def forward(self):
        raise RuntimeError("boom")


def test_submodule_names_as_torch(mesh):
    """A module first seen running is named after its class; naming the root up
    front (or running it once) names its submodules under it; collectives outside
    every module count for Global only."""
    model = parallel_mlp(mesh)
    h = model.relu(model.net1(batch()))
    sharded = distribute_tensor(np.zeros((8, 4)), mesh, [Shard(0)])
    with CommDebugMode() as mode:
        model.net2(h)
    assert list(mode.advanced_module_tracker.module_helper_dict) == ["Global", "Linear"]
    with CommDebugMode().track(model) as mode:
        sharded.full_tensor()  # an all-gather outside every module
        model.net2(h)
    counts = {fqn: dict(v["forward"]) for fqn, v in mode.comm_module_counts.items()}
    if W > 1:
        assert counts == {"Global": {"all_gather_into_tensor": 1, "all_reduce": 1},
                          "MLP.net2": {"all_reduce": 1}}
    helper = mode.advanced_module_tracker.module_helper_dict
    assert list(helper) == ["Global", "MLP.net2"] and helper["MLP.net2"]["depth"] == 1
    with pytest.raises(TypeError, match="mpitensor.nn modules"):
        CommDebugMode(object())


def test_operations_outside_modules_and_trivial_ones(mesh):
    lin = parallelize_module(nn.Linear(4, 6), mesh, ColwiseParallel(use_local_output=False))
    x = np.ones((2, 4))
    with CommDebugMode() as mode:
        y = lin(x)
        y.T + 1.0
    ops = mode.comm_module_operation_counts
    assert [o["name"] for o in ops["Linear"]["operations_list"]] == ["linear"]
    assert [o["name"] for o in ops["Global"]["operations_list"]] == [
        "numpy.transpose", "numpy.add"]
    # Views are trivial: shown at noise level 3 only.
    assert "**numpy.transpose" not in mode.generate_comm_debug_tracing_table(2)
    assert "**numpy.transpose" in mode.generate_comm_debug_tracing_table(3)


def test_operations_listed_on_their_side_in_order(mesh):
    """Each operation is listed with the side (forward, backward) in force when it
    ran, in the order it ran, also when the list is read between them."""
    x = distribute_tensor(np.arange(16.0).reshape(4, 4), mesh, [Shard(0)]).requires_grad_()
    with CommDebugMode() as mode:
        y = np.tanh(x)
        so_far = mode.comm_module_operation_counts["Global"]["operations_list"]
        so_far = [o["name"] for o in so_far]
        (y * y).sum().backward()
    ops = mode.comm_module_operation_counts["Global"]["operations_list"]
    assert so_far == ["numpy.tanh"]
    assert [o["name"] for o in ops[:3]] == ["numpy.tanh", "numpy.multiply", "numpy.sum"]
    sides = [o["is_bw"] for o in ops]
    assert sides[:3] == [False] * 3 and len(sides) > 3 and all(sides[3:])
    table = mode.generate_comm_debug_tracing_table(1)
    assert (table.index("FORWARD PASS") < table.index("**numpy.sum")
            < table.index("BACKWARD PASS") < table.index("**numpy.subtract"))


def test_nested_modes_both_trace(mesh, terminal):
    model = parallel_mlp(mesh)
    with CommDebugMode() as outer:
        with CommDebugMode() as inner:
            model(batch())
    for mode in (outer, inner):
        assert mode.generate_comm_debug_tracing_table(1) == expected_table(1)


def test_noise_level_checked(traced):
    _, _, _, mode = traced
    for bad in (-1, 4, 1.0, True, "3"):
        with pytest.raises(ValueError, match="noise_level"):
            mode.generate_comm_debug_tracing_table(bad)
