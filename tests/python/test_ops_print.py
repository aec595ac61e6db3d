"""np.array2string, np.array_repr and np.array_str of DTensors (_print.py): NumPy's
string of the whole array on every rank, for short arrays and summarised ones
(where only the items shown move), Shard(0), Shard(1), Replicate and a 2-D mesh,
uneven shapes, print options and arguments."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, make, mesh_layouts, mesh_of

R, S0, S1 = Replicate(), Shard(0), Shard(1)
CALLS = [np.array2string, np.array_repr, np.array_str]


def moved(comm) -> int:
    return sum(comm.get_comm_bytes().values())


@pytest.mark.parametrize("layout", mesh_layouts((S0, S1), (S1, R)), ids=str)
@pytest.mark.parametrize("shape", [(3, 5), (40, 37), (7, 1300), (2 * W + 1, 0)])
def test_strings_equal_numpys(layout, shape):
    mesh = mesh_of(layout[0])
    rng = np.random.default_rng(sum(shape))
    full = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
    full[-1, -1:] = -12345.678  # a shown item that widens every column
    dt = make(full, mesh, list(layout[1]))
    for call in CALLS:
        with CommDebugMode() as comm:
            got = call(dt)
        assert got == call(full)
        if full.size > 1000 and W > 1:  # summarised: far less than the array moves
            assert moved(comm) < full.nbytes // 4
    with np.printoptions(precision=3, edgeitems=2, threshold=50, linewidth=60):
        for call in CALLS:
            assert call(dt) == call(full)
    assert np.array2string(dt, separator=";", threshold=20, edgeitems=1) == \
        np.array2string(full, separator=";", threshold=20, edgeitems=1)
    assert np.array_repr(dt, max_line_width=40, precision=2) == \
        np.array_repr(full, max_line_width=40, precision=2)


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.complex128, np.bool_])
def test_dtypes_and_1d(dtype):
    mesh = mesh_of((W,))
    full = (np.arange(3000) % 7 - 3).astype(dtype)
    dt = make(full, mesh, [S0])
    for call in CALLS:
        assert call(dt) == call(full)
    small = make(full[:5], mesh, [S0])
    for call in CALLS:
        assert call(small) == call(full[:5])
