"""np.cov and np.corrcoef of DTensors: NumPy's value and dtype on every rank, for
every layout of the suite's meshes (Partial included) on shapes that leave shards
empty, rowvar, bias and ddof; observations sharded move the means and the small
product, never the data."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import Replicate, Shard
from mpitensor._ops import _cov
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, corner_layouts, make, mesh_of, mesh_shapes

R, S0, S1 = Replicate(), Shard(0), Shard(1)
SHAPES = ((1,), (3,), (7,), (1, 3), (2, 1), (3, 5), (4, 2), (2, 9))


def close(got, want):
    """assert_matches, to float32's rounding where NumPy computes in float32."""
    want = np.asarray(want)
    if want.dtype != np.float32:
        return assert_matches(got, want)
    whole = got.full_tensor()
    assert whole.dtype == want.dtype and whole.shape == want.shape
    np.testing.assert_allclose(whole, want, rtol=1e-6)


def data(shape, seed):
    return np.random.default_rng(seed).integers(-4, 5, size=shape).astype(np.float64)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cov_and_corrcoef(shape):
    full = data(shape, sum(shape))
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            for kw in (dict(), dict(rowvar=False), dict(bias=True), dict(ddof=0),
                       dict(dtype=np.float32)):
                close(np.cov(dt, **kw), np.cov(full, **kw))
            for kw in (dict(), dict(rowvar=False)):
                assert_matches(np.corrcoef(dt, **kw), np.corrcoef(full, **kw))


@pytest.mark.parametrize("few", [0, 256], ids=["product", "by-blocks"])
def test_product_by_blocks_of_observations(monkeypatch, few):
    """With few variables each rank multiplies its deviations block by block of
    observations (here blocks of a few, the last one short); with many, the
    deviations' product is the engine's: the same values either way."""
    monkeypatch.setattr(_cov, "_FEW", few)
    monkeypatch.setattr(_cov, "_BLOCK", 9)
    full = data((3, 23), 2)
    cplx = full + 1j * data((3, 23), 3)
    for pls in ((S0,), (S1,), (R,)):
        for kw in (dict(), dict(rowvar=False), dict(ddof=3)):
            close(np.cov(make(full, mesh_of((W,)), pls), **kw), np.cov(full, **kw))
        assert_matches(np.cov(make(cplx, mesh_of((W,)), pls)), np.cov(cplx))
        assert_matches(np.corrcoef(make(full, mesh_of((W,)), pls), rowvar=False),
                       np.corrcoef(full, rowvar=False))


def test_integer_and_complex_data():
    mesh = mesh_of((W,))
    ints = np.arange(15).reshape(3, 5) % 4
    cplx = ints + 1j * (np.arange(15).reshape(3, 5) % 3)
    for full in (ints, cplx):
        for pls in ((S0,), (S1,), (R,)):
            dt = make(full, mesh, pls)
            assert_matches(np.cov(dt), np.cov(full))


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_observations_sharded_move_no_data(mesh_shape):
    mesh = mesh_of(mesh_shape)
    full = data((4, 4096), 1)
    pls = (S1,) if len(mesh_shape) == 1 else (S1, R)
    dt = make(full, mesh, pls)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            c, r = np.cov(dt), np.corrcoef(dt)
            c.full_tensor(), r.full_tensor()
    # The means and the 4 x 4 products (and a diagonal): not the 128 KiB of data.
    assert sum(mode.get_comm_bytes().values()) <= 8 * (4 + 16 + 4) * 3 * W
    assert_matches(c, np.cov(full))
    assert_matches(r, np.corrcoef(full))
