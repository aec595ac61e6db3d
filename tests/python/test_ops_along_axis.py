"""Functions that work independently along an axis (sort, argsort, partition,
cumsum, cumprod, diff, flip, roll, fftshift, the ffts, median, percentile, quantile):
equal to NumPy on the full array for even and uneven shapes, dtypes and placements
(Partial included); with no communication at all whenever no mesh dim shards the
axis (and no Partial must be reduced), the other dims keeping their placements."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpitensor import DTensor, Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, corner_layouts, make, matches_or_raises_alike,
                         mesh_of, mesh_shapes, placements)

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")

# name -> (call(np_module_function_owner, x, axis), linear, reduces the axis)
CALLS = {
    "sort": (lambda x, ax: np.sort(x, axis=ax), False),
    "sort_stable": (lambda x, ax: np.sort(x, axis=ax, stable=True), False),
    "argsort": (lambda x, ax: np.argsort(x, axis=ax, stable=True), False),
    "partition": (lambda x, ax: np.partition(x, 0, axis=ax), False),
    "cumsum": (lambda x, ax: np.cumsum(x, axis=ax), True),
    "cumprod": (lambda x, ax: np.cumprod(x, axis=ax), False),
    "diff": (lambda x, ax: np.diff(x, axis=ax), True),
    "diff3": (lambda x, ax: np.diff(x, 3, axis=ax), True),
    "diff2_prepend": (lambda x, ax: np.diff(x, 2, axis=ax, prepend=1), False),
    "flip": (lambda x, ax: np.flip(x, ax), True),
    "roll": (lambda x, ax: np.roll(x, 2, axis=ax), True),
    "fftshift": (lambda x, ax: np.fft.fftshift(x, axes=ax), True),
    "fft": (lambda x, ax: np.fft.fft(x, axis=ax), True),
    "ifft_n": (lambda x, ax: np.fft.ifft(x, 5, axis=ax), True),
    "rfft": (lambda x, ax: np.fft.rfft(x, axis=ax), True),
    "irfft": (lambda x, ax: np.fft.irfft(x, axis=ax), True),
    "fftn": (lambda x, ax: np.fft.fftn(x, axes=(ax,)), True),
    "median": (lambda x, ax: np.median(x, axis=ax), False),
    "median_keep": (lambda x, ax: np.median(x, axis=ax, keepdims=True), False),
    "percentile": (lambda x, ax: np.percentile(x, [10, 90], axis=ax), False),
    "quantile": (lambda x, ax: np.quantile(x, 0.3, axis=ax, method="nearest"), False),
    "nanmedian": (lambda x, ax: np.nanmedian(x, axis=ax), False),
}


def check(got, expect):
    full = got.full_tensor()
    assert full.shape == expect.shape and full.dtype == expect.dtype, (
        full.shape, expect.shape, full.dtype, expect.dtype)
    if expect.dtype.kind in "fc":
        np.testing.assert_allclose(full, expect, rtol=1e-9, atol=1e-9)
    else:
        np.testing.assert_array_equal(full, expect)


@settings(max_examples=150)
@given(data=st.data())
def test_along_axis_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    name = data.draw(st.sampled_from(sorted(CALLS)))
    call, linear = CALLS[name]
    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    ndim = len(shape)
    axis = data.draw(st.integers(-ndim, ndim - 1))
    dtype = data.draw(st.sampled_from([np.float64, np.int64, np.float32]))
    if name.startswith(("fft", "ifft", "rfft", "irfft")) or name == "fftn":
        dtype = np.float64
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    if name == "irfft" and shape[axis] == 1:
        shape = shape[:axis % ndim] + (2,) + shape[axis % ndim + 1:]
    full = rng.integers(-9, 10, size=shape).astype(dtype)
    if name == "cumprod":
        full = rng.integers(1, 3, size=shape).astype(dtype)
    pls = placements(data.draw, ndim, mesh.ndim)
    dt = make(full, mesh, pls)
    ax = axis % ndim
    moves = any(p.is_shard() and p.dim == ax for p in pls) or any(
        p.is_partial() for p in pls) and not linear
    with CommDebugMode() as mode:
        got = call(dt, axis)
    if not moves:
        assert mode.get_total_counts() == 0, (name, pls, mode.get_comm_counts())
        if not name.startswith(("median", "percentile", "quantile", "nanmedian")):
            assert got.placements == tuple(pls)
    check(got, call(full, axis))


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int16, np.float32])
def test_diff_of_any_order_and_dtype_is_numpys(dtype):
    """NumPy's differences exactly: bools by not_equal, unsigned ints wrapping,
    order 0 the array itself, an order past the axis' length empty."""
    mesh = mesh_of((W,))
    full = np.random.default_rng(4).integers(0, 200, size=(2 * W + 1, 6)).astype(dtype)
    for pls in ([S0], [R]):
        dt = make(full, mesh, pls)
        for n in (0, 1, 2, 5, 7):
            for axis in (1, -1):
                got = np.diff(dt, n, axis=axis)
                expect = np.diff(full, n, axis=axis)
                assert got.placements == tuple(pls)
                full_got = got.full_tensor()
                assert full_got.dtype == expect.dtype and full_got.shape == expect.shape
                np.testing.assert_array_equal(full_got, expect)


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_along_axis_matches_numpy_on_empty_shards(shape):
    """The corners the property test may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every Shard/Replicate layout of every mesh,
    every function along every axis (int64 for the sorts and scans, float64 for
    the rest); NumPy's value, or its exception type where NumPy raises (the
    median of nothing is NaN with a warning, an irfft of nothing an error)."""
    ndim = len(shape)
    full = np.arange(float(np.prod(shape))).reshape(shape) % 4 - 1
    for mesh, pls in corner_layouts(ndim, partial=False):
        dt = make(full, mesh, pls)
        for name, (call, _) in CALLS.items():
            floating = name.startswith(("fft", "ifft", "rfft", "irfft", "median",
                                        "percentile", "quantile", "nanmedian"))
            x, f = (dt, full) if floating else (dt.astype(np.int64), full.astype(np.int64))
            for axis in range(ndim):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    matches_or_raises_alike(lambda: call(x, axis), lambda: call(f, axis),
                                            check)


