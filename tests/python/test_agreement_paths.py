"""One primitive for agreement, seen from every path that agrees: a failure forced
on one rank (the first, the last, a middle one) must raise the same exception type
with the same message on every rank, and the job must go on (the next collective
pairs up and gives the right data). Paths: checkpoint save and load (path, file
checks, allocation), local_map's layout check, the parallel styles' input
annotation, context parallel's shard check, collective checks on redistribute,
and plot_sharding's write."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.checkpoint import _tensor
from mpitensor.debug import set_collective_checks
from mpitensor.experimental import context_parallel_unshard, local_map
from mpitensor.parallel._utils import annotate
from mpi_helpers import outcome, same_everywhere

COMM = MPI.COMM_WORLD
W, RANK = COMM.Get_size(), COMM.Get_rank()

pytestmark = pytest.mark.skipif(W < 2, reason="a failure on some ranks needs two of them")
WHO = {"first": 0, "last": W - 1, "middle": W // 2}


@pytest.fixture
def checks():
    """Collective checks on: a local input is compared across ranks only then
    (without them it is taken as an even shard with no communication, as torch)."""
    set_collective_checks(True)
    yield
    set_collective_checks(False)


def still_in_step(mesh):
    x = distribute_tensor(np.arange(4.0 * W), mesh, [Shard(0)])
    assert np.array_equal(x.redistribute(mesh, [Replicate()]).to_local(), np.arange(4.0 * W))


@pytest.fixture
def shared_dir(tmp_path):
    return COMM.bcast(str(tmp_path), root=0)


@pytest.fixture(params=sorted(set(WHO)))
def bad(request):
    return WHO[request.param]


def test_checkpoint_save_with_another_path_on_one_rank(mesh, shared_dir, bad):
    dt = distribute_tensor(np.ones((2 * W, 3)), mesh, [Shard(0)])
    path = os.path.join(shared_dir, "other.npy" if RANK == bad else "x.npy")
    got = same_everywhere(outcome(lambda: mt.save(dt, path)))
    assert got is not None and got[0] == "ValueError" and "same path" in got[1], got
    still_in_step(mesh)


def test_checkpoint_load_with_another_path_on_one_rank(mesh, shared_dir, bad):
    dt = distribute_tensor(np.ones((2 * W, 3)), mesh, [Shard(0)])
    mt.save(dt, os.path.join(shared_dir, "x.npy"))
    path = os.path.join(shared_dir, "y.npy" if RANK == bad else "x.npy")
    got = same_everywhere(outcome(lambda: mt.load(path, mesh, [Shard(0)])))
    assert got is not None and got[0] == "ValueError" and "same path" in got[1], got
    still_in_step(mesh)


def test_checkpoint_load_that_one_rank_cannot_allocate(mesh, shared_dir, bad, monkeypatch):
    dt = distribute_tensor(np.ones((2 * W, 3)), mesh, [Shard(0)])
    path = os.path.join(shared_dir, "x.npy")
    mt.save(dt, path)
    if RANK == bad:
        def no_memory(*args):
            raise MemoryError("forced")
        monkeypatch.setattr(_tensor, "_allocate", no_memory)
    got = same_everywhere(outcome(lambda: mt.load(path, mesh, [Shard(0)])))
    assert got is not None and got[0] == "MemoryError" and "cannot allocate" in got[1], got
    monkeypatch.undo()
    # the usual "resume, else start afresh" goes on: the next load works
    assert np.array_equal(mt.load(path, mesh, [Shard(0)]).full_tensor(), np.ones((2 * W, 3)))


def test_local_map_output_that_does_not_fit_on_one_rank(mesh, bad):
    x = distribute_tensor(np.ones((4 * W, 3)), mesh, [Shard(0)])
    f = local_map(lambda a: np.concatenate([a, a]) if RANK == bad else a,
                  out_placements=[Shard(0)])
    got = same_everywhere(outcome(lambda: f(x)))
    # (every rank's output may misfit the global shape the long one makes: the
    # message is the first misfitting rank's)
    assert got is not None and got[0] == "ValueError" and "torch.chunk shards" in got[1], got
    still_in_step(mesh)


@pytest.mark.parametrize("local, error", [("not an array", "TypeError"),
                                          (np.array(1.0), "ValueError"),
                                          (np.ones(4), "ValueError")],
                         ids=["not_an_array", "zero_d", "other_ndim"])
def test_parallel_input_annotation_bad_on_one_rank(mesh, bad, local, error, request, checks):
    kind = request.node.callspec.id.split("-")[-1]
    mine = local if RANK == bad else np.ones((4, 3))
    want = {"not_an_array": f"ndarray or a DTensor; on rank(s) [{bad}]",
            "zero_d": f"cannot shard a 0-d input on dim 0 (rank(s) [{bad}]",
            "other_ndim": "dims on the ranks of the mesh"}[kind]
    got = same_everywhere(outcome(lambda: annotate(mine, mesh, [Shard(0)])))
    assert got is not None and got[0] == error and want in got[1], got
    still_in_step(mesh)


@pytest.mark.parametrize("local, error, want", [
    ("not an array", "TypeError", "expecting the input to be an ndarray"),
    (np.array(1.0), "ValueError", "cannot shard a 0-d input"),
    (np.ones((5, 3)), "ValueError", "differ in shape across the ranks"),
    (np.ones((0, 3)), "ValueError", "differ in shape across the ranks")],
    ids=["not_an_array", "zero_d", "uneven", "empty"])
def test_parallel_input_annotation_bad_on_one_rank_without_checks(mesh, bad, local, error,
                                                                 want):
    """Without collective checks the local shapes are agreed on: an even split has
    one shape on every rank."""
    mine = local if RANK == bad else np.ones((4, 3))
    got = same_everywhere(outcome(lambda: annotate(mine, mesh, [Shard(0)])))
    assert got is not None and got[0] == error and want in got[1], got
    still_in_step(mesh)
    assert annotate(np.ones((4, 3)), mesh, [Shard(0)]).shape == (4 * W, 3)


@pytest.mark.world(4, reason="a (2, 2) mesh")
@pytest.mark.parametrize("kind", ["not_an_array", "other_ndim", "misfit"])
def test_parallel_input_annotation_on_a_2d_mesh(mesh, bad, kind, checks):
    square = init_device_mesh("cpu", (2, 2))
    ok = np.ones((4, 3))
    mine = {"not_an_array": "x", "other_ndim": np.ones(4),
            "misfit": np.ones((1, 3))}[kind] if RANK == bad else ok
    got = same_everywhere(outcome(lambda: annotate(mine, square, [Shard(0), Shard(1)])))
    assert got is not None and got[0] == ("TypeError" if kind == "not_an_array"
                                          else "ValueError"), got
    still_in_step(mesh)
    assert annotate(ok, square, [Shard(0), Shard(1)]).shape == (8, 6)


def test_context_parallel_unshard_bad_on_one_rank(mesh, bad):
    local = np.ones((2, 4)) if RANK != bad else np.ones((2, 4), np.int8).tolist()
    got = same_everywhere(outcome(
        lambda: context_parallel_unshard(mesh, [local], [0])))
    assert got is not None and got[0] == "ValueError", got
    assert got[1].startswith("context_parallel_unshard: "), got
    still_in_step(mesh)


def test_collective_checks_on_redistribute_to_another_target_on_one_rank(mesh, bad):
    x = distribute_tensor(np.ones((2 * W, 2 * W)), mesh, [Shard(0)])
    set_collective_checks(True)
    try:
        got = same_everywhere(outcome(
            lambda: x.redistribute(mesh, [Shard(1)] if RANK == bad else [Replicate()])))
    finally:
        set_collective_checks(False)
    assert got is not None and got[0] == "RuntimeError" and "collective mismatch" in got[1]
    still_in_step(mesh)


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="plot_sharding draws with matplotlib")
def test_plot_that_cannot_be_written(mesh, shared_dir):
    from mpitensor.debug import plot_sharding

    dt = distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    missing = os.path.join(shared_dir, "no", "such", "dir", "x.png")
    got = same_everywhere(outcome(lambda: plot_sharding(dt, missing)))
    assert got is not None and got[0] == "OSError", got
    assert "failed on the mesh's first rank" in got[1], got
    still_in_step(mesh)


def partial_state(mesh, shapes, dtype=np.float64):
    """A Linear(6, 10)'s state as Partial DTensors of the given shapes: loading
    them into a column-wise Linear reduce-scatters each, a collective per key."""
    return {key: mt.DTensor.from_local(np.ones(shape, dtype), mesh, [mt.Partial()],
                                       run_check=False)
            for key, shape in shapes.items()}


def colwise_linear(mesh):
    from mpitensor.parallel import ColwiseParallel, parallelize_module
    return parallelize_module(mt.nn.Linear(6, 10), mesh, ColwiseParallel())


@pytest.mark.parametrize("case", ["size", "missing", "complex", "float32"])
def test_load_state_dict_bad_on_one_rank(mesh, bad, case):
    """A state dict that differs on one rank (a shape, a missing key, a dtype that
    cannot be cast, or one that can but makes the reduction's types differ) is a
    RuntimeError in torch's words on every rank, before any key is loaded."""
    lin = colwise_linear(mesh)
    shapes = {"weight": (10, 6), "bias": (10,)}
    dtype = np.float64
    if RANK == bad:
        if case == "size":
            shapes["weight"] = (10, 5)
        elif case == "missing":
            del shapes["bias"]
        else:
            dtype = np.complex128 if case == "complex" else np.float32
    sd = partial_state(mesh, shapes, dtype)
    got = same_everywhere(outcome(lambda: lin.load_state_dict(sd)))
    want = {"size": "size mismatch for weight: copying a param with shape (10, 5)",
            "missing": 'Missing key(s) in state_dict: "bias"',
            "complex": "dtype mismatch for weight",
            "float32": "differ across the ranks"}[case]
    assert got[0] == "RuntimeError" and want in got[1], got
    assert got[1].startswith("Error(s) in loading state_dict for Linear:"), got
    still_in_step(mesh)
    # Nothing was loaded: the weight is still the module's own.
    assert not np.any(lin.weight.to_local() == W), lin.weight.to_local()


@pytest.mark.parametrize("case", ["size", "groups"])
def test_optimizer_load_state_dict_bad_on_one_rank(mesh, bad, case):
    """A moment buffer of another shape, or a group of another size, on one rank
    is a ValueError on every rank, before any state tensor is redistributed."""
    lin = colwise_linear(mesh)
    opt = mt.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    groups = opt.state_dict()["param_groups"]
    wrong = RANK == bad and case == "size"
    buffers = partial_state(mesh, {"weight": (10, 5) if wrong else (10, 6), "bias": (10,)})
    if RANK == bad and case == "groups":
        groups = [{**groups[0], "params": groups[0]["params"] + [2]}]
    sd = {"state": {0: {"momentum_buffer": buffers["weight"]},
                    1: {"momentum_buffer": buffers["bias"]}},
          "param_groups": groups}
    got = same_everywhere(outcome(lambda: opt.load_state_dict(sd)))
    want = {"size": "size mismatch for state.0.momentum_buffer",
            "groups": "doesn't match the size of optimizer's group"}[case]
    assert got[0] == "ValueError" and want in got[1], got
    still_in_step(mesh)
    assert not opt.state, opt.state


def test_load_state_dict_agrees_once_per_mesh(mesh, monkeypatch):
    """Two DTensor values on the parameters' mesh: one agreement for the module,
    one for the optimizer (torch runs none; a checkpoint loads a few times a job)."""
    lin = colwise_linear(mesh)
    opt = mt.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    sd = partial_state(mesh, {"weight": (10, 6), "bias": (10,)})
    osd = {"state": {0: {"momentum_buffer": sd["weight"]}, 1: {"momentum_buffer": sd["bias"]}},
           "param_groups": opt.state_dict()["param_groups"]}
    calls = []
    real = mt._comm.agree
    monkeypatch.setattr(mt._comm, "agree", lambda *a: calls.append(a[0]) or real(*a))
    lin.load_state_dict(sd)
    opt.load_state_dict(osd)
    monkeypatch.undo()
    assert calls == [mesh, mesh], calls
    assert np.array_equal(lin.weight.full_tensor(), np.full((10, 6), float(W)))
