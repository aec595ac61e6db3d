"""The distributed sample sort (sort, argsort with no free dim) and the order
statistics built on it (median, percentile, quantile and their nan forms over every
dim): equal to NumPy on the full array for even and uneven lengths, dtypes, ties,
NaNs and every ``method=``, in the usual shard layout, and never a gather of the
array (CommDebugMode: the all-gathers carry only the samples and a few counts).
A small array is sorted by one gather instead; the sorts run both ways."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import DTensor, Partial, Replicate, Shard
from mpitensor._algorithms import _sample_sort
from mpitensor.debug import CommDebugMode
from ops_helpers import W, make, mesh_of, mesh_shapes

R, S0, S1 = Replicate(), Shard(0), Shard(1)
LENGTHS = [0, 1, W - 1, W + 1, 7 * W + 3, 300]
METHODS = ["inverted_cdf", "averaged_inverted_cdf", "closest_observation",
           "interpolated_inverted_cdf", "hazen", "weibull", "linear", "median_unbiased",
           "normal_unbiased", "lower", "higher", "midpoint", "nearest"]


def vector(n, dtype, seed=0):
    """Values with many ties; NaNs (and a -0.0) in the floating ones."""
    rng = np.random.default_rng(seed + n)
    if np.dtype(dtype).kind == "c":
        full = (rng.integers(-3, 4, n) + 1j * rng.integers(-2, 3, n)).astype(dtype)
    else:
        full = rng.integers(-5, 6, n).astype(dtype)
    if np.dtype(dtype).kind == "f" and n > 3:
        full[:: max(n // 3, 1)] = np.nan
        full[1] = -0.0
        full[2:] += rng.normal(size=n - 2).astype(dtype) * (n % 2)
    return full


def same(got: DTensor, expect):
    expect = np.asarray(expect)
    full = got.full_tensor()
    assert full.shape == expect.shape and full.dtype == expect.dtype, (
        full.shape, expect.shape, full.dtype, expect.dtype)
    np.testing.assert_array_equal(full, expect)


def usual_layout(got: DTensor):
    """The local array is this rank's shard of the usual (torch.chunk) layout."""
    expect, _ = mpitensor.compute_local_shape_and_global_offset(
        got.shape, got.device_mesh, got.placements)
    assert got.to_local().shape == tuple(expect)


@pytest.fixture(params=["sample sort", "gathered"])
def sort_path(request, monkeypatch):
    """Small arrays are sorted gathered: these tests take both ways."""
    if request.param == "sample sort":
        monkeypatch.setattr(_sample_sort, "GATHER_SORT_BYTES", 0)
    return request.param


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int8,
                                   np.complex128, np.bool_])
@pytest.mark.parametrize("n", LENGTHS)
def test_sort_and_argsort_of_a_sharded_vector(dtype, n, sort_path):
    full = vector(n, dtype)
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        layouts = [(S0,)] if mesh.ndim == 1 else [(S0, R), (R, S0), (S0, Partial("sum"))]
        for pls in layouts:
            if Partial("sum") in pls and dtype is np.bool_:
                continue
            dt = make(full, mesh, pls)
            ref = dt.full_tensor()  # a Partial's parts may round
            got = np.sort(dt)
            same(got, np.sort(ref))
            same(np.argsort(dt, kind="stable"), np.argsort(ref, kind="stable"))
            same(np.sort(dt, axis=None, stable=True), np.sort(ref, axis=None))
            if W > 1:
                assert got.placements == tuple(Shard(0) if p.is_shard() else R
                                               for p in pls)
            usual_layout(got)


def test_argsort_ties_follow_the_global_index_whatever_kind(sort_path):
    full = np.repeat(np.arange(3.0), 5 * W + 1)[::-1].copy()
    dt = make(full, mesh_of((W,)), [S0])
    for kind in (None, "quicksort", "stable"):
        # One rank sorts its whole vector by NumPy itself, of the kind asked for.
        same(np.argsort(dt, kind=kind), np.argsort(full, kind="stable" if W > 1 else kind))


