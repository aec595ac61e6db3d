"""Rows picked by an integer DTensor (_pick.py): ``dt[idx]`` and ``np.take(dt, idx,
axis, mode)``, as ``a[np.argsort(a)]`` makes them. NumPy's value on every rank for
every layout of the array and of the indices (Partial ones included), uneven
shapes and empty blocks, on 1-D and 2-D meshes; the result is laid out as the
indices; the array itself is never gathered (the bytes sent stay below it);
out-of-bounds indices are an IndexError on every rank; the gradient of ``dt[idx]``
adds each picked row back where it came from."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, make, mesh_of, mesh_shapes

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")
COMM = MPI.COMM_WORLD


def index_layouts(ndim):
    options = [R, PS] + [Shard(d) for d in range(ndim)]
    return [(shape, pls) for shape in mesh_shapes()
            for pls in itertools.product(options, repeat=len(shape))]


@pytest.mark.parametrize("rows", [0, 1, 5, 3 * W + 2])
@pytest.mark.parametrize("layout", index_layouts(1), ids=str)
def test_sorting_by_argsort_equals_numpys(rows, layout):
    mesh_shape, pls = layout
    mesh = mesh_of(mesh_shape)
    full = np.random.default_rng(rows).standard_normal(rows)
    a = make(full, mesh, tuple(S0 if p.is_partial() else p for p in pls))
    order = np.argsort(full, kind="stable")
    idx = make(order, mesh, pls)
    with mt.strict():
        got, taken = a[idx], np.take(a, idx)
    assert_matches(got, full[order])
    assert_matches(taken, full[order])
    assert got.placements == tuple(R if p.is_partial() else p for p in pls)


@pytest.mark.parametrize("a_layout", index_layouts(2), ids=str)
def test_every_layout_of_a_matrix_and_its_indices(a_layout):
    mesh_shape, pls = a_layout
    mesh = mesh_of(mesh_shape)
    full = np.arange(7 * 3, dtype=np.float64).reshape(7, 3) - 4
    a = make(full, mesh, pls)
    keys = np.array([[6, -1, 0], [3, 3, -7]])
    for ipls in ((R,) * len(mesh_shape), (S0,) * len(mesh_shape),
                 (S1,) + (R,) * (len(mesh_shape) - 1)):
        idx = make(keys, mesh, ipls)
        with mt.strict():
            assert_matches(a[idx], full[keys])
            assert_matches(np.take(a, idx, axis=0), np.take(full, keys, axis=0))
            for mode in ("wrap", "clip"):
                assert_matches(np.take(a, idx, axis=1, mode=mode),
                               np.take(full, keys, axis=1, mode=mode))
            assert_matches(np.take(a, idx, axis=None, mode="wrap"),
                           np.take(full, keys, axis=None, mode="wrap"))


def test_rows_move_to_the_indices_not_the_array():
    mesh = mesh_of((W,))
    n = 64 * W
    full = np.arange(n * 8, dtype=np.float64).reshape(n, 8)
    a = make(full, mesh, [S0])
    keys = np.random.default_rng(1).integers(0, n, 16 * W)
    idx = make(keys, mesh, [S0])
    with CommDebugMode() as comm:
        got = a[idx]
    assert_matches(got, full[keys])
    assert got.placements == (S0,)
    sent = COMM.allreduce(sum(comm.get_comm_bytes().values()))
    # every rank asks for its 16 rows (indices out, rows back), whatever their owner
    assert sent <= W * 16 * (8 * 8 + 8) + 64 * W
    # a sharded other dim stays where it is: only the indices move
    b = make(full, mesh, [S1])
    with CommDebugMode() as comm:
        got = np.take(b, idx, axis=0)
    assert got.placements == (S1,)
    assert_matches(got, full[keys])
    assert COMM.allreduce(sum(comm.get_comm_bytes().values())) <= keys.nbytes * W


def test_out_of_bounds_raises_on_every_rank():
    mesh = mesh_of((W,))
    a = make(np.arange(5.0), mesh, [S0])
    # the bad index sits on the last rank's block only
    idx = make(np.array([0, 1, 2, 3, 9]), mesh, [S0])
    with pytest.raises(IndexError, match="out of bounds"):
        a[idx]
    with pytest.raises(IndexError, match="out of bounds"):
        np.take(a, idx)
    with pytest.raises(IndexError):
        np.take(make(np.zeros((0,)), mesh, [S0]), idx)
    with pytest.raises(IndexError):
        a[make(np.array([0.5, 1.0]), mesh, [S0])]
    with pytest.raises(ValueError, match="clipmode"):
        np.take(a, idx, mode="bad")
    assert_matches(a[make(np.array([4, 0]), mesh, [S0])], np.array([4.0, 0.0]))


def test_gradient_adds_rows_back_where_they_came_from():
    mesh = mesh_of((W,))
    full = np.arange(12.0).reshape(6, 2)
    keys = np.array([5, 0, 5, 2, -1])
    a = make(full, mesh, [S0])
    a.requires_grad_(True)
    loss = (a[make(keys, mesh, [S0])] * 2.0).sum()
    loss.backward()
    want = np.zeros_like(full)
    np.add.at(want, keys, 2.0)
    assert_matches(a.grad, want)


@pytest.mark.parametrize("n", [1, 7, 64])
def test_indices_in_their_own_block_move_nothing(n):
    """A flat take of a row-sharded prediction by its labels (scikit-learn's
    multinomial loss): every rank's indices fall in its own block, so no row and no
    index moves; one index elsewhere brings back the exchange."""
    mesh = mesh_of((W,))
    k = 3
    full = np.arange(n * k, dtype=np.float64)
    labels = np.random.default_rng(n).integers(0, k, n)
    flat = np.arange(n) * k + labels
    a = make(full.reshape(n, k), mesh, [S0]).reshape(-1)
    idx = make(flat, mesh, [S0])
    with CommDebugMode() as comm:
        got = np.take(a, idx)
    assert_matches(got, full[flat])
    aligned = COMM.allreduce(a.to_local().size == k * idx.to_local().size, op=MPI.LAND)
    if W > 1 and aligned:
        assert "all_to_all_single" not in comm.get_comm_counts(), comm.get_comm_counts()
    moved = flat.copy()
    moved[0] = n * k - 1  # a row of the last block, asked for by the first
    idx = make(moved, mesh, [S0])
    assert_matches(np.take(a, idx), full[moved])
