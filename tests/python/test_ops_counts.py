"""np.bincount, np.histogram_bin_edges, np.histogram2d and np.histogramdd of
DTensors: NumPy's value and dtype on every rank, for every layout of the suite's
meshes (Partial included) on shapes that leave shards empty, and NumPy's exception
type for bad input; what moves is a few numbers and the counts, never the data."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import Replicate, Shard
from mpitensor._algorithms import _lanes
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import (W, assert_matches, corner_layouts, make, matches_or_raises_alike,
                         mesh_of, mesh_shapes)

R, S0, S1 = Replicate(), Shard(0), Shard(1)
LENGTHS = (0, 1, 3, 7, 11)


def ints(n, seed, top=9):
    return np.random.default_rng(seed).integers(0, top, size=n)


def no_gather():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("error", GatherWarning)
    return ctx


def same_arrays(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            same_arrays(g, w)
        return
    got = got.full_tensor() if hasattr(got, "full_tensor") else got
    assert type(got) is np.ndarray and got.dtype == want.dtype, (got, want)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("n", LENGTHS)
def test_bincount(n):
    full = ints(n, n)
    weights = np.linspace(-1.0, 2.0, n)
    for mesh, pls in corner_layouts(1):
        dt = make(full, mesh, pls)
        dw = make(weights, mesh, pls[::-1])
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            for minlength in (0, 4, 15):
                assert_matches(np.bincount(dt, minlength=minlength),
                               np.bincount(full, minlength=minlength))
            assert_matches(np.bincount(dt, weights=dw), np.bincount(full, weights=weights))


def test_bincount_bad_input_raises_numpys_error():
    mesh = mesh_of((W,))
    for full in (np.array([0, 3, -1, 2, 5]), np.arange(6.0), np.arange(6).reshape(2, 3)):
        dt = make(full, mesh, (S0,))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GatherWarning)
            matches_or_raises_alike(lambda: np.bincount(dt), lambda: np.bincount(full))


def test_bincount_kernel_counts_as_numpy(monkeypatch):
    """The one-pass kernel (taken from a few values here): NumPy's array and dtype
    for tables it grows as it goes, minlength, weights (float64 sums bit for bit,
    int weights cast), int32 values; NumPy's ValueError for a negative value, also
    of a DTensor whose negative value one rank holds."""
    monkeypatch.setattr(_lanes, "_BINCOUNT_MIN", 0)
    rng = np.random.default_rng(5)
    for top in (1, 9, 300, 5000):
        x = rng.integers(0, top, 700)
        for minlength in (0, 7, 400):
            for w in (None, rng.normal(size=700), rng.integers(-3, 3, 700)):
                got, want = _lanes.bincount(x, w, minlength), np.bincount(x, w, minlength)
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    x32 = x.astype(np.int32)
    assert np.array_equal(_lanes.bincount(x32), np.bincount(x32))
    bad = np.array([0, 3, 2, 5, 1, -1, 2])
    with pytest.raises(ValueError, match="no negative elements"):
        _lanes.bincount(bad)
    mesh = mesh_of((W,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        full = ints(23, 1, 40)
        assert_matches(np.bincount(make(full, mesh, (S0,))), np.bincount(full))
        matches_or_raises_alike(lambda: np.bincount(make(bad, mesh, (S0,))),
                                lambda: np.bincount(bad))


@pytest.mark.parametrize("n", LENGTHS)
def test_histogram_bin_edges(n):
    full = np.random.default_rng(n).normal(size=n)
    for mesh, pls in corner_layouts(1):
        dt = make(full, mesh, pls)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            for bins, rng in ((4, None), (3, (-1.0, 1.0)), (np.array([0.0, 0.5, 2.0]), None)):
                same_arrays(np.histogram_bin_edges(dt, bins=bins, range=rng),
                            np.histogram_bin_edges(full, bins=bins, range=rng))


@pytest.mark.parametrize("shape", [(0, 2), (1, 3), (3, 2), (9, 3), (7, 1)], ids=str)
def test_histogramdd(shape):
    rng = np.random.default_rng(shape[0])
    full = rng.normal(size=shape)
    full[:, 0] = np.round(full[:, 0])  # values on the edges
    cases = [dict(bins=3), dict(bins=(2,) * shape[1], density=True),
             dict(bins=[np.array([-1.0, 0.0, 1.0])] + [2] * (shape[1] - 1),
                  range=[None] + [(-0.5, 0.5)] * (shape[1] - 1))]
    for mesh, pls in corner_layouts(2):
        dt = make(full, mesh, pls)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            warnings.simplefilter("ignore", RuntimeWarning)  # density of nothing
            for kw in cases:
                same_arrays(np.histogramdd(dt, **kw), np.histogramdd(full, **kw))


@pytest.mark.parametrize("n", LENGTHS)
def test_histogram2d(n):
    rng = np.random.default_rng(n + 1)
    x, y = rng.normal(size=n), rng.integers(-3, 3, size=n).astype(np.float64)
    for mesh, pls in corner_layouts(1):
        dx, dy = make(x, mesh, pls), make(y, mesh, pls[::-1])
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            for kw in (dict(bins=4), dict(bins=[3, np.array([-3.0, 0.0, 3.0])]),
                       dict(bins=np.array([-2.0, 0.0, 2.0]), density=True)):
                same_arrays(np.histogram2d(dx, dy, **kw), np.histogram2d(x, y, **kw))


def test_integer_and_float32_edges_are_numpys():
    mesh = mesh_of((W,))
    for full in (np.arange(13) * 3 - 7, (np.arange(13) / 7).astype(np.float32)):
        dt = make(full, mesh, (S0,))
        same_arrays(np.histogram_bin_edges(dt, bins=6), np.histogram_bin_edges(full, bins=6))
        same_arrays(np.histogramdd(dt, bins=5), np.histogramdd(full, bins=5))


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_only_counts_move(mesh_shape):
    mesh = mesh_of(mesh_shape)
    n = 1 << 14
    full = ints(n, 5, top=50)
    sample = np.random.default_rng(2).normal(size=(n, 2))
    layouts = [(S0,)] if len(mesh_shape) == 1 else [(S0, R), (R, S0), (S0, S0)]
    for pls in layouts:
        dt, ds = make(full, mesh, pls), make(sample, mesh, pls)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            with CommDebugMode() as mode:
                counts = np.bincount(dt)
            # Two numbers, and the counts are a Partial until read.
            assert sum(mode.get_comm_bytes().values()) <= 16 * W
            assert any(p.is_partial() for p in counts.placements) or W == 1
            assert_matches(counts, np.bincount(full))
            with CommDebugMode() as mode:
                hist, edges = np.histogramdd(ds, bins=(8, 4))
            assert sum(mode.get_comm_bytes().values()) <= 8 * (8 * 4 + 8) * W
            same_arrays((hist, edges), np.histogramdd(sample, bins=(8, 4)))
