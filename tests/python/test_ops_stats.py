"""np.logaddexp.reduce / np.logaddexp2.reduce (log-sum-exp), np.histogram and the
replicated decompositions np.linalg.svd/eigh/qr on DTensors: equal to NumPy on the
full array for uneven shapes and any placements; log-sum-exp and histogram move
bytes proportional to their result, never the input; bins named by an estimator
through the warned gather. The quantiles of empty arrays, NumPy's shapes."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor._bind.core import chunk_sizes
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, corner_layouts, make, matches_or_raises_alike,
                         mesh_of, mesh_shapes, placements)

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")
COMM = MPI.COMM_WORLD


def sent_per_rank(mode) -> float:
    return COMM.allreduce(sum(mode.get_comm_bytes().values()), op=MPI.MAX)


@settings(max_examples=40)
@given(data=st.data())
def test_logaddexp_reduce_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    dtype = data.draw(st.sampled_from([np.float64, np.float32]))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    full = (rng.normal(size=shape) * 20).astype(dtype)
    pls = placements(data.draw, len(shape), mesh.ndim, partial=False)
    dt = make(full, mesh, pls)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    keepdims = data.draw(st.booleans())
    ufunc = data.draw(st.sampled_from([np.logaddexp, np.logaddexp2]))
    got = ufunc.reduce(dt, axis=axis, keepdims=keepdims)
    want = ufunc.reduce(full, axis=axis, keepdims=keepdims)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(got.full_tensor(), want, rtol=tol, atol=tol)


def _close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    np.testing.assert_allclose(got.full_tensor(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_logaddexp_reduce_and_histogram_match_numpy_on_empty_shards(shape):
    """The corners the property test may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included),
    along every axis; NumPy's value, or its exception type where NumPy raises. The
    histogram of the same layouts counts each element once."""
    ndim = len(shape)
    for k, (mesh, pls) in enumerate(corner_layouts(ndim)):
        full = np.arange(float(np.prod(shape))).reshape(shape) / 3 - 1
        dt = make(full, mesh, pls)
        ufunc = (np.logaddexp, np.logaddexp2)[k % 2]
        for axis in range(ndim):
            keepdims = (axis + k) % 2 == 1
            matches_or_raises_alike(lambda: ufunc.reduce(dt, axis=axis, keepdims=keepdims),
                                    lambda: ufunc.reduce(full, axis=axis, keepdims=keepdims),
                                    _close)
        counts, edges = np.histogram(dt, bins=3)
        want_counts, want_edges = np.histogram(full, bins=3)
        np.testing.assert_array_equal(counts, want_counts)
        np.testing.assert_allclose(edges, want_edges, rtol=1e-12)


@pytest.mark.world(4, reason="a (2, 2) mesh: one mesh dim cuts the axis, the "
                                   "other a kept dim")
@pytest.mark.parametrize("collective", ["all_gather", "all_reduce"])
def test_logaddexp_reduce_with_a_kept_dim_cut_unevenly(collective, monkeypatch):
    """A kept dim that the other mesh dim cuts unevenly (5 over 2), or leaves a rank
    empty (1 over 2), gives the ranks local results of different shapes: the merge
    describes them by the result's global shape and placements, so every rank
    passes the same layout (each its own local block once refused that), by
    either of the two collectives the time model chooses between."""
    import mpitensor._ops._stats as stats
    gather = collective == "all_gather"

    def plan(mesh, shape, src, dst, dtype):
        # The all-gather's source holds no Partial; the all-reduces' does.
        cheap = gather != any(p.is_partial() for p in src)
        return SimpleNamespace(time=1.0 if cheap else 10.0)

    monkeypatch.setattr(stats, "_layout", SimpleNamespace(plan=plan))
    mesh = mesh_of((2, 2))
    for shape in ((4, 5), (3, 1), (0, 3)):
        full = np.arange(float(np.prod(shape))).reshape(shape) / 3
        for pls in ((S0, S1), (S1, S0)):
            dt = make(full, mesh, pls)
            for axis in (0, 1):
                for keepdims in (False, True):
                    _close(np.logaddexp.reduce(dt, axis=axis, keepdims=keepdims),
                           np.logaddexp.reduce(full, axis=axis, keepdims=keepdims))


def test_logsumexp_of_a_long_sharded_vector_moves_only_the_result():
    mesh = mesh_of((W,))
    full = np.random.default_rng(1).normal(size=2 ** 16) * 50
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        got = np.logaddexp.reduce(dt, axis=0)
    assert sent_per_rank(mode) < 1024
    assert got.placements == (R,)
    np.testing.assert_allclose(got.full_tensor(), np.logaddexp.reduce(full), rtol=1e-12)
    # a Partial input is reduced first; -inf everywhere stays -inf
    p = make(np.arange(12.0).reshape(3, 4), mesh, [PS])
    np.testing.assert_allclose(np.logaddexp.reduce(p, axis=1).full_tensor(),
                               np.logaddexp.reduce(np.arange(12.0).reshape(3, 4), axis=1))
    ninf = make(np.full((W + 1, 2), -np.inf), mesh, [S0])
    assert np.all(np.logaddexp.reduce(ninf, axis=0).full_tensor() == -np.inf)


def test_logsumexp_along_an_unsharded_axis_is_local():
    mesh = mesh_of((W,))
    full = np.arange(30.0).reshape(6, 5) / 7
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        got = np.logaddexp.reduce(dt, axis=1)
    assert mode.get_total_counts() == 0 and got.placements == (S0,)
    np.testing.assert_allclose(got.full_tensor(), np.logaddexp.reduce(full, axis=1))


@pytest.mark.parametrize("pls", [[S0], [S1], [R], [PS]], ids=str)
def test_histogram_matches_numpy_and_moves_only_counts(pls):
    mesh = mesh_of((W,))
    full = np.random.default_rng(2).normal(size=(1001, 3))
    dt = make(full, mesh, pls)
    for bins, rng in ((10, None), (7, (-1.0, 2.0)), ([-3.0, -1.0, 0.0, 0.5, 4.0], None)):
        with CommDebugMode() as mode:
            counts, edges = np.histogram(dt, bins=bins, range=rng)
        want, want_edges = np.histogram(full, bins=bins, range=rng)
        np.testing.assert_array_equal(counts, want)
        np.testing.assert_allclose(edges, want_edges, rtol=1e-12)
        if not pls[0].is_partial():
            assert sent_per_rank(mode) <= 2 * (len(want) + 2) * 8
    dens, _ = np.histogram(dt, bins=5, density=True)
    np.testing.assert_allclose(dens, np.histogram(full, bins=5, density=True)[0])


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8", "int64"])
def test_histogram_of_values_on_the_edges_equals_numpys(dtype):
    """Equal bins count in one pass (csrc/core/histogram.c): values on each edge,
    one step beside it, NaN and out of range land where NumPy puts them; int64
    (which double does not hold exactly) is NumPy's own count."""
    mesh = mesh_of((W,))
    rng = np.random.default_rng(5)
    if np.dtype(dtype).kind == "f":
        edges = np.histogram_bin_edges(np.zeros(0, dtype), bins=7, range=(-1.3, 2.9))
        near = np.concatenate([edges, np.nextafter(edges, -np.inf),
                               np.nextafter(edges, np.inf)]).astype(dtype)
        full = np.concatenate([near, rng.uniform(-2, 4, 500).astype(dtype),
                               np.array([np.nan, np.inf, -np.inf], dtype)])
        cases = ((7, (-1.3, 2.9)), (3, (np.float32(0.1), 0.7)), (1000, (-2.0, 4.0)))
    else:
        info = np.iinfo(dtype)
        full = rng.integers(max(info.min, -300), min(info.max, 300), 501).astype(dtype)
        cases = ((7, None), (6, (0, 250)), (13, (-3.5, 100.25)))
    dt = make(full, mesh, [S0])
    for bins, r in cases:
        counts, edges = np.histogram(dt, bins=bins, range=r)
        want, want_edges = np.histogram(full, bins=bins, range=r)
        np.testing.assert_array_equal(counts, want)
        np.testing.assert_array_equal(edges, want_edges)


