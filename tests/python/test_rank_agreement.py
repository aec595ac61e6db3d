"""Arguments that differ between ranks (issue 16 items 2 and 8): meshes, placements,
shapes and dtypes that one rank passes differently, and allocations that fail on
one rank only. Every rank raises the same exception, with the same message, and
the job goes on: the next collectives pair up as before. Runs at 1..4 ranks; the
disagreements need at least two."""

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DeviceMesh, Replicate, Shard, init_device_mesh

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
LAST = RANK == N - 1
many = pytest.mark.skipif(N < 2, reason="a disagreement needs two ranks")


def outcome(call):
    """(exception type name, message) of call(), or None when it returned."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - compared across ranks below
        return type(e).__name__, str(e)
    return None


def same_everywhere(got):
    """Every rank's outcome, gathered; asserts they are all equal."""
    every = COMM.allgather(got)
    assert all(o == every[0] for o in every), every
    return every[0]


def still_in_step():
    """A new mesh and a collective on it after the failure pair up and give the data."""
    mesh = init_device_mesh("cpu", (N,))
    x = mt.distribute_tensor(np.arange(4.0 * N), mesh, [Shard(0)])
    assert np.array_equal(x.redistribute(mesh, [Replicate()]).to_local(), np.arange(4.0 * N))


# -- meshes ----------------------------------------------------------------------------

@many
@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [
    pytest.param(lambda odd: init_device_mesh("cpu", (N,) if odd else (1, N)), id="shape"),
    pytest.param(lambda odd: DeviceMesh("cpu", list(range(N))[::-1] if odd else list(range(N))),
                 id="rank_list"),
    pytest.param(lambda odd: DeviceMesh("cpu", [0] if odd else list(range(N))),
                 id="rank_count"),
    pytest.param(lambda odd: init_device_mesh("cpu", (N,), mesh_dim_names=("b" if odd else "a",)),
                 id="dim_names"),
    pytest.param(lambda odd: init_device_mesh("cpu", (N,),
                                              mesh_dim_names=("a",) if odd else None),
                 id="dim_names_on_one_rank"),
])
def test_a_mesh_that_differs_on_one_rank_raises_everywhere(make):
    got = same_everywhere(outcome(lambda: make(LAST)))
    assert got is not None and got[0] == "ValueError", got
    assert "different meshes" in got[1] or "same arguments" in got[1], got
    still_in_step()


def test_equal_meshes_are_made_as_before():
    mesh = init_device_mesh("cpu", (1, N), mesh_dim_names=("a", "b"))
    assert mesh.shape == (1, N) and mesh["b"].size() == N
    still_in_step()
