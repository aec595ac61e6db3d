"""The time model plans are ranked by: the calibrated table (read, validated, loaded
by every new mesh alike), the node layout a mesh learns, and plans on simulated
meshes that switch between per-dim collectives and one direct exchange where the
model says."""

import json
import logging
import math

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard, _timemodel, _comm, _plan
from mpitensor._layout import _codes
from mpi_helpers import node_of_each_rank, ref_ranks_per_node
from redistribute_ref import torch_plan

COMM = MPI.COMM_WORLD


def write_table(tmp_path, table, name="tm.json"):
    path = tmp_path / name
    path.write_text(table if isinstance(table, str) else json.dumps(table))
    return str(path)


GOOD = {"format": "mpitensor-time-model", "version": 1,
        "shm": {"alpha": 4e-7, "beta": 1e-10}, "net": {"alpha": 3e-5, "beta": 2e-9},
        "call": 1e-6, "copy": 2e-10, "reduce": 3e-10}
COSTS = (4e-7, 1e-10, 3e-5, 2e-9, 1e-6, 2e-10, 3e-10)


def test_read_table(tmp_path):
    assert _timemodel.read_table(str(tmp_path / "missing.json")) is None
    assert _timemodel.read_table(write_table(tmp_path, GOOD)) == COSTS
    # One node measured: the built-in network costs stand in, and the call cost.
    builtin = _comm.default_time_model()
    one = {k: v for k, v in GOOD.items() if k not in ("net", "call")}
    assert _timemodel.read_table(write_table(tmp_path, one)) == (
        4e-7, 1e-10, builtin[2], builtin[3], builtin[4], 2e-10, 3e-10)
    # A table written before copy and reduce were fitted: the built-in ones.
    old = {k: v for k, v in GOOD.items() if k not in ("copy", "reduce")}
    assert _timemodel.read_table(write_table(tmp_path, old)) == COSTS[:5] + builtin[5:7]


@pytest.mark.parametrize("table, why", [
    ("{not json", "invalid"),
    ({"format": "other", "version": 1}, "not a 'mpitensor-time-model' table"),
    ({**GOOD, "version": 2}, "version is 2"),
    ({**GOOD, "shm": {"alpha": -1.0, "beta": 1e-10}}, "shm.alpha is -1.0"),
    ({**GOOD, "net": {"alpha": 3e-5, "beta": "fast"}}, "net.beta is 'fast'"),
    ({**GOOD, "shm": {"alpha": 4e-7}}, "shm.beta is None"),
    ({**GOOD, "net": {"alpha": 1e-7, "beta": 2e-9}}, "faster than shared memory"),
    ({**GOOD, "call": math.inf}, "call is inf"),
    ({**GOOD, "copy": -1e-10}, "copy is -1e-10"),
    ({**GOOD, "reduce": True}, "reduce is True"),
])
def test_bad_table_is_a_clear_error(tmp_path, table, why):
    path = write_table(tmp_path, table)
    with pytest.raises(ValueError, match="time model table") as info:
        _timemodel.read_table(path)
    assert path in str(info.value) and why in str(info.value)


def shared_path(tmp_path, table):
    """A table written by rank 0 at a path every rank reads (one machine)."""
    path = write_table(tmp_path, table) if COMM.rank == 0 else None
    return COMM.bcast(path)


def test_mesh_loads_the_table(tmp_path, monkeypatch):
    monkeypatch.setenv("MPITENSOR_TIME_MODEL", shared_path(tmp_path, GOOD))
    mesh = mt.init_device_mesh("cpu", (COMM.size,))
    got = _comm.mesh_time_model(mesh)
    assert got[:7] == COSTS
    # 0 when every rank shares one node, else the ranks per node, as MPI finds them.
    assert got[7] == ref_ranks_per_node(node_of_each_rank())
    # Slices inherit the costs; the redistribute path plans with them.
    plan = mt._layout.plan(mesh, (COMM.size * 4,), (Shard(0),),
                                     (Replicate(),), np.dtype("f8"))
    n = COMM.size
    if n > 1:
        expect = _plan.Plan((n * 4,), (n,), _codes((Shard(0),)), _codes((Replicate(),)),
                         "f8", got).time
        assert plan.time == expect and plan.time != _plan.Plan(
            (n * 4,), (n,), _codes((Shard(0),)), _codes((Replicate(),)), "f8").time


def test_bad_table_logs_and_uses_the_builtin(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MPITENSOR_TIME_MODEL",
                       shared_path(tmp_path, {**GOOD, "shm": {"alpha": "x", "beta": 0}}))
    with caplog.at_level(logging.WARNING, logger="mpitensor"):
        mesh = mt.init_device_mesh("cpu", (COMM.size,))
    assert _comm.mesh_time_model(mesh)[:7] == _comm.default_time_model()[:7]
    assert any("shm.alpha is 'x'" in r.getMessage() and "built-in" in r.getMessage()
               for r in caplog.records)


def test_builtin_ignores_any_table(tmp_path, monkeypatch):
    monkeypatch.setenv("MPITENSOR_TIME_MODEL", "builtin")
    mesh = mt.init_device_mesh("cpu", (COMM.size,))
    assert _comm.mesh_time_model(mesh)[:7] == _comm.default_time_model()[:7]