@pytest.mark.parametrize("indices", [False, True])
def test_sort_along_a_sharded_axis_with_no_lanes(indices):
    """A (0, 3) array sharded along its columns, sorted along them: no lane to
    sort, so each rank's block stays empty (stacking the lanes' results met an
    empty list)."""
    func = np.argsort if indices else np.sort
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        for shape, axis in (((0, 3), 1), ((3, 0, 4), 2)):
            full = np.zeros(shape)
            dt = make(full, mesh, (Shard(axis),) * mesh.ndim)
            check(func(dt, axis=axis), func(full, axis=axis))


@pytest.mark.parametrize("name", ["sort", "cumsum", "fft", "median", "percentile", "flip"])
def test_axis_not_sharded_keeps_the_shards(name):
    call, _ = CALLS[name]
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        full = np.random.default_rng(3).normal(size=(2 * W + 1, 6))
        pls = (S0,) if mesh.ndim == 1 else (S0, S0)
        dt = make(full, mesh, pls)
        with CommDebugMode() as mode:
            got = call(dt, 1)
        assert mode.get_total_counts() == 0
        shard_dim = 1 if name == "percentile" else 0
        assert got.placements == (Shard(shard_dim),) * mesh.ndim
        check(got, call(full, 1))


@pytest.mark.usefixtures("strict_numpy")
def test_flattening_forms_and_errors():
    mesh = mesh_of((W,))
    full = np.random.default_rng(5).normal(size=(W + 2, 3))
    dt = make(full, mesh, [S0])
    for call in (lambda x: np.sort(x, axis=None), lambda x: np.cumsum(x),
                 lambda x: np.roll(x, 3), lambda x: np.median(x), lambda x: np.flip(x),
                 lambda x: np.fft.fft2(x), lambda x: np.argsort(x, axis=None)):
        check(call(dt), call(full))
    with pytest.raises(TypeError, match="numpy.percentile: q"):
        np.percentile(dt, dt)
    with pytest.raises(TypeError, match="out="):
        np.cumsum(dt, 0, out=dt)
    # an array prepend is joined along the axis, distributed (strict: no gather)
    check(np.diff(dt, prepend=np.ones((W + 2, 1))), np.diff(full, prepend=np.ones((W + 2, 1))))


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, None], ids=["int64", "bool", "int8"])
def test_cumsum_reduces_a_partial_sum_first_when_its_dtype_is_not_linear(dtype):
    """cumsum of a float Partial(sum) cast to int truncates (to bool, tests for
    zero) each rank's part before the parts are added, and of an int8 one
    accumulates in int64, where the parts would not wrap as the global int8 value
    does: NumPy's value on the global array needs the sum first."""
    mesh = mesh_of((W,))
    first = mesh.get_coordinate()[0] == 0
    if dtype is None:
        local = np.full((2, 3), 100, np.int8)
    elif dtype is np.bool_:  # parts that cancel: the global array is zeros
        local = np.full((2, 3), W - 1.0 if first else -1.0)
    else:  # 1.5 on every rank, each truncated to 1 alone
        local = np.full((2, 3), 1.5)
    x = DTensor.from_local(local, mesh, [Partial("sum")])
    full = x.full_tensor()
    for axis in (None, 0, 1):
        got = np.cumsum(x, axis=axis, dtype=dtype).full_tensor()
        want = np.cumsum(full, axis=axis, dtype=dtype)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int8, np.complex128, np.bool_])
