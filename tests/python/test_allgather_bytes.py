"""allgather_bytes: every member's bytes along a mesh dim, in coordinate order, of
any lengths (none, under a word, several calls of 64 words), through the extension
and not counted as the program's communication. Runs at 1..4 ranks."""

import pytest
from mpi4py import MPI

from mpitensor import init_device_mesh
from mpitensor._allgather_bytes import allgather_bytes
from mpitensor.debug import CommDebugMode

RANK, N = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def message(rank: int) -> bytes:
    """0, 7 and 1300 bytes (three calls of 64 words), in turn by rank."""
    return bytes((rank + i) % 256 for i in range((0, 7, 1300)[rank % 3]))


def test_every_rank_gets_every_message_in_order(mesh):
    with CommDebugMode() as mode:
        got = allgather_bytes(mesh, 0, message(RANK))
    assert got == [message(r) for r in range(N)]
    assert mode.get_total_counts() == 0


@pytest.mark.world(4, reason="a 2 x 2 mesh")
@pytest.mark.parametrize("dim", [0, 1])
def test_along_one_dim_of_a_2d_mesh(dim):
    mesh = init_device_mesh("cpu", (2, 2))
    coord = mesh.get_coordinate()
    line = [[k, coord[1]] if dim == 0 else [coord[0], k] for k in range(2)]
    got = allgather_bytes(mesh, dim, message(RANK))
    assert got == [message(2 * a + b) for a, b in line]
