"""``np.packbits`` and ``np.unpackbits`` of DTensors (_bits.py): NumPy's value on
every rank along a whole axis and along a cut one, for Shard(0), Shard(1),
Replicate and a 2-D mesh, uneven shapes where a rank holds no rows; local (nothing
sent) where the blocks fall on multiples of eight; NumPy's exception types."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, make, mesh_layouts, mesh_of

S0, S1 = Shard(0), Shard(1)
COMM = MPI.COMM_WORLD


@pytest.mark.parametrize("layout", mesh_layouts((S0, S1), (S1, S1)), ids=str)
@pytest.mark.parametrize("shape", [(3, 13), (16 * W, 2)])
def test_pack_and_unpack_match_numpy(layout, shape):
    mesh = mesh_of(layout[0])
    full = np.random.default_rng(shape[0]).integers(0, 2, shape).astype(bool)
    a = make(full, mesh, layout[1])
    with mt.strict():
        for axis in (0, 1, None, -1):
            for order in ("big", "little"):
                want = np.packbits(full, axis=axis, bitorder=order)
                got = np.packbits(a, axis=axis, bitorder=order)
                assert_matches(got, want)
                for count in (None, 5, -3):
                    assert_matches(np.unpackbits(got, axis=axis, count=count, bitorder=order),
                                   np.unpackbits(want, axis=axis, count=count, bitorder=order))


def test_aligned_blocks_move_nothing():
    mesh = mesh_of((W,))
    full = np.random.default_rng(3).integers(0, 256, (16 * W, 3)).astype(np.uint8)
    a = make(full, mesh, [S0])
    with mt.strict(), CommDebugMode() as comm:
        packed = np.packbits(a, axis=0)
        bits = np.unpackbits(a, axis=0)
        across = np.packbits(a, axis=1)
    assert COMM.allreduce(sum(comm.get_comm_bytes().values())) == 0
    assert packed.placements == bits.placements == across.placements == (S0,)
    assert_matches(packed, np.packbits(full, axis=0))
    assert_matches(bits, np.unpackbits(full, axis=0))
    assert_matches(across, np.packbits(full, axis=1))


def test_bad_arguments_raise_as_numpy():
    mesh = mesh_of((W,))
    f = make(np.ones(4), mesh, [S0])
    i = make(np.ones(4, np.int64), mesh, [S0])
    with pytest.raises(TypeError):
        np.packbits(f)
    with pytest.raises(TypeError):
        np.unpackbits(i)
    with pytest.raises(ValueError):
        np.packbits(i, bitorder="middle")
    with pytest.raises(np.exceptions.AxisError):
        np.packbits(i, axis=1)
    with pytest.raises(ValueError):
        np.unpackbits(make(np.ones(1, np.uint8), mesh, [S0]), count=-9)
