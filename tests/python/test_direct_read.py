"""Direct copies between the processes of one node (csrc/comm/direct.c): large
all-to-all and direct steps move each part straight between the ranks' arrays,
pulled by its receiver or pushed by its sender; all-gathers always go through MPI.
Checked here: every rank agrees on whether a mesh copies directly (and none does
with MPITENSOR_DIRECT_READ=0 on any rank); results equal NumPy's and the MPI
path's, on even and uneven shards, 2-D and 3-D tensors, 1-D and 2-D meshes, with
short runs and all-gathers that stay on MPI; the direct path is really taken (a
copy made to fail is taken) and only there; a copy failing on one rank only sends
every rank of its group through MPI with the same result; and the communication
counted is the same either way.

Every verdict is gathered before it is asserted, so a failure on one rank never
leaves the others waiting."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import Replicate, Shard, distribute_tensor, init_device_mesh, _comm
from mpitensor.debug import CommDebugMode

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
R, S0, S1, S2 = Replicate(), Shard(0), Shard(1), Shard(2)

pytestmark = pytest.mark.skipif(W == 1, reason="a lone rank copies nothing between ranks")


FAULTY = 1


def make_mesh(shape, direct="1", on_ranks=None):
    """A mesh made with MPITENSOR_DIRECT_READ=`direct` on `on_ranks` (all: None)."""
    old = os.environ.get("MPITENSOR_DIRECT_READ")
    if on_ranks is None or RANK in on_ranks:
        os.environ["MPITENSOR_DIRECT_READ"] = direct
    try:
        return init_device_mesh("cpu", shape)
    finally:
        if old is None:
            os.environ.pop("MPITENSOR_DIRECT_READ", None)
        else:
            os.environ["MPITENSOR_DIRECT_READ"] = old


def everywhere(ok: bool) -> list:
    """Every rank's verdict, on every rank."""
    return COMM.allgather(bool(ok))


def test_every_rank_agrees_whether_the_mesh_copies_directly():
    on = make_mesh((W,))
    assert len(set(COMM.allgather(_comm.direct_read(on)))) == 1
    off = make_mesh((W,), direct="0")
    assert COMM.allgather(_comm.direct_read(off)) == [False] * W
    one_off = make_mesh((W,), direct="0", on_ranks={W - 1})
    assert COMM.allgather(_comm.direct_read(one_off)) == [False] * W


def _global(shape, dtype):
    return (np.arange(int(np.prod(shape))) % 1009).astype(dtype).reshape(shape)


# (mesh shape, global shape, src, dst, dtype, whether the direct path is taken).
# Sizes are 32 KiB per member on average or more, but for the (W * 4, 600) case,
# which stays on MPI for that alone; the (W * 4, W * 64) case stays on MPI as the
# (N, 8) cases do: they copy runs shorter than 4 KiB in the other process or 512
# bytes in their own. Inner all-gathers (S1 -> R) stay on MPI at every size.
# Copies of more than 512 runs take several system calls, whose batches end
# inside runs.
CASES = [
    ((W,), (W * 96 + 1, 700), [S0], [S1], np.float64, True),
    ((W,), (W * 96 + 1, 700), [S1], [S0], np.float64, True),
    ((W,), (W * 64, 1200), [S0], [S1], np.float32, True),
    ((W,), (W * 8 + 3, 20, 600), [S0], [S2], np.int64, True),
    ((W,), (W * 4, 40, 600), [S2], [S0], np.int64, True),
    ((W,), (W * 16, W * 128), [S0], [S1], np.float64, True),
    ((W,), (W * 1200, W * 128), [S0], [S1], np.float64, True),  # > 512 runs a copy
    ((W,), (900, W * 128 + 5), [S1], [R], np.float64, False),
    ((W,), (W * 4, 600), [S0], [S1], np.float64, False),
    ((W,), (W * 4, W * 64), [S0], [S1], np.float64, False),
    ((W,), (W * 40000, 8), [S0], [S1], np.float64, False),
    ((W,), (W * 20000, 8), [S1], [R], np.float64, False),
]
if W == 4:
    CASES += [
        ((2, 2), (200, 4000), [S0, S1], [S1, S0], np.float64, True),
        ((2, 2), (400, 1800), [R, S1], [R, R], np.float64, False),
        ((2, 2), (301, 1203), [S1, S0], [S0, R], np.float32, True),
    ]


def _run(mesh, shape, src, dst, dtype):
    full = _global(shape, dtype)
    dt = distribute_tensor(full, mesh, src)
    out = dt.redistribute(mesh, dst)
    return full, out.to_local().copy(), out.full_tensor()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[3]}")
def test_direct_copies_give_numpy_and_the_mpi_path_results(case):
    mesh_shape, shape, src, dst, dtype, taken = case
    direct, mpi = make_mesh(mesh_shape), make_mesh(mesh_shape, direct="0")
    full, local, whole = _run(direct, shape, src, dst, dtype)
    _, mpi_local, _ = _run(mpi, shape, src, dst, dtype)
    same = np.array_equal(whole, full) and np.array_equal(local, mpi_local)
    same &= local.dtype == dtype
    assert everywhere(same) == [True] * W


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}-{c[3]}")
def test_a_copy_failing_on_one_rank_sends_every_rank_through_mpi(case):
    """Rank 1 copies in every case (on the (2, 2) mesh, ranks 0 and 3 keep what
    they hold in the swap of dims), so its copy is the one made to fail."""
    mesh_shape, shape, src, dst, dtype, taken = case
    mesh = make_mesh(mesh_shape)
    if not all(COMM.allgather(_comm.direct_read(mesh))):
        pytest.skip("this machine does not let the ranks read each other's memory")
    full = _global(shape, dtype)
    dt = distribute_tensor(full, mesh, src)
    if RANK == FAULTY:
        _comm.direct_fail_next(1)
    out = dt.redistribute(mesh, dst)
    # The failure asked for was taken exactly where the direct path ran: the
    # proof that the cases meant to take it do, and the others stay on MPI.
    untaken = _comm.direct_fail_next(0) if RANK == FAULTY else 1 - int(taken)
    assert COMM.allgather(untaken == 1 - int(taken)) == [True] * W
    assert everywhere(np.array_equal(out.full_tensor(), full)) == [True] * W
    # The mesh still copies directly: one failed step went through MPI.
    assert COMM.allgather(_comm.direct_read(mesh)) == [True] * W


def test_the_communication_counted_is_the_same_either_way():
    counts = []
    for direct in ("1", "0"):
        mesh = make_mesh((W,), direct=direct)
        dt = distribute_tensor(_global((W * 96 + 1, 700), np.float64), mesh, [S0])
        with CommDebugMode() as mode:
            dt.redistribute(mesh, [S1])
            dt.redistribute(mesh, [S1]).redistribute(mesh, [R])
        counts.append(dict(mode.get_comm_counts()))
    assert counts[0] == counts[1]
