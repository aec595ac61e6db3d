"""np.nanmean, nanvar, nanstd, nanmax, nanmin, nanargmax, nanargmin, ptp and
average of DTensors: NumPy's value and dtype (or its exception type) on every rank,
for every layout of the suite's meshes (Partial included) on shapes that leave
shards empty, with NaNs, all-NaN slices and integers; none gathers the array."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import (W, assert_matches, corner_layouts, make, matches_or_raises_alike,
                         mesh_of, mesh_shapes)

R, S0, S1 = Replicate(), Shard(0), Shard(1)
SHAPES = ((0,), (1,), (3,), (7,), (0, 3), (3, 0), (1, 3), (2, 1), (4, 5), (3, 2, 4))


def with_nans(shape, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    full = rng.integers(-5, 6, size=shape).astype(dtype)
    if full.dtype.kind == "f":
        full[rng.random(shape) < 0.3] = np.nan
        if full.ndim == 2 and full.shape[1] > 0:
            full[:, 0] = np.nan  # a slice of NaNs alone
    return full


def matches(ours, numpys):
    def compare(got, want):
        if isinstance(want, tuple):
            assert len(got) == len(want)
            for g, w in zip(got, want):
                compare(g, w)
        else:
            assert_matches(got, np.asarray(want))
    matches_or_raises_alike(ours, numpys, compare)


def axes_of(ndim):
    return [None, *range(ndim)] + ([(0, ndim - 1)] if ndim > 1 else [])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float64, np.int64], ids=str)
def test_nan_reductions(shape, dtype):
    full = with_nans(shape, len(shape) + shape[-1], dtype)
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            for axis in axes_of(len(shape)):
                for keepdims in (False, True):
                    kw = dict(axis=axis, keepdims=keepdims)
                    for f in (np.nanmean, np.nanmax, np.nanmin, np.ptp):
                        matches(lambda: f(dt, **kw), lambda: f(full, **kw))
                    for f in (np.nanvar, np.nanstd):
                        matches(lambda: f(dt, ddof=1, **kw), lambda: f(full, ddof=1, **kw))
                if axis is None or isinstance(axis, int):
                    for f in (np.nanargmax, np.nanargmin):
                        matches(lambda: f(dt, axis=axis), lambda: f(full, axis=axis))


@pytest.mark.parametrize("shape", [(5,), (4, 3), (0, 3), (2, 3, 4)], ids=str)
def test_average(shape):
    full = with_nans(shape, 3, np.int64)
    same_shape = np.arange(1.0, full.size + 1).reshape(shape) % 4
    for mesh, pls in corner_layouts(len(shape)):
        dt, dw = make(full, mesh, pls), make(same_shape, mesh, pls[::-1])
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            for axis in axes_of(len(shape)):
                matches(lambda: np.average(dt, axis=axis), lambda: np.average(full, axis=axis))
                matches(lambda: np.average(dt, axis=axis, returned=True),
                        lambda: np.average(full, axis=axis, returned=True))
                matches(lambda: np.average(dt, axis=axis, weights=dw, returned=True),
                        lambda: np.average(full, axis=axis, weights=same_shape,
                                           returned=True))
            for axis in range(len(shape)):
                w = np.arange(shape[axis], dtype=np.float64) % 3
                matches(lambda: np.average(dt, axis=axis, weights=w, keepdims=True),
                        lambda: np.average(full, axis=axis, weights=w, keepdims=True))


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_no_gather(mesh_shape):
    mesh = mesh_of(mesh_shape)
    full = with_nans((128, 64), 1)
    layouts = [(S0,), (S1,)] if len(mesh_shape) == 1 else [(S0, S1), (R, S0)]
    for pls in layouts:
        dt = make(full, mesh, pls)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            for f in (np.nanmean, np.nanvar, np.nanmax, np.ptp):
                with CommDebugMode() as mode:
                    got = f(dt, axis=0)
                    got.full_tensor()
                # A few numbers per result element, not the (64 KiB) array.
                assert sum(mode.get_comm_bytes().values()) <= 6 * 64 * 8 * 2, f
                assert_matches(got, f(full, axis=0))


@pytest.mark.parametrize("pls", [[R], [S0]], ids=str)
def test_average_of_an_ndarray_by_dtensor_weights(pls):
    """np.average(ndarray, weights=DTensor) (scikit-learn's brier_score_loss when
    its labels are NumPy's) runs on the weights' mesh, NumPy's value, no gather."""
    rng = np.random.default_rng(5)
    a, w = rng.random(9), rng.random(9)
    dw = make(w, mesh_of((W,)), pls)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        got = np.average(a, weights=dw)
    np.testing.assert_allclose(got.full_tensor(), np.average(a, weights=w), rtol=1e-13)
