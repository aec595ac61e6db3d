"""Indexing with a key that differs on one rank: every key form (int, slice,
``...``, None, a boolean mask, an integer array, and mixes of them), read and
written, on Shard and Replicate dims. The last rank uses another key than the
others. Every rank must then raise the same exception type, or, where NumPy reads
the two keys alike (``-n`` and ``0``, ``:2`` and ``0:2``), every rank gets NumPy's
value; never elements nobody wrote, never a hang (the test's timeout), and the
next collective pairs. At one rank no key can differ: every key is checked
against NumPy there.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.debug import set_collective_checks
from mpi_helpers import gather_global

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
ODD = N - 1
ROWS = 4 * N
A = np.arange(ROWS * 3, dtype=np.float64).reshape(ROWS, 3)
S = slice

# (id, the others' key, the odd rank's key). Keys are made per call: lists and
# masks are fresh objects on every rank.
KEYS = [
    ("int", lambda: 0, lambda: 1),
    ("int_equivalent", lambda: 0, lambda: -ROWS),
    ("int_out_of_bounds", lambda: 0, lambda: ROWS + 5),
    ("int_of_a_numpy_type", lambda: 2, lambda: np.int64(2)),
    ("slice", lambda: S(0, 2), lambda: S(0, 3)),
    ("slice_equivalent", lambda: S(0, 2), lambda: S(None, 2, 1)),
    ("slice_step", lambda: S(1, None), lambda: S(None, None, 2)),
    ("slice_negative_step", lambda: S(None, None, -1), lambda: S(None, None, -2)),
    ("slice_empty", lambda: S(0, 0), lambda: S(0, 2)),
    ("slice_whole_or_cut", lambda: S(None), lambda: S(0, 2)),
    ("slice_of_columns", lambda: (S(None), S(0, 2)), lambda: (S(None), S(1, 3))),
    ("ellipsis", lambda: (Ellipsis, 0), lambda: (Ellipsis, 1)),
    ("ellipsis_moved", lambda: (Ellipsis, 0), lambda: (0, Ellipsis)),
    ("two_ellipses", lambda: (Ellipsis, 0), lambda: (Ellipsis, Ellipsis)),
    ("none", lambda: (None, S(0, 2)), lambda: (S(0, 2),)),
    ("none_after", lambda: (S(0, 2), None), lambda: (S(0, 2), S(None), None)),
    ("int_or_slice", lambda: 0, lambda: S(0, 1)),
    ("too_many_indices", lambda: (0, 0), lambda: (0, 0, 0)),
    ("not_an_index", lambda: 0, lambda: "a"),
    ("a_float", lambda: 0, lambda: 1.5),
    ("mask", lambda: A > 3, lambda: A > 5),
    ("mask_of_rows", lambda: A[:, 0] > 3, lambda: A[:, 0] > 6),
    ("mask_or_slice", lambda: A > 3, lambda: S(0, 2)),
    ("mask_wrong_shape", lambda: A > 3, lambda: np.ones(ROWS + 1, bool)),
    ("int_array", lambda: [0, 1], lambda: [1, 0]),
    ("int_array_ndarray", lambda: np.array([0, 2]), lambda: np.array([0, 3])),
    ("int_array_out_of_bounds", lambda: [0, 1], lambda: [0, ROWS + 1]),
    ("int_array_or_slice", lambda: [0, 1], lambda: S(0, 2)),
    ("mixed", lambda: (S(None), [1, 0]), lambda: (S(None), [0, 1])),
    ("mixed_int_and_slice", lambda: (S(0, 2), 1), lambda: (S(0, 2), 0)),
    ("mixed_none_and_array", lambda: (None, [0, 1], S(None)),
     lambda: ([0, 1], None, S(None))),
    ("two_arrays", lambda: ([0, 1], [0, 1]), lambda: ([0, 1], [1, 0])),
]


def layouts():
    out = [((N,), [Shard(0)]), ((N,), [Shard(1)]), ((N,), [Replicate()])]
    if N % 2 == 0:
        out += [((2, N // 2), [Shard(0), Shard(1)]), ((2, N // 2), [Replicate(), Shard(0)])]
    return out


LAYOUTS = layouts()
_meshes: dict = {}


def mesh_of(shape):
    if shape not in _meshes:
        _meshes[shape] = init_device_mesh("cpu", shape)
    return _meshes[shape]


def numpy_outcome(call):
    """NumPy's value of call(), or the type of what it raised."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "value", call()
    except Exception as e:  # noqa: BLE001 - the type is compared
        return "error", type(e).__name__


def expected(read, good, odd, value=7.0):
    """What every rank must see: ("value", NumPy's array) when NumPy's answers for
    the two keys are alike, else "error" (the same exception type everywhere)."""
    outs = []
    for key in (good, odd):
        if read:
            outs.append(numpy_outcome(lambda k=key: A[k]))
        else:
            b = A.copy()
            outs.append(numpy_outcome(lambda k=key, b=b: (b.__setitem__(k, value), b)[1]))
    (k0, v0), (k1, v1) = outs
    if N == 1:  # only the odd key runs
        return k1, v1 if k1 == "value" else None
    if k0 == k1 == "value" and np.shape(v0) == np.shape(v1) and np.array_equal(v0, v1):
        return "value", v0
    return "error", None


