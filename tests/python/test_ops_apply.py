"""``np.apply_along_axis`` of DTensors (_apply.py): NumPy's value on every rank
for Shard(0), Shard(1), Replicate and a 2-D mesh, uneven shapes where a rank holds
no rows, functions giving a scalar, a vector or a matrix per row; the function sees
1-D NumPy arrays, as NumPy's loop passes them; the array moves only where ``axis``
is cut, and then its cut moves to another dim; NumPy's exceptions, on every rank; in grad mode a NotImplementedError
(the function runs on NumPy arrays, so no gradient could flow)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, make, mesh_layouts, mesh_of

R, S0, S1 = Replicate(), Shard(0), Shard(1)
COMM = MPI.COMM_WORLD


def refuse(row):
    raise TypeError("not this row")


def ends(row, scale=1.0):
    assert type(row) is np.ndarray and row.ndim == 1
    return (row[0] + row[-1]) * scale


@pytest.mark.parametrize("layout", mesh_layouts((S0, S1), (S1, S0)), ids=str)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_apply_along_axis_matches_numpy(layout, axis):
    mesh = mesh_of(layout[0])
    full = np.random.default_rng(1).standard_normal((3, 5, 2))
    a = make(full, mesh, layout[1])
    with mt.strict():
        for func, args, kwargs in ((ends, (), {"scale": 0.5}), (np.sort, (), {}),
                                   (np.outer, (np.arange(2.0),), {}),
                                   (lambda r: (r > 0).sum(), (), {})):
            assert_matches(np.apply_along_axis(func, axis, a, *args, **kwargs),
                           np.apply_along_axis(func, axis, full, *args, **kwargs))


def test_rows_stay_where_they_are():
    mesh = mesh_of((W,))
    full = np.arange(8.0 * W * 16).reshape(8 * W, 16)
    a = make(full, mesh, [S0])
    with mt.strict(), CommDebugMode() as comm:
        got = np.apply_along_axis(np.cumsum, 1, a)
    assert got.placements == (S0,)
    assert COMM.allreduce(sum(comm.get_comm_bytes().values())) < full.nbytes
    assert_matches(got, np.apply_along_axis(np.cumsum, 1, full))
    # a cut axis: the cut moves to the other dim (an all-to-all), not a gather
    b = make(full, mesh, [S1])
    with mt.strict(), CommDebugMode() as comm:
        got = np.apply_along_axis(np.sum, 1, b)
    assert got.placements == ((S0,) if W > 1 else (R,))  # one rank: nothing to move
    assert COMM.allreduce(sum(comm.get_comm_bytes().values())) <= full.nbytes
    assert_matches(got, full.sum(axis=1))


def test_errors_are_numpys_on_every_rank():
    mesh = mesh_of((W,))
    a = make(np.arange(6.0).reshape(3, 2), mesh, [S0])
    with pytest.raises(ValueError):
        np.apply_along_axis(np.sum, 1, make(np.zeros((0, 2)), mesh, [S0]))
    with pytest.raises(np.exceptions.AxisError):
        np.apply_along_axis(np.sum, 2, a)
    # rows after the first give another shape: NumPy's broadcast error
    with pytest.raises(ValueError):
        np.apply_along_axis(lambda r: np.arange(int(r[0]) % 4 + 1), 1, a)
    with pytest.raises(TypeError):
        np.apply_along_axis(refuse, 1, a)


def test_grad_mode_refuses_rather_than_losing_the_gradient():
    mesh = mesh_of((W,))
    a = make(np.arange(6.0).reshape(3, 2), mesh, [S0]).requires_grad_(True)
    with pytest.raises(NotImplementedError):
        np.apply_along_axis(np.sum, 1, a)
    with mt.no_grad():
        assert_matches(np.apply_along_axis(np.sum, 1, a), np.array([1.0, 5.0, 9.0]))
