"""Redistributions that differ between ranks or fail on one rank only:
placements that one rank passes differently (with collective
checks at any size, by default from 16 MiB), uneven shards without shape=, and an
allocation that fails on one rank only. Every rank raises the same exception, with
the same message, and the job goes on: the next collectives pair up as before.
Meshes and distribute_tensor sources that differ between ranks are in
test_bad_input.py's RANK_DEPENDENT table. Runs at 1..4 ranks; the disagreements
need at least two."""

import contextlib
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard, init_device_mesh, _comm
from memory_cap import capped
from mpi_helpers import outcome, same_everywhere

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
LAST = RANK == N - 1
many = pytest.mark.skipif(N < 2, reason="a disagreement needs two ranks")


def still_in_step():
    """A new mesh and a collective on it after the failure pair up and give the data."""
    mesh = init_device_mesh("cpu", (N,))
    x = mt.distribute_tensor(np.arange(4.0 * N), mesh, [Shard(0)])
    assert np.array_equal(x.redistribute(mesh, [Replicate()]).to_local(), np.arange(4.0 * N))


@pytest.fixture
def checks():
    mt.debug.set_collective_checks(True)
    yield
    mt.debug.set_collective_checks(False)


# -- redistribute: placements, shapes -----------------------------------------------------

BIG = (2, 2**20)  # 16 MiB of float64: redistributes this large agree before they move


@many
@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", [
    pytest.param(lambda odd: [Replicate()] if odd else [Shard(1)], id="gather_or_all_to_all"),
    pytest.param(lambda odd: [Shard(1)] if odd else [Shard(0)], id="all_to_all_or_nothing"),
    pytest.param(lambda odd: [Replicate()] if odd else [Shard(0)], id="gather_or_nothing"),
])
@pytest.mark.parametrize("size", ["small", "large"])
def test_rank_dependent_placements_raise_everywhere(mesh, target, size):
    """An explicit redistribute agrees before it moves, whatever the size, also when
    one rank's move is a no-op (it used to return at once, leaving the others in
    their collective)."""
    x = mt.zeros(*((4 * N, 2) if size == "small" else BIG), device_mesh=mesh,
                 placements=[Shard(0)])
    got = same_everywhere(outcome(lambda: x.redistribute(mesh, target(LAST))))
    assert got is not None and got[0] == "ValueError", got
    assert "different placements" in got[1], got
    still_in_step()


@many
@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", [
    pytest.param(lambda odd: [Replicate()] if odd else [Shard(1)], id="gather_or_all_to_all"),
    pytest.param(lambda odd: [Replicate()] if odd else [Shard(0)], id="gather_or_nothing"),
])
def test_rank_dependent_placements_under_collective_checks_name_every_call(
        mesh, checks, target):
    """Under collective checks the checker compares the calls instead, and names
    each rank's."""
    x = mt.zeros(4 * N, 2, device_mesh=mesh, placements=[Shard(0)])
    got = same_everywhere(outcome(lambda: x.redistribute(mesh, target(LAST))))
    assert got is not None and got[0] == "RuntimeError", got
    assert got[1].startswith("collective mismatch"), got
    still_in_step()


@many
@pytest.mark.timeout(60)
def test_from_local_of_uneven_shards_without_shape_raises_everywhere(mesh):
    """Shards of 2**21 // N rows of 8 float64 (16 MiB in all), the last one row
    short, without shape=: each rank's global shape is its own shard times the mesh
    size, so the ranks disagree (it used to be MPI_ERR_TRUNCATE on one rank, garbage
    or a hang)."""
    rows = 2**21 // N
    local = np.zeros((rows - 1 if LAST else rows, 8))
    x = mt.DTensor.from_local(local, mesh, [Shard(0)])
    got = same_everywhere(outcome(lambda: x.redistribute(mesh, [Shard(1)])))
    assert got is not None and got[0] == "ValueError", got
    assert "shape= and stride=" in got[1], got
    # run_check=True finds it at any size.
    small = np.zeros((3 if LAST else 4, 2))
    got = same_everywhere(outcome(
        lambda: mt.DTensor.from_local(small, mesh, [Shard(0)], run_check=True)))
    assert got is not None and got[0] == "ValueError" and "shape= and stride=" in got[1]
    still_in_step()


# -- redistribute: an allocation that fails on one rank ------------------------------------

