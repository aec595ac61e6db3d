"""Plans for meshes over several nodes: every move planned for simulated nodes (the
time model's ranks_per_node, whatever this machine's MPI finds) leaves each rank
exactly the local array NumPy gives, and no plan moves more bytes between nodes,
nor in all, than torch's per-mesh-dim steps, on meshes of up to 16,384 ranks.

The plans are made by _plan.Plan under a model with the simulated node size and run
(_plan.run: mt_redistribute) on a mesh of this job's ranks: the steps say where the nodes
are (an ALLREDUCE_NODES step carries its run of members per node), so the same
plan runs on one machine as on a cluster.
"""

import itertools
import random

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard, _comm, _plan
from mpitensor._layout import _codes
from mpi_helpers import Problems
from redistribute_ref import (PLACEMENTS, expected_local, mixed_partials, name,
                              source_local, targets_for)

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
BUILTIN = _comm.default_time_model()[:7]
# A network a thousand times slower per byte than shared memory, its messages as
# cheap: reductions across nodes go within nodes first wherever a plan can.
SLOW_NET = BUILTIN[:2] + (BUILTIN[0], 1000 * BUILTIN[1]) + BUILTIN[4:7]


def meshes():
    """(4,) and (2, 2) at 4 ranks; the whole job in one and two dims otherwise."""
    return [(4,), (2, 2)] if W == 4 else [(W,), (1, W), (W, 1)]


