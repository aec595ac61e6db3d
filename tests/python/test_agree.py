"""The agreement primitive, _comm.agree: a check that fails on one rank only raises
the same exception, with the same message, on every rank of the mesh, and the job
goes on (the next collectives pair up as before). Every test runs at 1..4 ranks;
the forced failures need at least two."""

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DeviceMesh, Replicate, Shard, init_device_mesh, _comm
from mpitensor._fingerprint import fingerprint
from mpi_helpers import outcome, same_everywhere

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
many = pytest.mark.skipif(N < 2, reason="a failure on some ranks needs two of them")


def still_in_step(mesh):
    """A collective after the failure pairs up: a redistribute gives the data."""
    x = mt.distribute_tensor(np.arange(4.0 * N), mesh, [Shard(0)])
    assert np.array_equal(x.redistribute(mesh, [Replicate()]).to_local(), np.arange(4.0 * N))
    _comm.agree(mesh, True, 1, "")


def test_all_agree(mesh):
    assert same_everywhere(outcome(lambda: _comm.agree(mesh, True, 5, "x"))) is None
    # Any int is a fingerprint, taken mod 2**64: Python's negative hashes too.
    assert _comm.agree(mesh, True, hash("shape") - 2**70, "") is None


@many
@pytest.mark.parametrize("failing", ["first", "last", "middle"])
@pytest.mark.parametrize("error", [ValueError, MemoryError, TypeError, OSError,
                                   IndexError, OverflowError, NotImplementedError,
                                   RuntimeError, KeyError])
def test_one_rank_fails(mesh, failing, error):
    bad = {"first": 0, "last": N - 1, "middle": N // 2}[failing]
    ok = RANK != bad
    got = same_everywhere(outcome(lambda: _comm.agree(
        mesh, ok, 7, f"rank {RANK} could not go on", error)))
    # KeyError has no status of its own: it travels as the RuntimeError it maps to.
    name = "RuntimeError" if error is KeyError else error.__name__
    assert got == (name, f"rank {bad} could not go on")
    still_in_step(mesh)


@many
def test_first_failing_rank_wins(mesh):
    ok = RANK == 0
    err = MemoryError if RANK == 1 else TypeError
    got = same_everywhere(outcome(lambda: _comm.agree(mesh, ok, RANK, f"r{RANK}", err)))
    assert got == ("MemoryError", "r1")
    still_in_step(mesh)


@many
def test_fingerprints_differ(mesh):
    msg = f"the ranks passed different shapes (rank {RANK})"
    got = same_everywhere(outcome(lambda: _comm.agree(mesh, True, RANK % 2, msg)))
    assert got == ("ValueError", "the ranks passed different shapes (rank 0)")
    got = same_everywhere(outcome(lambda: _comm.agree(mesh, True, RANK * 2**40, "")))
    assert got[0] == "ValueError" and "fingerprints differ" in got[1]
    still_in_step(mesh)


@many
def test_load_or_start_fresh(mesh, tmp_path_factory):
    """The resume pattern: one rank cannot allocate, every rank takes the fallback."""
    def load():
        buf = None if RANK == N - 1 else np.empty(8)
        _comm.agree(mesh, buf is not None, 0, f"rank {RANK}: no memory", MemoryError)
        return buf

    try:
        load()
        resumed = True
    except MemoryError:
        resumed = False
    assert COMM.allgather(resumed) == [False] * N
    still_in_step(mesh)


def test_slices_agree_apart():
    """Each row of a (2, N/2) mesh agrees on its own: a failure in row 0 stays there."""
    if N % 2:
        pytest.skip("needs an even number of ranks")
    grid = init_device_mesh("cpu", (2, N // 2), mesh_dim_names=("r", "c"))
    row = grid["c"]
    in_row0 = RANK < N // 2
    fail = RANK == N // 2 - 1
    got = outcome(lambda: _comm.agree(row, not fail, 3, f"rank {RANK}", OSError))
    assert got == (("OSError", f"rank {N // 2 - 1}") if in_row0 else None)
    same_everywhere(outcome(lambda: _comm.agree(grid, True, 3, "")))


def test_outsiders_take_no_part():
    mesh = DeviceMesh("cpu", [0])
    assert _comm.agree(mesh, True, RANK, "") is None
    # A non-member only ever raises its own failure; the member, alone, its own.
    got = outcome(lambda: _comm.agree(mesh, RANK != 0, 0, f"rank {RANK}"))
    assert got == (("ValueError", "rank 0") if RANK == 0 else None)


def test_bad_arguments(mesh):
    with pytest.raises(TypeError):
        _comm.agree(mesh, True, 1)
    with pytest.raises(TypeError):
        _comm.agree(mesh, True, 1, b"bytes")
    with pytest.raises(TypeError):
        _comm.agree(mesh, False, 1, "x", "not a class")
    with pytest.raises(TypeError):
        _comm.agree("not a mesh", True, 1, "x")


def test_long_message_is_cut_at_a_character(mesh):
    text = "é" * 400  # 800 bytes of UTF-8: cut, but never inside a character
    got = same_everywhere(outcome(lambda: _comm.agree(mesh, RANK != 0, 0, text)))
    assert got[0] == "ValueError" and set(got[1]) == {"é"} and 200 <= len(got[1]) < 400


def test_fingerprint_is_the_same_in_every_process_and_fits_int64(mesh):
    """Python's str hash is salted per process; the fingerprint must not be, or
    ranks that agree would be told they differ. It also lands in int64 records."""
    value = ("<f4", (2, 3), "Shard(dim=0)")
    fp = fingerprint(value)
    assert -(1 << 63) <= fp < 1 << 63
    assert COMM.allgather(fp) == [fp] * N
    assert fingerprint((2, 3)) != fingerprint((3, 2))
    np.array([fp], dtype=np.int64)  # raises OverflowError if it does not fit
    _comm.agree(mesh, True, fp, "")