@pytest.mark.parametrize("pls", [(S0,), (S1,)])
def test_flattened_sort_of_a_matrix(pls, sort_path):
    full = vector(6 * W + 5, np.float64, seed=3)[: 6 * W + 5].reshape(-1, 1)
    full = np.concatenate([full, full[::-1] * 2, full + 1], axis=1)
    dt = make(full if pls == (S0,) else full.T.copy(), mesh_of((W,)), pls)
    ref = dt.full_tensor()
    same(np.sort(dt, axis=None), np.sort(ref, axis=None))
    same(np.argsort(dt, axis=None, kind="stable"), np.argsort(ref, axis=None, kind="stable"))
    if W > 1:
        assert np.sort(dt, axis=None).placements == (S0,)


@pytest.mark.skipif(W == 1, reason="one rank moves nothing")
def test_a_small_array_is_sorted_by_one_gather():
    full = vector(_sample_sort.GATHER_SORT_BYTES // 8, np.float64, seed=5)
    dt = make(full, mesh_of((W,)), [S0])
    with CommDebugMode() as mode:
        got = np.argsort(dt, kind="stable")
    assert mode.get_comm_counts() == {"all_gather_into_tensor": 1}
    same(got, np.argsort(full, kind="stable"))
    with CommDebugMode() as mode:
        np.sort(make(np.append(full, 1.0), mesh_of((W,)), [S0]))
    assert mode.get_comm_counts().get("all_to_all_single", 0) > 0  # one element more


@pytest.mark.skipif(W == 1, reason="one rank moves nothing")
def test_sample_sort_never_gathers_the_array():
    n = 2 ** 16
    full = np.random.default_rng(7).normal(size=n)
    dt = make(full, mesh_of((W,)), [S0])
    shard = dt.to_local().nbytes
    with CommDebugMode() as mode:
        got = np.sort(dt)
    counts, sent = mode.get_comm_counts(), mode.get_comm_bytes()
    # The samples: W - 1 records of a value and an index per rank, sent to W - 1 peers.
    assert sent.get("all_gather_into_tensor", 0) <= (W - 1) ** 2 * 16
    assert counts.get("all_gather_into_tensor", 0) == 1
    # The buckets and the rebalance: each at most about a shard, plus the counts.
    assert sent["all_to_all_single"] <= 3 * shard + 4 * W * 8
    assert counts["all_to_all_single"] == 4 and counts.get("exscan") == 1
    same(got, np.sort(full))
    # A gather would send this rank's whole shard to every peer.
    with CommDebugMode() as mode:
        dt.redistribute(dt.device_mesh, [R])
    assert mode.get_comm_bytes()["all_gather_into_tensor"] == shard * (W - 1)


@pytest.mark.parametrize("n", LENGTHS[1:])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int16])
def test_median_of_a_sharded_vector(n, dtype):
    full = vector(n, dtype, seed=1)
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        layouts = [(S0,)] if mesh.ndim == 1 else [(S0, R), (R, S0)]
        for pls in layouts:
            dt = make(full, mesh, pls)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                for func in (np.median, np.nanmedian):
                    got = func(dt)
                    assert got.placements == (R,) * mesh.ndim
                    same(got, func(full))
                    same(func(dt, keepdims=True), func(full, keepdims=True))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32])
