"""Writes in place by index or mask (_scatter.py): ``np.put_along_axis``,
``np.putmask`` and ``ufunc.at`` with a DTensor index. NumPy's value on every rank
for Shard(0), Shard(1), Replicate and 2-D meshes, uneven shapes where a rank holds
no rows; the target keeps its placements and is never gathered (strict mode, and
the bytes moved stay below the target's); NumPy's exception types for bad
arguments; a target that requires grad is refused in grad mode (as every write in
place is) rather than losing its gradient."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, make, mesh_of, mesh_shapes

R, S0, S1 = Replicate(), Shard(0), Shard(1)
COMM = MPI.COMM_WORLD


def layouts():
    out = [((W,), (p,)) for p in (R, S0, S1)]
    if W == 4:
        out += [((2, 2), (S0, S1)), ((2, 2), (S1, S0)), ((2, 2), (R, S0))]
    return out


def sent_bytes(comm):
    return COMM.allreduce(sum(comm.get_comm_bytes().values()))


@pytest.mark.parametrize("layout", layouts(), ids=str)
@pytest.mark.parametrize("axis", [0, 1])
def test_put_along_axis_matches_numpy(layout, axis):
    mesh = mesh_of(layout[0])
    full = np.arange(3 * 5, dtype=np.float64).reshape(3, 5)
    rng = np.random.default_rng(axis)
    other = full.shape[1 - axis]
    ishape = (4, other) if axis == 0 else (other, 4)
    keys = rng.integers(-full.shape[axis], full.shape[axis], ishape)
    vals = -rng.random(ishape)
    for ipls in (layout[1], (R,) * len(layout[0])):
        want = full.copy()
        np.put_along_axis(want, keys, vals, axis)
        a = make(full, mesh, layout[1])
        with mt.strict():
            np.put_along_axis(a, make(keys, mesh, ipls), make(vals, mesh, ipls), axis)
        assert a.placements == layout[1]
        assert_matches(a, want)
        # plain indices and a scalar: each rank writes its own block
        want = full.copy()
        np.put_along_axis(want, keys, 7.0, axis)
        a = make(full, mesh, layout[1])
        with mt.strict(), CommDebugMode() as comm:
            np.put_along_axis(a, keys, 7.0, axis)
        assert sent_bytes(comm) == 0
        assert_matches(a, want)


def test_put_along_axis_routes_writes_not_the_array():
    mesh = mesh_of((W,))
    full = np.zeros((2, 40 * W))
    keys = np.tile(np.arange(40 * W - 1, -1, -8), (2, 1))
    want = full.copy()
    np.put_along_axis(want, keys, 1.0, 1)
    a = make(full, mesh, [S1])
    with mt.strict(), CommDebugMode() as comm:
        np.put_along_axis(a, make(keys, mesh, [S1]), 1.0, axis=1)
    assert_matches(a, want)
    assert sent_bytes(comm) < full.nbytes


def test_put_along_axis_uneven_and_errors():
    mesh = mesh_of((W,))
    full = np.arange(3.0).reshape(1, 3)  # W > 1: some rank holds no rows
    a = make(full, mesh, [S0])
    np.put_along_axis(a, make(np.array([[2, 0]]), mesh, [S1]), 9.0, axis=1)
    assert_matches(a, np.array([[9.0, 1.0, 9.0]]))
    with pytest.raises(IndexError):
        np.put_along_axis(a, make(np.array([[3]]), mesh, [S0]), 0.0, axis=1)
    with pytest.raises(IndexError):
        np.put_along_axis(a, np.array([[3]]), 0.0, axis=1)
    with pytest.raises(IndexError):
        np.put_along_axis(a, np.array([[0.5]]), 0.0, axis=1)
    with pytest.raises(ValueError):
        np.put_along_axis(a, np.array([0]), 0.0, axis=1)
    with pytest.raises(np.exceptions.AxisError):
        np.put_along_axis(a, np.array([[0]]), 0.0, axis=2)
    # axis=None: flat positions, as NumPy writes them
    b = make(np.arange(6.0).reshape(2, 3), mesh, [S1])
    with mt.strict():
        np.put_along_axis(b, np.array([4, 0, -1]), [7.0, 8.0, 9.0], axis=None)
    assert_matches(b, np.array([[8.0, 1.0, 2.0], [3.0, 7.0, 9.0]]))
    with pytest.raises(IndexError):
        np.put_along_axis(b, np.array([6]), 0.0, axis=None)
    with pytest.raises(ValueError):
        np.put_along_axis(b, np.array([[0]]), 0.0, axis=None)


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_putmask_matches_numpy(layout):
    mesh = mesh_of(layout[0])
    full = np.arange(5 * 3, dtype=np.int64).reshape(5, 3) - 6
    for values in ([100, 200, 300, 400], -1, full * 10):
        want = full.copy()
        np.putmask(want, want % 3 == 0, values)
        for plain_mask in (True, False):
            a = make(full, mesh, layout[1])
            mask = (a % 3 == 0) if not plain_mask else (full % 3 == 0)
            v = make(values, mesh, (R,) * len(layout[0])) if np.ndim(values) == 2 else values
            with mt.strict():
                np.putmask(a, mask, v)
            assert a.placements == layout[1]
            assert_matches(a, want)


def test_putmask_moves_nothing_with_plain_arguments_and_raises_as_numpy():
    mesh = mesh_of((W,))
    full = np.arange(7.0)
    a = make(full, mesh, [S0])
    with mt.strict(), CommDebugMode() as comm:
        np.putmask(a, full > 2, [1.0, 2.0])
    assert sent_bytes(comm) == 0
    want = full.copy()
    np.putmask(want, full > 2, [1.0, 2.0])
    assert_matches(a, want)
    with pytest.raises(ValueError):
        np.putmask(a, np.ones(3, bool), 0.0)
    with pytest.raises(ValueError):
        np.putmask(a, make(np.ones(3, bool), mesh, [S0]), 0.0)
    scalar = make(np.array(5.0), mesh, [R])
    np.putmask(scalar, True, [3.0])
    assert_matches(scalar, np.array(3.0))


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_ufunc_at_with_a_dtensor_index_matches_numpy(layout):
    mesh = mesh_of(layout[0])
    full = np.arange(6 * 3, dtype=np.float64).reshape(6, 3)
    keys = np.array([5, 0, 5, -1, 2, 0, 0])
    vals = np.arange(7 * 3, dtype=np.float64).reshape(7, 3) / 4
    for ipls in ((S0,) * len(layout[0]), (R,) * len(layout[0])):
        cases = [(np.add, make(vals, mesh, ipls)), (np.add, vals), (np.multiply, 2.0),
                 (np.negative, None), (np.maximum, vals[0])]
        for ufunc, b in cases:
            want = full.copy()
            plain_b = b.full_tensor() if type(b) is mt.DTensor else b
            args = () if b is None else (b,)
            ufunc.at(want, keys, *(() if b is None else (plain_b,)))
            a = make(full, mesh, layout[1])
            with mt.strict():
                ufunc.at(a, make(keys, mesh, ipls), *args)
            assert a.placements == layout[1]
            assert_matches(a, want)


def test_ufunc_at_sends_updates_not_the_array_and_raises_as_numpy():
    mesh = mesh_of((W,))
    n = 32 * W
    full = np.zeros((n, 4))
    keys = np.random.default_rng(2).integers(0, n, 4 * W)
    want = full.copy()
    np.add.at(want, keys, 1.0)
    a = make(full, mesh, [S0])
    with mt.strict(), CommDebugMode() as comm:
        np.add.at(a, make(keys, mesh, [S0]), 1.0)
    assert_matches(a, want)
    assert sent_bytes(comm) < full.nbytes
    small = make(np.zeros(2, np.int64), mesh, [S0])  # some rank holds no rows
    with pytest.raises(IndexError):
        np.add.at(small, make(np.array([0, 2]), mesh, [S0]), 1)
    np.add.at(small, make(np.array([1, 1, -2]), mesh, [S0]), 1)
    assert_matches(small, np.array([1, 2]))


def test_writes_refuse_a_target_that_requires_grad():
    mesh = mesh_of((W,))
    a = make(np.arange(4.0).reshape(2, 2), mesh, [S0]).requires_grad_(True)
    idx = make(np.array([[0, 1]]), mesh, [R])
    with pytest.raises(RuntimeError, match="grad"):
        np.put_along_axis(a, idx, 0.0, axis=0)
    with pytest.raises(RuntimeError, match="grad"):
        np.putmask(a, np.ones((2, 2), bool), 0.0)
    with pytest.raises(RuntimeError, match="grad"):
        np.add.at(a, make(np.array([0]), mesh, [R]), 1.0)
    for write in (lambda: np.add.at(a, [0], 1.0), lambda: np.put(a, [0], 1.0),
                  lambda: np.place(a, np.ones((2, 2), bool), [1.0]),
                  lambda: np.fill_diagonal(a, 1.0)):
        with pytest.raises(RuntimeError, match="grad"):
            write()
    with mt.no_grad():
        np.putmask(a, np.ones((2, 2), bool), 0.0)
    assert_matches(a.detach(), np.zeros((2, 2)))


def test_a_writer_missing_from_autograds_table_is_still_refused(monkeypatch):
    # The executor refuses a function with no backward that answers None in grad
    # mode: a writer someone forgets to list among autograd's writes is caught.
    monkeypatch.delitem(mt._registry.backwards, np.putmask)
    mesh = mesh_of((W,))
    a = make(np.arange(4.0).reshape(2, 2), mesh, [S0]).requires_grad_(True)
    with pytest.raises(RuntimeError, match="numpy.putmask.*grad"):
        np.putmask(a, np.ones((2, 2), bool), 0.0)
