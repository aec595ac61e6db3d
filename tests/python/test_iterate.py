"""Iterating a DTensor (mpitensor._iterate): rows along dim 0 as DTensors of the
row's shape, their placements following torch's unbind(0); at most one collective
for the whole iteration, none when dim 0 is not sharded."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from mpi_helpers import Problems

W = MPI.COMM_WORLD.Get_size()
MESH2 = (W // 2, 2) if W % 2 == 0 else (W, 1)


@pytest.mark.parametrize("placements, rows", [
    ([Shard(0), Shard(1)], [Replicate(), Shard(0)]),
    ([Shard(1), Replicate()], [Shard(0), Replicate()]),
    ([Replicate(), Shard(-1)], [Replicate(), Shard(1)]),
    ([Shard(2), Shard(0)], [Shard(1), Replicate()]),
    ([Replicate(), Replicate()], [Replicate(), Replicate()])])
def test_rows_of_a_dtensor(placements, rows):
    mesh = mt.init_device_mesh("cpu", MESH2)
    g = np.arange(5 * 3 * 4, dtype=np.float64).reshape(5, 3, 4)
    x = mt.distribute_tensor(g, mesh, placements)
    with CommDebugMode() as comm:
        got = list(x)
    p = Problems()
    p.expect(len(got) == 5 and all(isinstance(r, mt.DTensor) for r in got), "five DTensors")
    sharded_rows = any(isinstance(pl, Shard) and pl.dim == 0 and n > 1
                       for pl, n in zip(placements, MESH2))
    p.expect(comm.get_total_counts() == (1 if sharded_rows else 0),
             f"{comm.get_total_counts()} collectives")
    p.expect(all(r.placements == tuple(rows) and r.shape == (3, 4) for r in got),
             f"{[r.placements for r in got]}")
    for i, r in enumerate(got):
        p.expect(np.array_equal(r.full_tensor(), g[i]), f"row {i}")
    assert p == []


def test_partial_rows_stay_partial():
    mesh = mt.init_device_mesh("cpu", (W,))
    x = mt.DTensor.from_local(np.ones((2, 3)), mesh, [Partial()])
    rows = list(x)
    assert [r.placements for r in rows] == [(Partial(),)] * 2
    assert np.array_equal(rows[1].full_tensor(), np.full(3, float(W)))


def test_a_0d_dtensor_is_not_iterable():
    mesh = mt.init_device_mesh("cpu", (W,))
    with pytest.raises(TypeError, match="0-d"):
        iter(mt.distribute_tensor(np.array(3.0), mesh, [Replicate()]))


@pytest.mark.parametrize("shape", [(48,), (4, 12)], ids=["strided-rows", "strided-inner"])
def test_rows_of_a_strided_dtensor(shape):
    """A reshape that merges a sharded dim into the one before is strided: its rows
    are gathered where the strided dim is dim 0, keep the split factor where it
    is inner, and hold NumPy's rows either way."""
    mesh = mt.init_device_mesh("cpu", (W,))
    full = np.arange(48.0).reshape(2, 4, 6)
    x = mt.distribute_tensor(full, mesh, [Shard(2)])
    y = np.reshape(x, (8, 6)) if len(shape) == 1 else np.reshape(x, (2, 24))
    y = np.reshape(y, shape) if len(shape) == 1 else y
    want = full.reshape(shape if len(shape) == 1 else (2, 24))
    assert any(type(p) is mt.placement_types._StridedShard for p in y.placements)
    rows = list(y)
    assert len(rows) == want.shape[0]
    for i, r in enumerate(rows):
        assert np.array_equal(r.full_tensor(), want[i]), i