def node_sizes():
    """Simulated nodes that split the job: one rank each, and halves (at 2 and 3
    ranks the same nodes of one rank, planned once)."""
    return sorted({k for k in (1, W // 2) if 1 <= k < W and W % k == 0}) if W > 1 else []


def pairs(mesh_shape):
    """Every (src, dst) of R, S0, S1, P(sum|max|avg) sources on each mesh dim."""
    per_dim = [(s, d) for s in PLACEMENTS for d in targets_for(s)]
    out = []
    for combo in itertools.product(per_dim, repeat=len(mesh_shape)):
        src, dst = tuple(c[0] for c in combo), tuple(c[1] for c in combo)
        if not mixed_partials(src):
            out.append((src, dst))
    return out


@pytest.mark.parametrize("mesh_shape", meshes(), ids=str)
def test_every_move_on_simulated_nodes_gives_numpys_result(mesh_shape):
    """Every placement transition, planned for nodes of 1 rank and of half the job
    under the built-in model and under a slow network, runs to the local array
    NumPy's reduction and slicing of the global array give, exactly; at 4 ranks
    the (4,) mesh's all-reduces run split within the nodes."""
    if not node_sizes():
        pytest.skip("one rank: no node to split the mesh")
    mesh = mt.init_device_mesh("cpu", mesh_shape)
    coord = mesh.get_coordinate()
    problems, kinds = Problems(), set()
    for shape in [(6, 10), (64, 33)]:
        base = (np.arange(int(np.prod(shape)), dtype=np.int64) % 89 + 1).reshape(shape)
        for k, costs in itertools.product(node_sizes(), (BUILTIN, SLOW_NET)):
            model = costs + (k,)
            for src, dst in pairs(mesh_shape):
                plan = _plan.Plan(shape, mesh_shape, _codes(src), _codes(dst), "f8", model)
                kinds.update(s[0] for s in plan.steps())
                local = source_local(base, mesh_shape, coord, src, np.float64)
                got = _plan.run(mesh, plan, local)
                want = expected_local(base, mesh_shape, coord, src, dst, np.float64)
                problems.expect(got.shape == want.shape and np.array_equal(got, want),
                                f"{name(src)}->{name(dst)} {shape} nodes of {k}: "
                                f"{[s[0] for s in plan.steps()]}: {got} != {want}")
    every = COMM.allgather(problems)
    if W == 4 and mesh_shape == (4,):
        assert "all_reduce_nodes" in kinds, kinds
    assert all(p == [] for p in every), next(p for p in every if p)[:5]


def test_a_raw_run_takes_only_this_ranks_box():
    """_plan.run refuses a local array that is not this rank's box of the plan's
    source, on every rank, before any communication; a plan without steps gives
    the local array back."""
    mesh = mt.init_device_mesh("cpu", (W,))
    plan = _plan.Plan((2 * W, 3), (W,), _codes([Shard(0)]), _codes([Replicate()]), "f8")
    if plan.nsteps:  # one rank holds the whole tensor: nothing to move
        with pytest.raises(ValueError, match=r"the local array of shape \(3, 3\) is not "
                           r"this rank's shard \(2 dims\)"):
            _plan.run(mesh, plan, np.zeros((3, 3)))
    got = _plan.run(mesh, plan, np.full((2, 3), float(mesh.get_coordinate()[0])))
    assert np.array_equal(got, np.repeat(np.arange(W, dtype=float), 2)[:, None] * np.ones(3))
    same = _plan.Plan((2 * W, 3), (W,), _codes([Shard(0)]), _codes([Shard(0)]), "f8")
    local = np.ones((2, 3))
    assert same.nsteps == 0 and _plan.run(mesh, same, local) is local


# Meshes on paper, with the node sizes that split them; pure planning, no MPI.
PAPER = [((4,), (1, 2)), ((2, 2), (1, 2)), ((16, 16), (4, 64)), ((64,), (8,)),
         ((8, 16), (16, 32)), ((2, 4, 8), (4, 16)), ((128, 128), (64, 128)),
         ((16384,), (64, 128)), ((8, 16, 128), (64, 128))]


def paper_cases(mesh_shape, count, seed):
    """`count` random moves of R, S0, S1, P on `mesh_shape` (targets without P)."""
    rng = random.Random(seed)
    opts = [Replicate(), Shard(0), Shard(1), Partial()]
    out = []
    while len(out) < count:
        src = tuple(rng.choice(opts) for _ in mesh_shape)
        dst = tuple(rng.choice(opts[:3]) for _ in mesh_shape)
        if src != dst:
            out.append((src, dst))
    return out


@pytest.mark.parametrize("mesh_shape, per_node", PAPER, ids=str)
def test_never_more_between_nodes_than_torch(mesh_shape, per_node):
    """No plan moves more bytes between nodes than torch's per-mesh-dim steps,
    priced the same way, nor more in all, for meshes of 4 to 16,384 ranks on nodes
    of 1 to 128 ranks, under the built-in model, a network as fast as shared
    memory and bytes alone; and the plan's bytes between nodes are its steps'."""
    models = [BUILTIN, BUILTIN[:2] + BUILTIN[:2] + BUILTIN[4:7],
              (0.0, BUILTIN[1], 0.0, BUILTIN[3], 0.0, 0.0, 0.0)]
    numel = int(np.prod(mesh_shape))
    problems = Problems()
    for k in per_node:
        for i, (src, dst) in enumerate(paper_cases(mesh_shape, 12 if numel > 4096 else 40, k)):
            shape = [(4096, 1024), (37, 5), (1 << 16, 3)][i % 3]
            model = models[i % 3] + (k,)
            plan = _plan.Plan(shape, mesh_shape, _codes(src), _codes(dst), "f8", model)
            t_bytes, t_net = plan.torch_bytes()
            what = f"{mesh_shape} nodes of {k} {shape} {name(src)}->{name(dst)}"
            problems.expect(plan.net_bytes <= t_net,
                            f"{what}: {plan.net_bytes} bytes between nodes > torch's {t_net}")
            problems.expect(plan.bytes <= t_bytes, f"{what}: {plan.bytes} > torch's {t_bytes}")
            problems.expect(plan.net_bytes == sum(s[9] for s in plan.steps()), what)
    assert problems == []


def test_a_runner_gives_new_arrays_and_checks_each_call():
    """_plan.runner works out the boxes once: every call returns a new array of the
    plan's target, and a call with a local array of another shape is refused on
    every rank, before any communication, as run refuses it."""
    mesh = mt.init_device_mesh("cpu", (W,))
    plan = _plan.Plan((2 * W, 3), (W,), _codes([Shard(0)]), _codes([Replicate()]), "f8")
    me = float(mesh.get_coordinate()[0])
    go = _plan.runner(mesh, plan, np.zeros((2, 3)))
    first, second = go(np.full((2, 3), me)), go(np.full((2, 3), me + 1))
    want = np.repeat(np.arange(W, dtype=float), 2)[:, None] * np.ones(3)
    assert first is not second
    assert np.array_equal(first, want) and np.array_equal(second, want + 1)
    if plan.nsteps:
        with pytest.raises(ValueError, match=r"the local array of shape \(3, 3\)"):
            go(np.zeros((3, 3)))