@contextlib.contextmanager
def rank0_capped(headroom: int):
    """Rank 0's address space capped at what it uses plus `headroom` bytes
    (memory_cap.capped), and the block pool emptied on every rank for the while (a
    block cached by an earlier test would stand in for the allocation that must
    fail)."""
    limit = _comm.pool_set_limit(0)
    try:
        with capped(headroom) if RANK == 0 else contextlib.nullcontext():
            yield
    finally:
        _comm.pool_set_limit(limit)


@many
@pytest.mark.timeout(60)
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_an_allocation_failing_on_one_rank_raises_memory_error_everywhere(mesh, async_op):
    """(1, 2**25) float64 Shard(1) -> Shard(0): rank 0 must allocate the whole 256
    MiB row, the others nothing. Rank 0's address space is capped just above what
    it uses, so only its allocation fails (it used to raise alone while the others
    waited in the all-to-all forever); every rank raises MemoryError, and after a
    `try`/`except` the job goes on."""
    x = mt.empty(1, 2**25, device_mesh=mesh, placements=[Shard(1)])
    with rank0_capped(64 * 2**20):
        got = outcome(lambda: x.redistribute(mesh, [Shard(0)], async_op=async_op).wait())
    got = same_everywhere(got)
    assert got == ("MemoryError", "redistribute: a rank of the mesh could not allocate "
                   f"its shard of {2**28} bytes"), got
    still_in_step()


@pytest.mark.world(4, reason="a plan of two collectives needs a (2, 2) mesh")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_an_intermediate_buffer_failing_on_one_rank_raises_memory_error_everywhere(async_op):
    """[Partial, Partial] -> [Replicate, Replicate] on a (2, 2) mesh is two
    all-reduces with a 64 MiB buffer between them. Rank 0's address space is capped
    so that its destination fits and that buffer does not: it used to fail between
    the two collectives while the others waited in the second one; now every rank
    raises MemoryError before the first, and the job goes on."""
    square = init_device_mesh("cpu", (2, 2))
    size = 2**11 * 2**12 * 8
    x = mt.DTensor.from_local(np.ones((2**11, 2**12)), square, [Partial(), Partial()],
                              run_check=False)
    with rank0_capped(size + 32 * 2**20):
        got = outcome(lambda: x.redistribute(square, [Replicate(), Replicate()],
                                             async_op=async_op).wait())
    got = same_everywhere(got)
    assert got == ("MemoryError", "redistribute: a rank of the mesh could not allocate "
                   "the buffers of the plan's intermediate steps"), got
    y = x.redistribute(square, [Replicate(), Replicate()])
    assert float(y.to_local()[0, 0]) == 4.0
    still_in_step()


@many
@pytest.mark.timeout(60)
def test_an_indexing_allocation_failing_on_one_rank_raises_memory_error_everywhere(mesh):
    """x[:, 1:] of a (1, 2**25) float64 Shard(1) tensor is Replicate: every rank
    allocates the 256 MiB row, and rank 0, capped, cannot."""
    x = mt.empty(1, 2**25, device_mesh=mesh, placements=[Shard(1)])
    with rank0_capped(64 * 2**20):
        got = outcome(lambda: x[:, 1:])
    got = same_everywhere(got)
    assert got == ("MemoryError", "indexing: a rank of the mesh could not allocate its "
                   f"shard of {(2**25 - 1) * 8} bytes"), got
    still_in_step()


@many
@pytest.mark.timeout(60)
def test_a_distribute_allocation_failing_on_one_rank_raises_memory_error_everywhere(mesh):
    """distribute_tensor of a (2**25,) float64 array as Shard(0): rank 0, capped,
    cannot allocate its shard; every rank raises MemoryError in the agreement the
    scatter starts with."""
    full = np.empty(2**25)
    with rank0_capped(16 * 2**20):
        got = outcome(lambda: mt.distribute_tensor(full, mesh, [Shard(0)]))
    got = same_everywhere(got)
    assert got == ("MemoryError", "distribute_tensor: a rank of the mesh could not "
                   f"allocate its shard of {-(-2**25 // N) * 8} bytes"), got
    still_in_step()


# -- floating-point errors under np.errstate ----------------------------------------------

def _one_rank_holds(value, mesh):
    """A Shard(0) tensor of ones, two a rank, whose last two elements (the last
    rank's shard) are ``value``; and its NumPy array."""
    full = np.ones(2 * N)
    full[-2:] = value
    return mt.distribute_tensor(full, mesh, [Shard(0)]), full


FP_ERRORS = [
    pytest.param(0.0, {"divide": "raise"}, lambda x: 1.0 / x, id="operator"),
    pytest.param(0.0, {"divide": "raise"}, np.log, id="ufunc"),
    pytest.param(-1.0, {"invalid": "raise"}, np.sqrt, id="invalid"),
    pytest.param(1e308, {"over": "raise"}, lambda x: x.sum(), id="reduction_method"),
    pytest.param(1e308, {"over": "raise"}, lambda x: x * 10.0, id="overflow"),
]