def test_histogram_on_a_2d_mesh_counts_replicas_once():
    if W != 4:
        pytest.skip("needs a (2, 2) mesh")
    mesh = mesh_of((2, 2))
    full = np.arange(45.0).reshape(9, 5)
    for pls in ([S0, R], [R, S1], [R, R], [S0, S1]):
        counts, _ = np.histogram(make(full, mesh, pls), bins=[0, 10, 20, 45])
        np.testing.assert_array_equal(counts, np.histogram(full, bins=[0, 10, 20, 45])[0])


@pytest.mark.parametrize("pls", [[S0], [S1], [R]], ids=str)
def test_decompositions_replicate_then_equal_numpy(pls):
    mesh = mesh_of((W,))
    a = np.random.default_rng(3).normal(size=(7, 4))
    dt = make(a, mesh, pls)
    u, s, vh = np.linalg.svd(dt, full_matrices=False)
    # rows sharded in blocks at least 4 tall take TSQR, other sharded matrices
    # ScaLAPACK: U keeps A's placement either way (_tsqr.py, _scalapack_rect.py)
    tsqr = pls == [S0] and min(chunk_sizes(7, W)) >= 4
    sharded = pls != [R] and (W > 1 or tsqr)
    assert u.placements == (tuple(pls) if sharded else (R,)) and s.placements == (R,)
    np.testing.assert_allclose((u.full_tensor() * s.full_tensor()) @ vh.full_tensor(), a,
                               atol=1e-10)
    np.testing.assert_allclose(s.full_tensor(), np.linalg.svd(a, compute_uv=False))
    q, r = np.linalg.qr(dt)
    np.testing.assert_allclose(q.full_tensor() @ r.full_tensor(), a, atol=1e-10)
    rr = np.linalg.qr(dt, mode="r")
    np.testing.assert_allclose(np.abs(rr.full_tensor()), np.abs(np.linalg.qr(a, mode="r")))
    sym = make(a.T @ a, mesh, pls if pls != [S1] else [S0])
    w, v = np.linalg.eigh(sym)
    np.testing.assert_allclose(w.full_tensor(), np.linalg.eigvalsh(a.T @ a), rtol=1e-10)
    np.testing.assert_allclose(v.full_tensor() @ np.diag(w.full_tensor()) @
                               v.full_tensor().T, a.T @ a, atol=1e-9)


