"""``x[mask] = values`` with an array of values on DTensors: the values go to the
Trues in C order across every rank's block, as NumPy puts them, with nothing
gathered; NumPy's errors for values of the wrong size or rank, on every rank."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import DTensor, Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, make, mesh_layouts, mesh_of

R, S0, S1 = Replicate(), Shard(0), Shard(1)
LAYOUTS = mesh_layouts((S0, S1), (S1, S0), (R, S0), (S0, S0), (Partial(), S1))


def _case(seed, shape=(7, 5), dtype=np.float64):
    rng = np.random.default_rng(seed)
    full = rng.standard_normal(shape).astype(dtype)
    mask = rng.random(shape) < 0.4
    values = rng.standard_normal(int(mask.sum())).astype(np.float32)
    return full, mask, values


@pytest.mark.parametrize("mesh_shape, pls", LAYOUTS, ids=str)
@pytest.mark.parametrize("values_as", ["ndarray", "replicate", "shard", "list"])
def test_mask_assignment_of_values_is_numpys(mesh_shape, pls, values_as):
    mesh = mesh_of(mesh_shape)
    full, mask, values = _case(len(str(pls)) + len(values_as))
    dt = make(full, mesh, pls)
    dmask = make(mask, mesh, [p if not p.is_partial() else R for p in pls])
    if values_as == "replicate":
        v = make(values, mesh, [R] * mesh.ndim)
    elif values_as == "shard":
        v = make(values, mesh, [S0] + [R] * (mesh.ndim - 1))
    else:
        v = values.tolist() if values_as == "list" else values
    expect = full.copy()
    expect[mask] = values
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a GatherWarning would fail the test
        dt[dmask] = v
    # a Partial's parts sum to the value up to rounding
    np.testing.assert_allclose(dt.full_tensor(), expect, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mesh_shape, pls", LAYOUTS[:3], ids=str)
def test_mask_assignment_moves_no_more_than_the_values(mesh_shape, pls):
    """The data moved is on the order of the values, not the whole array."""
    mesh = mesh_of(mesh_shape)
    full = np.zeros((400, 50))
    mask = np.zeros(full.shape, bool)
    mask[::7, 3] = True
    dt = make(full, mesh, pls)
    dmask = make(mask, mesh, pls)
    values = np.arange(mask.sum(), dtype=np.float64)
    with CommDebugMode() as cdm:
        dt[dmask] = values
    expect = full.copy()
    expect[mask] = values
    np.testing.assert_array_equal(dt.full_tensor(), expect)
    moved = sum(cdm.get_comm_bytes().values())
    # the values (a few hundred bytes) and the mask's scan, never the array itself
    assert moved < full.nbytes // 4, (moved, cdm.get_comm_bytes())


@pytest.mark.parametrize("values, error", [(np.ones(3), ValueError),
                                           (np.ones((2, 2)), TypeError)])
def test_mask_assignment_errors_are_numpys(values, error):
    mesh = mesh_of((W,))
    full, mask, _ = _case(1)
    dt = make(full, mesh, [S0])
    with pytest.raises(error):
        full.copy()[mask] = values
    with pytest.raises(error):
        dt[make(mask, mesh, [S0])] = values
    np.testing.assert_array_equal(dt.full_tensor(), full)


@pytest.mark.parametrize("count", [0, 1])
def test_mask_assignment_of_one_value_or_none(count):
    mesh = mesh_of((W,))
    full = np.arange(12.0).reshape(4, 3)
    mask = np.zeros(full.shape, bool)
    mask.flat[:count] = True
    for values in (np.ones(1) * 9, np.ones(count) * 9):
        dt = make(full, mesh, [S0])
        dt[make(mask, mesh, [S0])] = values
        expect = full.copy()
        expect[mask] = values
        np.testing.assert_array_equal(dt.full_tensor(), expect)
    assert isinstance(dt, DTensor)


@pytest.mark.parametrize("pls", [[R], [S0], [S1]], ids=str)
@pytest.mark.parametrize("mask_as", ["dtensor", "ndarray"])
def test_mask_of_the_leading_dims(pls, mask_as):
    """A mask of the leading dims selects whole rows, as in NumPy: a scalar is
    written distributed; rows of values (NumPy's 2-D values) are NumPy's answer."""
    mesh = mesh_of((W,))
    full = np.arange(30.0).reshape(10, 3)
    rows = np.arange(10) % 3 == 0
    for value in (7.0, np.arange(12.0).reshape(4, 3), np.arange(3.0)):
        dt = make(full, mesh, pls)
        key = make(rows, mesh, [R] if pls == [S1] else pls) if mask_as == "dtensor" else rows
        expect = full.copy()
        expect[rows] = value
        with warnings.catch_warnings():
            if np.ndim(value) == 0:
                warnings.simplefilter("error")  # a scalar is never gathered
            dt[key] = value
        np.testing.assert_array_equal(dt.full_tensor(), expect)
