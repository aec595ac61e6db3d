"""np.subtract.accumulate of integer DTensors by add's scan (``2 * x0`` less the
running sum, exact in wrapping arithmetic): NumPy's values and dtype on every rank
for every layout of the suite's meshes, uneven and empty axes included, with no
gather; float ones (whose running difference a regrouped sum does not round
alike) and divide.accumulate still answer through the fallback."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import CORNER_SHAPES, W, assert_matches, corner_layouts, make, mesh_of
from test_ops_unique import one_mesh_dim


@pytest.mark.parametrize("shape", CORNER_SHAPES + ((7,), (7, 5)), ids=str)
@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int64], ids=str)
def test_subtract_accumulate_of_integers_every_layout(shape, dtype):
    full = np.random.default_rng(len(shape)).integers(0, 200, shape).astype(dtype)
    for mesh, pls in corner_layouts(len(shape), partial=False):
        dt = make(full, mesh, pls)
        before = mpitensor.set_gather_warning(True)
        try:
            with warnings.catch_warnings(), mpitensor.strict():
                warnings.simplefilter("error" if one_mesh_dim(mesh, pls) else "ignore",
                                      UserWarning)
                for ax in range(len(shape)):
                    assert_matches(np.subtract.accumulate(dt, axis=ax),
                                   np.subtract.accumulate(full, axis=ax))
        finally:
            mpitensor.set_gather_warning(before)


def test_subtract_accumulate_moves_one_row_and_the_scan():
    full = np.arange(4000, dtype=np.int32) % 17
    dt = make(full, mesh_of((W,)), [Shard(0)])
    with CommDebugMode() as mode:
        got = np.subtract.accumulate(dt)
    assert_matches(got, np.subtract.accumulate(full))
    nbytes = mode.get_comm_bytes()
    assert sum(v for k, v in nbytes.items() if "gather" in k) <= 4 * W * W, nbytes
    if W > 1:
        assert got.placements == (Shard(0),)


def test_float_and_divide_accumulate_answer_through_the_fallback():
    full = np.linspace(1.0, 3.0, 11)
    dt = make(full, mesh_of((W,)), [Shard(0)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherWarning)
        assert_matches(np.subtract.accumulate(dt), np.subtract.accumulate(full))
        assert_matches(np.divide.accumulate(dt), np.divide.accumulate(full))
    with pytest.raises(TypeError), mpitensor.strict():
        np.subtract.accumulate(dt)