def test_quantiles_of_a_sharded_vector_every_method(method, dtype):
    mesh = mesh_of((W,))
    for n in (1, W + 1, 13 * W + 2):
        full = vector(n, dtype, seed=2)
        dt = make(full, mesh, [S0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for func, q in ((np.quantile, 0.3), (np.quantile, [0.0, 0.25, 0.5, 1.0]),
                            (np.percentile, 90), (np.percentile, np.array([5.0, 50.0])),
                            (np.nanquantile, [0.1, 0.9]), (np.nanpercentile, 37.5)):
                same(func(dt, q, method=method), func(full, q, method=method))
        matrix = make(np.tile(full, (2, 1)).T.copy(), mesh, [S0])
        same(np.quantile(matrix, [0.2], method=method, keepdims=True),
             np.quantile(np.tile(full, (2, 1)).T, [0.2], method=method, keepdims=True))


def test_order_statistics_errors_and_empty_slices_as_numpy():
    mesh = mesh_of((W,))
    dt = make(np.arange(3.0 * W), mesh, [S0])
    with pytest.raises(ValueError, match="Quantiles must be in the range"):
        np.quantile(dt, 1.5)
    with pytest.raises(ValueError, match="Percentiles must be in the range"):
        np.percentile(dt, -1)
    with pytest.raises(ValueError, match="is not a valid method"):
        np.quantile(dt, 0.5, method="nope")
    with pytest.raises(TypeError, match="real numbers"):
        np.quantile(make(np.ones(2 * W, complex), mesh, [S0]), 0.5)
    nans = make(np.full(2 * W, np.nan), mesh, [S0])
    with pytest.warns(RuntimeWarning, match="All-NaN"):
        got = np.nanmedian(nans)
    assert np.isnan(got.full_tensor())
    with pytest.warns(RuntimeWarning, match="All-NaN"):
        got = np.nanquantile(nans, [0.5, 0.7])
    assert got.shape == (2,) and np.isnan(got.full_tensor()).all()


@pytest.mark.skipif(W == 1, reason="one rank moves nothing")
def test_median_of_a_large_vector_sends_no_gather():
    full = np.random.default_rng(9).normal(size=2 ** 16)
    dt = make(full, mesh_of((W,)), [S0])
    with CommDebugMode() as mode:
        got = np.median(dt)
    sent = mode.get_comm_bytes()
    # Samples, a count pair per rank: well under a KiB.
    assert sent.get("all_gather_into_tensor", 0) < 1024
    # The two middle values, once.
    assert sent.get("all_reduce", 0) <= 2 * 8 * W
    assert sent["all_to_all_single"] <= dt.to_local().nbytes + 2 * W * 8
    same(got, np.median(full))


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_sort_along_a_sharded_axis_with_no_free_dim_sorts_each_lane(dtype, sort_path):
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        for shape, ax in (((5 * W + 1, 1), 0), ((1, W - 1 or 1, 7 * W), 2),
                          ((W - 1 or 1, 40 * W + 3), 1)):
            full = np.random.default_rng(ax).integers(-3, 4, shape).astype(dtype)
            pls = tuple(Shard(ax) if i == 0 else R for i in range(mesh.ndim))
            dt = make(full, mesh, pls)
            lanes = int(np.prod(shape)) // shape[ax]
            with CommDebugMode() as mode:
                got = np.sort(dt, axis=ax)
            same(got, np.sort(full, axis=ax))
            same(np.argsort(dt, axis=ax, kind="stable"), np.argsort(full, axis=ax, kind="stable"))
            if W > 1 and mesh.ndim == 1:
                assert got.placements == (Shard(ax),)
                usual_layout(got)
                # Per lane: the samples, never the lane (unless it is small).
                assert sort_path == "gathered" or mode.get_comm_bytes().get(
                    "all_gather_into_tensor", 0) <= lanes * (W - 1) ** 2 * 16


def test_values_only_sorts_take_no_indirect_sort(monkeypatch):
    """sort and the order statistics sort each shard by value alone (NumPy's
    vectorised sort) with implicit tie keys: a stable argsort and the gathers by
    its order took about 85% of a rank's instructions at 2**20 elements per rank
    (callgrind). argsort still needs the indices."""
    mesh = mesh_of((W,))
    full = vector(7 * W + 3, np.float64)
    dt = make(full, mesh, [S0])

    def forbidden(*args, **kwargs):
        raise AssertionError("a values-only sort took an indirect sort")

    monkeypatch.setattr(np, "argsort", forbidden)
    same(np.sort(dt), np.sort(full))
    same(np.median(dt), np.median(full))
    same(np.nanquantile(dt, [0.2, 0.7]), np.nanquantile(full, [0.2, 0.7]))
