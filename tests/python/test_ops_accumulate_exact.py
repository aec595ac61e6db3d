"""np.subtract.accumulate of integer DTensors by add's scan (``2 * x0`` less the
running sum, exact in wrapping arithmetic): NumPy's values and dtype on every rank
for every layout of the suite's meshes, uneven and empty axes included, with no
gather; float ones (whose running difference a regrouped sum does not round
alike) and divide.accumulate fold along the ranks (_fold.py), arctan2's still
answers through the fallback. add.at and
subtract.at update a Partial target's parts in place where that is exact."""

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


def test_float_accumulates_fold_and_arctan2_answers_through_the_fallback():
    """A float running difference or quotient folds along the ranks, NumPy's bits
    without a gather; arctan2's, which NumPy rounds by call shape, gathers."""
    full = np.linspace(1.0, 3.0, 11)
    dt = make(full, mesh_of((W,)), [Shard(0)])
    with mpitensor.strict():
        for ufunc in (np.subtract, np.divide):
            got = ufunc.accumulate(dt).full_tensor()
            np.testing.assert_array_equal(got, ufunc.accumulate(full))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherWarning)
        assert_matches(np.arctan2.accumulate(dt), np.arctan2.accumulate(full))
    with pytest.raises(TypeError), mpitensor.strict():
        np.arctan2.accumulate(dt)


@pytest.mark.parametrize("ufunc", [np.add, np.subtract], ids=lambda u: u.__name__)
def test_at_of_a_partial_target_updates_the_parts_in_place(ufunc):
    """add.at and subtract.at keep an integer Partial(sum) target (the update made
    on one rank of the sum) and a Partial(max) one (every part shifted alike)."""
    from mpitensor import DTensor, Partial, Replicate
    idx, vals = [0, 3, 3, 5], np.array([4, -2, 7, 1])
    full = np.arange(12, dtype=np.int32).reshape(6, 2)
    for mesh, pls in corner_layouts(2):
        if not any(p.is_partial() for p in pls):
            continue
        dt = make(full, mesh, pls)
        want = full.copy()
        ufunc.at(want, idx, vals[:, None])
        with CommDebugMode() as mode, mpitensor.strict():
            ufunc.at(dt, idx, vals[:, None])
        assert mode.get_total_counts() == 0
        assert dt.placements == pls
        assert_matches(dt, want)
    mesh = mesh_of((W,))
    coord = mesh.get_coordinate()[0]
    real = np.linspace(-1.0, 1.0, 8)
    # Parts whose max is ``real``: rank 0 holds it, the others hold less.
    part = real if coord == 0 else real - 1.0 - coord
    dt = DTensor.from_local(part.copy(), mesh, [Partial("max")], shape=(8,), stride=(1,))
    want = real.copy()
    ufunc.at(want, [1, 1, 6], 0.25)
    with CommDebugMode() as mode, mpitensor.strict():
        ufunc.at(dt, [1, 1, 6], 0.25)
    assert mode.get_total_counts() == 0
    np.testing.assert_array_equal(dt.full_tensor(), want)
    # A float sum would round otherwise than NumPy: the fallback takes it.
    fs = make(real, mesh, [Partial("sum")])
    want = real.copy()
    ufunc.at(want, [2], 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherWarning)
        ufunc.at(fs, [2], 0.1)
    assert_matches(fs.redistribute(mesh, [Replicate()]), want)
