"""DTensor's methods are calls every rank makes, as NumPy's functions are: when one
rank passes another axis=, keepdims=, dtype= or ddof= to ``x.sum``, ``x.max``,
``x.mean``, ``x.astype``, ``x.cumsum``, ..., every rank raises the same ValueError
before anything moves, and the next collective pairs. The reductions that the C
base runs as methods are agreed before they take a path, so that a rank whose
call the executor takes and one whose call goes to the Python entry raise alike.
A method and NumPy's function are the same call (``x.sum(axis=0)`` on one rank,
``np.sum(x, axis=0)`` on another, agree). At one rank (and when the ranks agree)
the methods give NumPy's values."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor, init_device_mesh
from mpi_helpers import outcome

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
A = np.arange(1.0, 1.0 + 12.0 * N).reshape(4 * N, 3) / (2.0 * N)
ODD = N - 1

# (method, the good call's keywords, the odd rank's): the odd rank's differ in one
# argument, one the executor takes (axis, keepdims) or one it leaves to Python
# (dtype=, ddof=, an axis NumPy refuses).
CASES = [
    ("sum", {"axis": 0}, {"axis": 1}),
    ("sum", {"axis": 1}, {"axis": 1, "keepdims": True}),
    ("sum", {}, {"dtype": np.float32}),
    ("sum", {"axis": 0}, {"axis": 2}),
    ("mean", {"axis": 0}, {"axis": 0, "keepdims": True}),
    ("mean", {}, {"axis": None, "dtype": np.float32}),
    ("prod", {"axis": 1}, {"axis": 0}),
    ("max", {}, {"axis": 0}),
    ("max", {"axis": 1}, {"axis": 1, "keepdims": True}),
    ("min", {"axis": 0}, {"axis": (0, 1)}),
    ("std", {"axis": 0}, {"axis": 0, "ddof": 1}),
    ("var", {}, {"axis": 1}),
    ("argmax", {"axis": 0}, {"axis": 1}),
    ("argmin", {}, {"axis": 0}),
    ("all", {"axis": 0}, {"axis": 1}),
    ("any", {}, {"keepdims": True}),
    ("cumsum", {"axis": 0}, {"axis": 1}),
    ("cumprod", {"axis": 1}, {"axis": 0}),
    ("astype", {"dtype": np.float64}, {"dtype": np.float32}),
    ("round", {"decimals": 1}, {"decimals": 2}),
]
IDS = [f"{m}-{'-'.join(map(str, odd))}" for m, _, odd in CASES]


@pytest.fixture(scope="module")
def mesh():
    return init_device_mesh("cpu", (N,))


@pytest.fixture(scope="module", params=["S0", "S1", "R"])
def x(request, mesh):
    pl = {"S0": Shard(0), "S1": Shard(1), "R": Replicate()}[request.param]
    return distribute_tensor(A, mesh, [pl])


def still_in_step(mesh):
    """The next collective pairs on every rank and gives the right values."""
    b = A + 100.0
    got = distribute_tensor(b, mesh, [Shard(0)]).redistribute(mesh, [Replicate()])
    assert np.array_equal(got.to_local(), b)


def call(x, method, kwargs):
    a = x if method not in ("all", "any") else x > 1.0
    return getattr(a, method)(**kwargs)


@pytest.mark.parametrize("method, good, odd", CASES, ids=IDS)
def test_the_method_gives_numpys_value(x, method, good, odd):
    """Every rank makes the same call: NumPy's value, the odd call's too."""
    for kwargs in (good, odd):
        want = outcome(lambda: call(A, method, kwargs))
        if want is not None:  # NumPy refuses it: so does the method, everywhere
            got = outcome(lambda: call(x, method, kwargs))
            assert got is not None and COMM.allgather(got[0]) == [got[0]] * N
            continue
        got = call(x, method, kwargs)
        np.testing.assert_allclose(np.asarray(got.full_tensor()), call(A, method, kwargs),
                                   rtol=1e-6)
        assert got.dtype == call(A, method, kwargs).dtype


@pytest.mark.skipif(N < 2, reason="a rank that differs needs two of them")
@pytest.mark.parametrize("method, good, odd", CASES, ids=IDS)
def test_one_rank_passes_another_argument(mesh, x, method, good, odd):
    """The same ValueError on every rank, never a mixture or a hang."""
    got = outcome(lambda: call(x, method, odd if RANK == ODD else good))
    every = COMM.allgather(got)
    assert every[ODD] is not None, f"the odd rank raised nothing: {every}"
    assert every == [every[ODD]] * N, every
    assert every[ODD][0] == "ValueError" and "made different calls" in every[ODD][1], every
    still_in_step(mesh)


@pytest.mark.skipif(N < 2, reason="a rank that differs needs two of them")
def test_a_method_and_numpys_function_are_one_call(mesh, x):
    """``x.sum(axis=0)`` on one rank and ``np.sum(x, axis=0)`` on another agree;
    another axis in either form does not."""
    got = x.sum(axis=0) if RANK == ODD else np.sum(x, axis=0)
    np.testing.assert_allclose(got.full_tensor(), A.sum(axis=0))
    got = outcome(lambda: x.max(axis=1) if RANK == ODD else np.max(x, axis=0))
    every = COMM.allgather(got)
    assert every[0] is not None and every == [every[0]] * N, every
    still_in_step(mesh)


def test_only_a_programs_call_is_agreed(mesh, x):
    """The agreement runs for the call a program makes (on a mesh of more than one
    rank); a reduction method that mpitensor calls inside an operation is made
    alike on every rank by construction, and pays no agreement."""
    before = mesh._call_agreements
    x.sum(axis=0)
    assert mesh._call_agreements - before == (1 if N > 1 else 0)
    inside = {"__name__": "mpitensor._ops._inside", "x": x}
    exec("def run():\n    return x.sum(axis=0), x.max()\n", inside)
    got = inside["run"]()
    assert mesh._call_agreements - before == (1 if N > 1 else 0)
    np.testing.assert_allclose(got[0].full_tensor(), A.sum(axis=0))
