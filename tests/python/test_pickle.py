"""Pickling DTensors (mpitensor._dtensor, mpitensor._shard): back onto an equal mesh as a
DTensor; where no equal mesh exists (a Jupyter client) as a DTensorShard, never an
exception; every rank's shards assembled into the global array without MPI; a
shard pickled again becomes the DTensor on its own rank; another rank's pickle is
refused."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard, init_device_mesh
from mpitensor.checkpoint import DTensorShard, assemble
from mpi_helpers import Problems, bits_equal, gather_global, raised

COMM = MPI.COMM_WORLD
N = COMM.Get_size()


def global_array(shape, dtype="float32"):
    return (np.arange(int(np.prod(shape))) * 7 / 4 - 3).astype(dtype).reshape(shape)


def check(p: Problems, dt, expect, what):
    got, problems = gather_global(dt)
    p.expect(problems == [] and bits_equal(got, expect), f"{what}: {problems}")


def test_round_trip_onto_an_equal_mesh():
    mesh = init_device_mesh("cpu", (N, 1), mesh_dim_names=("a", "b"))
    g = global_array((7, 3))
    dt = mt.distribute_tensor(g, mesh, [Shard(0), Replicate()])
    back = pickle.loads(pickle.dumps(dt))
    p = Problems()
    p.expect(isinstance(back, mt.DTensor) and back.device_mesh == mesh
             and back.placements == dt.placements, "spec")
    check(p, back, g, "unpickled")
    if N > 1:
        reducer, args = dt.__reduce__()
        wrong = (np.zeros((7, 3), np.float32),) + args[1:]
        p.expect(raised(lambda: reducer(*wrong), ValueError, "shard"), "another rank's array")
        other = args[:-1] + (((mesh.get_coordinate()[0] + 1) % N, 0),)
        p.expect(raised(lambda: reducer(*other), ValueError, "coordinate"),
                 "another rank's pickle of the same shape")
    assert p == []


def shards_of(dt, names=("elsewhere",)):
    """Every rank's DTensorShard of dt, as a process without dt's mesh unpickles
    them (the mesh dim names differ from every live mesh's)."""
    reducer, args = dt.__reduce__()
    mine = reducer(*args[:7], names * len(dt.placements), *args[8:])
    return COMM.allgather(mine)


@pytest.mark.parametrize("placements", [
    [Shard(0), Shard(1)], [Shard(1), Replicate()], [Replicate(), Shard(0)],
    [Partial(), Shard(1)], [Shard(0), Partial("max")], [Partial("avg"), Replicate()]])
def test_without_the_mesh_a_shard_that_assembles(placements):
    mesh = init_device_mesh("cpu", (N // 2, 2) if N % 2 == 0 else (N, 1))
    g = global_array((5, 6), "float64")
    dt = mt.distribute_tensor(g, mesh, [p if not isinstance(p, Partial) else Replicate()
                                        for p in placements])
    if any(isinstance(p, Partial) for p in placements):
        # Every rank's part equal to g: sum gives g times the partial dim's size.
        dt = mt.DTensor.from_local(dt.to_local(), mesh, placements, shape=g.shape,
                                   stride=dt.stride())
    shards = shards_of(dt)
    p = Problems()
    mine = shards[COMM.Get_rank()]
    p.expect(isinstance(mine, DTensorShard) and mine.rank == COMM.Get_rank()
             and mine.coordinate == tuple(mesh.get_coordinate())
             and mine.shape == g.shape and mine.dtype == g.dtype
             and mine.placements == tuple(placements), repr(mine))
    p.expect(mine.to_local() is not None and bits_equal(mine.to_local(), dt.to_local()),
             "local array")
    scale = 1
    for m, pl in enumerate(placements):
        if isinstance(pl, Partial) and pl.reduce_op == "sum":
            scale *= mesh.shape[m]
    got = assemble(reversed(shards))  # any order
    p.expect(np.array_equal(got, g * scale) and got.dtype == g.dtype, f"assemble: {got}")
    assert p == []


def test_a_shard_says_what_it_cannot_do():
    mesh = init_device_mesh("cpu", (N,))
    dt = mt.distribute_tensor(np.arange(8.0), mesh, [Shard(0)])
    shard = shards_of(dt)[COMM.Get_rank()]
    p = Problems()
    for use in (lambda: shard.full_tensor(), lambda: shard.redistribute(mesh, [Replicate()]),
                lambda: shard.device_mesh):
        p.expect(raised(use, AttributeError, "mpitensor.checkpoint.assemble"), "attribute")
    for use in (lambda: np.asarray(shard), lambda: shard + 1, lambda: np.sum(shard)):
        p.expect(raised(use, TypeError, "one rank's shard of a DTensor"), "numpy")
    p.expect(raised(lambda: shard.nonsense, AttributeError, "no attribute 'nonsense'"),
             "other attributes")
    p.expect("DTensorShard(rank=" in repr(shard), repr(shard))
    assert p == []


def test_a_shard_pickled_again_is_the_dtensor_where_its_mesh_exists():
    mesh = init_device_mesh("cpu", (N,), mesh_dim_names=("w",))
    g = global_array((2 * N + 1, 3))
    dt = mt.distribute_tensor(g, mesh, [Shard(0)])
    reducer, args = dt.__reduce__()
    shard = DTensorShard(*args)  # what a client holds
    back = pickle.loads(pickle.dumps(shard))  # the client pushes it back
    p = Problems()
    p.expect(isinstance(back, mt.DTensor) and back.device_mesh == mesh, type(back).__name__)
    check(p, back, g, "pushed back")
    assert p == []


def test_assemble_refuses_missing_and_mixed_shards():
    mesh = init_device_mesh("cpu", (N,))
    a = shards_of(mt.distribute_tensor(np.arange(8.0), mesh, [Shard(0)]))
    b = shards_of(mt.distribute_tensor(np.arange(9.0), mesh, [Shard(0)]))
    p = Problems()
    p.expect(raised(lambda: assemble([]), ValueError, "got none"), "none")
    if N > 1:
        p.expect(raised(lambda: assemble(a[:-1]), ValueError, "missing"), "missing")
        p.expect(raised(lambda: assemble(a[:1] + b[1:]), ValueError, "different"), "mixed")
    assert p == []