@many
@pytest.mark.timeout(60)
@pytest.mark.parametrize("value, state, op", FP_ERRORS)
def test_a_floating_point_error_on_one_rank_raises_everywhere(mesh, value, state, op):
    """Under np.errstate(...="raise") NumPy raises for the whole array. The
    offending elements lie on the last rank alone: every rank raises NumPy's
    FloatingPointError, with its message, and the job goes on."""
    x, full = _one_rank_holds(value, mesh)
    with np.errstate(**state):
        got = same_everywhere(outcome(lambda: op(x)))
        want = outcome(lambda: op(full))
    assert want is not None and want[0] == "FloatingPointError", want
    assert got == want, (got, want)
    still_in_step()


@many
@pytest.mark.timeout(60)
@pytest.mark.parametrize("value, category, op, words", [
    pytest.param(0.0, "divide", lambda x: 1.0 / x, "divide by zero", id="operator"),
    pytest.param(1e200, "over", np.var, "overflow", id="python_entry"),
])
def test_an_errstate_callback_that_raises_on_one_rank_raises_everywhere(
        mesh, value, category, op, words):
    """np.seterrcall's function runs where the error is, on one rank: what it
    raises is raised on every rank, by the operator's agreement or, for a function
    written in Python, once the call returns."""
    x, _ = _one_rank_holds(value, mesh)

    def seen(kind, flag):
        raise ValueError(f"{kind} seen")

    old = np.seterrcall(seen)
    try:
        with np.errstate(**{category: "call"}):
            got = same_everywhere(outcome(lambda: op(x)))
    finally:
        np.seterrcall(old)
    assert got == ("ValueError", f"{words} seen"), got
    still_in_step()


PYTHON_ENTRIES = [
    pytest.param(lambda x: np.var(x), id="var"),
    pytest.param(lambda x: x.reshape(-1, 2).var(axis=0), id="var_method"),
    pytest.param(lambda x: np.linalg.norm(x), id="norm"),
    pytest.param(lambda x: np.cumsum(x * 1e108), id="cumsum"),
    pytest.param(lambda x: np.nanstd(x), id="nanstd"),
    pytest.param(lambda x: np.outer(x, x), id="outer"),
]


@many
@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", PYTHON_ENTRIES)
def test_a_floating_point_error_inside_a_python_entry_raises_everywhere(mesh, op):
    """Functions written in Python compute between collectives: the rank whose
    elements overflow records the error and goes on, so that the others are not
    left in the next collective, and every rank raises a FloatingPointError once
    the call returns, as NumPy raises for the whole array."""
    x, full = _one_rank_holds(1e200, mesh)
    with np.errstate(over="raise"):
        got = same_everywhere(outcome(lambda: op(x)))
        want = outcome(lambda: op(full))
    assert want is not None and want[0] == "FloatingPointError", want
    assert got is not None and got[0] == "FloatingPointError", got
    assert got[1].startswith("overflow encountered in"), got
    still_in_step()


@many
@pytest.mark.timeout(60)
def test_error_states_that_differ_by_rank_raise_everywhere(mesh):
    """Rank 0 alone raises on floating-point errors, so it alone agrees on its
    result; the others go on to the program's next call, whose agreement meets
    rank 0's: every rank raises the same ValueError naming the error states, and
    the job goes on."""
    x, _ = _one_rank_holds(0.0, mesh)

    def program():
        if RANK == 0:
            with np.errstate(divide="raise"):
                y = 1.0 / x
        else:
            with np.errstate(divide="ignore"):
                y = 1.0 / x
        return np.sum(y)

    got = same_everywhere(outcome(program))
    assert got[0] == "ValueError" and "different NumPy error states" in got[1], got
    still_in_step()


def test_the_default_error_state_gives_numpys_values_and_warnings(mesh):
    """Without "raise", the rank that holds the zeros warns, as NumPy does, the
    others stay quiet, and the values are NumPy's: nothing is agreed or raised."""
    x, full = _one_rank_holds(0.0, mesh)
    with np.errstate(divide="warn"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = (1.0 / x).full_tensor()
    warned = [w for w in caught if "divide by zero" in str(w.message)]
    assert len(warned) == (1 if LAST else 0), [str(w.message) for w in caught]
    with np.errstate(divide="ignore"):
        assert np.array_equal(out, 1.0 / full)