@pytest.mark.parametrize("rows", [1, W + 1, 16 * W])
def test_scan_along_a_sharded_axis_sends_one_cross_section(name, dtype, rows):
    func = getattr(np, name)
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        rng = np.random.default_rng(rows)
        full = rng.integers(1, 3, size=(rows, 5)).astype(dtype)
        layouts = [(S0,)] if mesh.ndim == 1 else [(S0, S1), (S1, S0), (S0, PS)]
        for pls in layouts:
            # int8 adds in int64, where its parts would not wrap as its global
            # value does: that Partial is reduced first (test_cumsum_reduces_...).
            if (name == "cumprod" or dtype == np.int8) and PS in pls:
                continue
            dt = make(full, mesh, pls)
            with CommDebugMode() as mode:
                got = func(dt, axis=0)
            assert got.placements == pls
            assert set(mode.get_comm_counts()) <= {"exscan"}
            section = 5 * func(full[:1], axis=0).dtype.itemsize
            assert sum(mode.get_comm_bytes().values()) <= section
            check(got, func(full, axis=0))


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.uint8, np.complex64, None])
@pytest.mark.parametrize("shape", [(4 * W + 1,), (3 * W, 4, 2), (2, 3 * W + 1, 3)])
def test_scan_along_a_sharded_axis_of_any_width(name, dtype, shape):
    """Lanes of one element (a vector) and of whole rows (the axis leading or in the
    middle), dtypes NumPy promotes (int32 and uint8 to 64 bits) or keeps (float16,
    complex64), and an explicit dtype= (None: float64 in, complex128 out)."""
    func = getattr(np, name)
    ax = 1 if shape[0] == 2 else 0
    rng = np.random.default_rng(len(shape))
    full = rng.integers(1, 3, size=shape).astype(np.float64 if dtype is None else dtype)
    kwargs = {"dtype": np.complex128} if dtype is None else {}
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        pls = (Shard(ax),) if mesh.ndim == 1 else (Shard(ax), R)
        got = func(make(full, mesh, pls), axis=ax, **kwargs)
        assert got.placements == pls
        expect = func(full, axis=ax, **kwargs)
        if expect.dtype == np.float16:
            np.testing.assert_allclose(got.full_tensor().astype(np.float64),
                                       expect.astype(np.float64), rtol=2e-3)
            assert got.dtype == np.float16
        else:
            check(got, expect)


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32, np.uint16,
                                   np.complex128, np.bool_])