def run(read, x, key, value):
    """(outcome, the global result or the written array) on this rank."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mt.GatherWarning)
            if read:
                got = x[key]
            else:
                x[key] = value
                got = x
        return None, got
    except Exception as e:  # noqa: BLE001 - compared across ranks
        return type(e).__name__, None


def check_case(read, shape, placements, good, odd, value=7.0, odd_value=None, warm=False):
    mesh = mesh_of(shape)
    x = distribute_tensor(A.copy(), mesh, placements)
    if warm:
        x[good()]  # every rank alike: the mesh keeps the key's plan
    key = odd() if RANK == ODD else good()
    mine = odd_value if RANK == ODD and odd_value is not None else value
    want, wanted = expected(read, good(), odd(), value)
    if odd_value is not None and odd_value != value:
        want = "error"
    err, got = run(read, x, key, mine)
    every = COMM.allgather(err)
    if want == "error" or any(every):
        assert all(e is not None for e in every) and len(set(every)) == 1, every
    if every[0] is None:
        # gathered with replicas compared byte for byte: no element nobody wrote
        full, problems = gather_global(got)
        assert problems == [], problems
        assert full.shape == wanted.shape and np.array_equal(full, wanted), (full, wanted)
    # the next collective pairs
    y = distribute_tensor(A + 1.0, mesh, placements).redistribute(mesh, [Replicate()] * len(shape))
    assert np.array_equal(y.to_local(), A + 1.0)


PARAMS = [pytest.param(s, p, g, o, id=f"{'x'.join(map(str, s))}-{p}-{name}")
          for s, p in LAYOUTS for name, g, o in KEYS]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape, placements, good, odd", PARAMS)
def test_a_read_whose_key_differs_on_one_rank(shape, placements, good, odd):
    check_case(True, shape, placements, good, odd)


# The keys whose plan the mesh keeps (ints, slices, None and ...) for the others.
KEPT = [p for p in PARAMS if mt._C.index_key(p.values[2]()) is not None]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape, placements, good, odd", KEPT)
def test_a_read_whose_key_the_others_read_before_differs_on_one_rank(
        shape, placements, good, odd):
    """The others read their key once before, so that C makes their view from the
    plan the mesh keeps (``_C.basic_view``); the odd rank's key still raises on
    every rank, or gives NumPy's value where NumPy reads both keys alike."""
    check_case(True, shape, placements, good, odd, warm=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape, placements, good, odd", PARAMS)
def test_a_write_whose_key_differs_on_one_rank(shape, placements, good, odd):
    check_case(False, shape, placements, good, odd)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape, placements", LAYOUTS, ids=str)
@pytest.mark.parametrize("key", [lambda: 0, lambda: S(0, 2), lambda: A > 3],
                         ids=["int", "slice", "mask"])
def test_a_write_whose_value_differs_on_one_rank(shape, placements, key):
    """A Replicate element written with another value on one rank would leave the
    replicas different: the same error on every rank (at one rank, NumPy's value)."""
    check_case(False, shape, placements, key, key, 7.0, 8.0 if N > 1 else None)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape, placements, good, odd", KEPT)
def test_a_write_whose_key_the_others_read_before_differs_on_one_rank(
        shape, placements, good, odd):
    """The others read their key once before, so that C writes the number through
    the plan the mesh keeps (``_C.basic_write``) while the odd rank's key takes the
    Python path: the two paths agree alike, so the odd key still raises on every
    rank, or gives NumPy's value where NumPy reads both keys alike."""
    check_case(False, shape, placements, good, odd, warm=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape, placements", LAYOUTS, ids=str)
@pytest.mark.parametrize("key", [lambda: 0, lambda: S(0, 2), lambda: (S(None), 1)],
                         ids=["int", "slice", "column"])
def test_a_write_whose_value_differs_on_one_rank_through_a_kept_plan(shape, placements, key):
    """The same through the plan every rank keeps, written in C: the same error on
    every rank (at one rank, NumPy's value)."""
    check_case(False, shape, placements, key, key, 7.0, 8.0 if N > 1 else None, warm=True)


def test_a_replicated_read_by_the_rank_is_refused_everywhere():
    """``x[rank]`` of a Replicate DTensor: each rank would hold another row in a
    result that says every rank holds the same one."""
    if N == 1:
        pytest.skip("one rank: no key can differ")
    x = distribute_tensor(A, mesh_of((N,)), [Replicate()])
    every = COMM.allgather(run(True, x, RANK, None)[0])
    assert every == ["ValueError"] * N, every
    assert np.array_equal(x[1].to_local(), A[1])


@pytest.mark.timeout(60)
def test_under_the_collective_checks_the_checker_compares_the_key():
    """With the collective checks on, the checker compares each index in the
    agreement's stead: a key that differs on one rank, on a Replicate dim where no
    collective runs, is its RuntimeError naming the index, on every rank."""
    if N == 1:
        pytest.skip("one rank: no key can differ")
    x = distribute_tensor(A, mesh_of((N,)), [Replicate()])
    set_collective_checks(True)
    try:
        read = COMM.allgather(run(True, x, 1 if RANK == ODD else 0, None)[0])
        write = COMM.allgather(run(False, x, 1 if RANK == ODD else 0, 5.0)[0])
    finally:
        set_collective_checks(False)
    assert read == ["RuntimeError"] * N and write == ["RuntimeError"] * N, (read, write)
    assert np.array_equal(x[2].to_local(), A[2])