@pytest.mark.parametrize("shape", [(64, 4), (7, 3), (5, 5), (W * 2 + 1, 2)], ids=str)
def test_tall_skinny_qr_on_shard0_moves_only_r_factors(shape):
    """TSQR (_tsqr.py, in C): where the matrix is tall and every rank's block at
    least as tall as the matrix is wide, Q keeps Shard(0), R is Replicate, and the ranks exchange only
    upper triangles of R (one all_reduce: log2 W butterfly levels, plus a fold in
    and R back out, and Q's n x n block, for the ranks beyond a power of two);
    with a shorter block the matrix is replicated first. Either way Q @ R equals
    the input, Q is orthonormal and R is NumPy's up to the signs of its rows."""
    mesh = mesh_of((W,))
    a = np.random.default_rng(4).normal(size=shape)
    dt = make(a, mesh, [S0])
    with CommDebugMode() as mode:
        q, r = np.linalg.qr(dt)
    n = shape[1]
    Q, Rf = q.full_tensor(), r.full_tensor()
    np.testing.assert_allclose(Q @ Rf, a, atol=1e-10)
    np.testing.assert_allclose(Q.T @ Q, np.eye(n), atol=1e-10)
    np.testing.assert_allclose(np.abs(Rf), np.abs(np.linalg.qr(a)[1]), atol=1e-10)
    assert np.allclose(np.tril(Rf, -1), 0)
    if shape[0] > n and min(chunk_sizes(shape[0], W)) >= n:  # tall, every block too
        assert q.placements == (S0,) and r.placements == (R,)
        p2 = 1 << (W.bit_length() - 1)
        extras, triangle = W - p2, n * (n + 1) // 2 * 8
        want = (p2 * (p2.bit_length() - 1) + 2 * extras) * triangle + extras * n * n * 8
        assert dict(mode.get_comm_counts()) == ({"all_reduce": 1} if W > 1 else {})
        assert COMM.allreduce(sum(mode.get_comm_bytes().values())) == want
    np.testing.assert_allclose(np.abs(np.linalg.qr(dt, mode="r").full_tensor()),
                               np.abs(np.linalg.qr(a, mode="r")), atol=1e-10)