def test_set_time_model_validates():
    mesh = mt.init_device_mesh("cpu", (COMM.size,))
    before = _comm.mesh_time_model(mesh)
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        _comm.set_mesh_time_model(mesh, (-1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0))
    with pytest.raises(ValueError, match="copy"):
        _comm.set_mesh_time_model(mesh, (0.0, 0.0, 1.0, 1.0, 0.0, math.nan, 0.0, 0))
    with pytest.raises(TypeError, match="time model"):
        _comm.set_mesh_time_model(mesh, [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0])
    with pytest.raises(TypeError):  # the tuple of six before copy and reduce
        _comm.set_mesh_time_model(mesh, (1.0, 0.0, 1.0, 1.0, 0.0, 0))
    assert _comm.mesh_time_model(mesh) == before


def kinds(shape, mesh_shape, src, dst, model):
    plan = _plan.Plan(shape, mesh_shape, _codes(src), _codes(dst), "f8", model)
    return [s[0] for s in plan.steps()], plan


@pytest.mark.parametrize("per_node", [8, 64])
def test_plans_at_scale_switch_as_the_model_says(per_node):
    """[R, S(0)] -> [S(1), R] on a (64, 64) mesh: per-dim collectives for a small
    tensor, one direct exchange (fewer bytes) for a large one; the predicted times
    say which, and bytes first (no per-message cost) always took the exchange."""
    model = _comm.default_time_model()[:7] + (per_node,)
    flat = (0.0, model[3], 0.0, model[3], 0.0, 0.0, 0.0, per_node)  # bytes alone
    src, dst = (Replicate(), Shard(0)), (Shard(1), Replicate())
    small, plan_small = kinds((4096, 1), (64, 64), src, dst, model)
    large, plan_large = kinds((4096, 32768), (64, 64), src, dst, model)
    assert "direct" not in small and small[0] == "all_gather"
    assert large == ["direct"]
    assert kinds((4096, 1), (64, 64), src, dst, flat)[0] == ["direct"]
    # The chosen plan is the faster of the two under the model.
    direct_small = kinds((4096, 1), (64, 64), src, dst, flat)[1]
    assert plan_small.bytes > direct_small.bytes
    assert sum(s[6] for s in plan_large.steps()) == pytest.approx(plan_large.time)


# Local passes free, and dear (1 ns per byte copied or reduced, a memory bus shared
# by many ranks): the same shm and network costs otherwise.
FREE_LOCAL = _comm.default_time_model()[:5] + (0.0, 0.0, 0)
DEAR_LOCAL = _comm.default_time_model()[:5] + (1e-9, 1e-9, 0)


def steps_of(shape, src, dst, model):
    plan = _plan.Plan(shape, (2, 2), _codes(src), _codes(dst), "f8", model)
    return [(s[0], s[1]) for s in plan.steps()], plan


def test_local_passes_decide_direct_or_chain():
    """[S1, S0] -> [S2, R] of 8 x 64 x 64 on (2, 2): the direct exchange moves the
    fewest bytes, but its parts are strided on both sides, so MPI packs what each
    rank sends and unpacks what it receives. torch's chain gathers rows in place
    and exchanges half as much strided data. The model takes the exchange when
    local passes are free and the chain when they are dear; both within torch's
    bytes."""
    shape, src, dst = (8, 64, 64), (Shard(1), Shard(0)), (Shard(2), Replicate())
    free, plan_free = steps_of(shape, src, dst, FREE_LOCAL)
    dear, plan_dear = steps_of(shape, src, dst, DEAR_LOCAL)
    assert free == [("direct", -1)]
    assert dear == [("all_gather", 1), ("all_to_all", 0)]
    torch_bytes = torch_plan(shape, (2, 2), src, dst, 8)[1]
    assert plan_free.bytes < plan_dear.bytes <= torch_bytes
    # Each plan is the faster one under the model it was made for.
    assert plan_free.predict(FREE_LOCAL) < plan_dear.predict(FREE_LOCAL)
    assert plan_dear.predict(DEAR_LOCAL) < plan_free.predict(DEAR_LOCAL)


def test_local_passes_decide_where_to_reduce():
    """[S0, P] -> [S1, S0] of 64 x 64 on (2, 2): with free local passes an
    all-to-all and then a reduce-scatter; with dear ones the reduce-scatter first,
    on blocks of rows that need no packing, then one exchange, which also moves
    fewer bytes. Both within torch's bytes."""
    shape, src, dst = (64, 64), (Shard(0), Partial()), (Shard(1), Shard(0))
    free, plan_free = steps_of(shape, src, dst, FREE_LOCAL)
    dear, plan_dear = steps_of(shape, src, dst, DEAR_LOCAL)
    assert free == [("all_to_all", 0), ("reduce_scatter", 1)]
    assert dear == [("reduce_scatter", 1), ("direct", -1)]
    torch_bytes = torch_plan(shape, (2, 2), src, dst, 8)[1]
    assert plan_dear.bytes < plan_free.bytes <= torch_bytes
    assert plan_free.predict(FREE_LOCAL) < plan_dear.predict(FREE_LOCAL)
    assert plan_dear.predict(DEAR_LOCAL) < plan_free.predict(DEAR_LOCAL)
    # The steps carry what the model priced: the reduce-scatter's reduction.
    rs = next(s for s in plan_dear.steps() if s[0] == "reduce_scatter")
    assert rs[8] == 16 * 64 * 8  # one contribution of a 16 x 64 block