@pytest.mark.parametrize("ax", [0, 1, 2])
def test_scan_from_the_offset_of_the_shards_before(name, dtype, ax):
    """Each shard's scan starts from the totals of the shards before it, summed
    row by row (lanes of rows) or by NumPy's reduction (lanes of single
    elements): values as NumPy's for any axis, uneven shards, empty shards
    (a dim shorter than the ranks) and random values, floats within rounding,
    integers exactly (wrapping as NumPy's do)."""
    func = getattr(np, name)
    rng = np.random.default_rng(ax)
    for length in (1, W + 1, 5 * W + 3):
        shape = [3, 2, 4]
        shape[ax] = length
        if dtype == np.bool_:
            full = rng.integers(0, 2, size=shape).astype(bool)
        elif np.dtype(dtype).kind in "fc":
            full = (rng.standard_normal(shape) * (0.2 if name == "cumprod" else 1)
                    + (1 if name == "cumprod" else 0)).astype(dtype)
        else:
            full = rng.integers(0, 200 if name == "cumsum" else 7, size=shape).astype(dtype)
        for mesh_shape in mesh_shapes():
            mesh = mesh_of(mesh_shape)
            pls = (Shard(ax),) if mesh.ndim == 1 else (R, Shard(ax))
            got = func(make(full, mesh, pls), axis=ax)
            assert got.placements == pls
            expect = func(full, axis=ax)
            out = got.full_tensor()
            assert out.dtype == expect.dtype and out.shape == expect.shape
            if expect.dtype.kind in "fc":
                tol = 1e-5 if expect.dtype in (np.float32, np.complex64) else 1e-12
                np.testing.assert_allclose(out, expect, rtol=tol, atol=tol)
            else:
                np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("name", ["fft", "fftn", "sort", "median", "flip"])
def test_sharded_axis_moves_to_a_free_dim_by_one_all_to_all(name):
    calls = {"fft": lambda x: np.fft.fft(x, axis=0),
             "fftn": lambda x: np.fft.fftn(x, axes=(0, 1)),
             "sort": lambda x: np.sort(x, axis=0),
             "median": lambda x: np.median(x, axis=0),
             "flip": lambda x: np.flip(x, 0)}
    call = calls[name]
    mesh = mesh_of((W,))
    full = np.random.default_rng(4).normal(size=(2 * W + 1, 3, 4 * W))
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        got = call(dt)
    if W > 1:
        assert dict(mode.get_comm_counts()) == {"all_to_all_single": 1}
        # Each element moves at most once: never more than this rank's shard.
        assert sum(mode.get_comm_bytes().values()) <= dt.to_local().nbytes
    assert got.placements == ((Shard(1),) if name == "median" else (Shard(2),))
    check(got, call(full))
    # No free dim: sort and median run a sample sort (test_ops_sample_sort.py),
    # flip moves reversed runs of rows (test_ops_halo.py); the others gather the
    # lanes, as torch does.
    vec = make(full[:, 0, 0], mesh, [S0])
    with CommDebugMode() as mode:
        got = call(vec) if name not in ("fftn",) else np.fft.fft(vec)
    if name in ("sort", "median"):
        assert mode.get_comm_bytes().get("all_gather_into_tensor", 0) <= 16 * W * W
    elif name == "flip":
        assert set(mode.get_comm_counts()) <= {"all_to_all_single"}
    else:
        assert set(mode.get_comm_counts()) <= {"all_gather_into_tensor"}
    check(got, call(full[:, 0, 0]) if name != "fftn" else np.fft.fft(full[:, 0, 0]))


@pytest.mark.parametrize("func", [np.quantile, np.nanquantile, np.percentile,
                                  np.nanpercentile, np.median, np.nanmedian])
def test_quantiles_of_a_block_left_empty_by_the_move(func):
    """(7, W + 1) Shard(0) along axis 0 moves to Shard(1), where a rank of 3 or 4 is
    left no column: its empty result keeps q's dim (NumPy's nanquantile of no lanes
    drops it), so every rank agrees on the output instead of one raising alone."""
    g = np.random.default_rng(3).standard_normal((7, W + 1))
    x = make(g, mesh_of((W,)), [Shard(0)])
    q = [] if func in (np.median, np.nanmedian) else [[25.0, 50.0] if "percentile" in
                                                       func.__name__ else [0.25, 0.5]]
    got = func(x, *q, axis=0)
    np.testing.assert_allclose(got.full_tensor(), func(g, *q, axis=0), rtol=1e-12)