@pytest.mark.parametrize("bins", ["auto", "fd", "doane", "scott", "stone", "rice",
                                  "sturges", "sqrt"])
def test_histogram_bins_named_by_an_estimator_are_numpys_through_the_gather(bins):
    """An estimator's bins depend on the whole data: NumPy's own call on the
    gathered data (the fallback, which warns once per function and which strict()
    refuses), where they were refused."""
    full = np.random.default_rng(3).normal(size=(4 * W + 3, 3)) * 5
    for pls in ([S0], [S1], [R]):
        dt = make(full, mesh_of((W,)), pls)
        with pytest.raises(TypeError, match="no sharding rule|need the whole"), mt.strict():
            np.histogram(dt, bins=bins)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mt.GatherWarning)
            counts, edges = np.histogram(dt, bins=bins)
            got = np.histogram_bin_edges(dt, bins=bins, range=(-3.0, 4.0))
        want_counts, want_edges = np.histogram(full, bins=bins)
        np.testing.assert_array_equal(_plain(counts), want_counts)
        np.testing.assert_array_equal(_plain(edges), want_edges)
        np.testing.assert_array_equal(_plain(got), np.histogram_bin_edges(
            full, bins=bins, range=(-3.0, 4.0)))


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (1, 2, 0), (W + 1, 2, 0)], ids=str)
def test_nan_quantiles_of_an_empty_array_are_numpys_nanmean(shape):
    """NumPy answers nanpercentile and nanquantile of an empty array with its
    nanmean, q's dims dropped; median and percentile with several reduced axes
    beside an empty kept one raise NumPy's ValueError: the same shapes, values and
    exceptions in every layout."""
    full = np.zeros(shape)
    axes = [None] + list(range(len(shape))) + ([(0, 1)] if len(shape) > 1 else [])
    for pls in [[R]] + [[Shard(d)] for d in range(len(shape))]:
        dt = make(full, mesh_of((W,)), pls)
        for axis in axes:
            for keepdims in (False, True):
                calls = [(f, q) for f, q in ((np.nanpercentile, [10, 90]),
                                             (np.nanpercentile, 50),
                                             (np.nanquantile, [0.5]), (np.percentile, [10]),
                                             (np.quantile, 0.5))]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    for f, q in calls:
                        matches_or_raises_alike(
                            lambda: f(dt, q, axis=axis, keepdims=keepdims),
                            lambda: f(full, q, axis=axis, keepdims=keepdims),
                            _same_nan)
                    for f in (np.median, np.nanmedian):
                        matches_or_raises_alike(
                            lambda: f(dt, axis=axis, keepdims=keepdims),
                            lambda: f(full, axis=axis, keepdims=keepdims), _same_nan)


def _plain(x):
    return x.full_tensor() if hasattr(x, "full_tensor") else np.asarray(x)


def _same_nan(got, want):
    got, want = _plain(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)
