"""Reductions that merge per-rank results (var, std, argmax, argmin, all, any,
np.linalg.norm): equal to NumPy on the full array, or raising NumPy's exception
type, for random shapes (uneven and empty shards), axes, keepdims, dtypes, meshes
and placements (Partial included), and on every run for the corner shapes that
leave shards empty in every layout; with communication proportional to the
result: np.var of a (2**20,) [Shard(0)] array sends under 1 KiB."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpitensor import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, corner_layouts, make, matches_or_raises_alike,
                         mesh_of, mesh_shapes, mesh_shapes_1d_2d, placements)

R, S0, S1 = Replicate(), Shard(0), Shard(1)


def check(got, expect, dtype):
    expect = np.asarray(expect)
    full = got.full_tensor()
    assert full.shape == expect.shape, (full.shape, expect.shape)
    assert full.dtype == expect.dtype, (full.dtype, expect.dtype)
    if expect.dtype.kind in "fc":
        rtol = 1e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-10
        np.testing.assert_allclose(full, expect, rtol=rtol, atol=rtol)
    else:
        np.testing.assert_array_equal(full, expect)


def draw_case(data, dtypes):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    shape = tuple(data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=3)))
    dtype = data.draw(st.sampled_from(dtypes))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    full = rng.integers(-4, 5, size=shape).astype(dtype)
    if np.dtype(dtype).kind == "c":
        full = full + 1j * rng.integers(-4, 5, size=shape)
    pls = placements(data.draw, len(shape), mesh.ndim)
    return mesh, shape, full, make(full, mesh, pls)


def corner_full(shape, k):
    """The array of a corner case: float64, int64 or complex128 by ``k``, values
    with ties, zeros and negatives."""
    full = (np.arange(int(np.prod(shape))).reshape(shape) % 3 - 1).astype(
        [np.float64, np.int64, np.complex128][k % 3])
    return full * (1 - 2j) if full.dtype.kind == "c" else full


def corner_axes(ndim):
    """None, every axis, and a tuple of the first and last (the whole array in 2-D)."""
    return [None, *range(ndim)] + ([(0, ndim - 1)] if ndim > 1 else [])


def _alike(full, ours, numpys):
    """Ours equals NumPy on the full array, or raises NumPy's exception type; the
    degrees-of-freedom warnings are NumPy's too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        matches_or_raises_alike(ours, numpys, lambda got, exp: check(got, exp, full.dtype))


def moment_case(full, dt, name, axis, keepdims, ddof):
    func = getattr(np, name)
    _alike(full, lambda: func(dt, axis=axis, ddof=ddof, keepdims=keepdims),
           lambda: func(full, axis=axis, ddof=ddof, keepdims=keepdims))
    _alike(full, lambda: getattr(dt, name)(axis, None, None, ddof, keepdims),
           lambda: func(full, axis=axis, ddof=ddof, keepdims=keepdims))


def arg_or_logical_case(full, dt, name, axis, keepdims):
    func = getattr(np, name)
    _alike(full, lambda: func(dt, axis=axis, keepdims=keepdims),
           lambda: func(full, axis=axis, keepdims=keepdims))
    _alike(full, lambda: getattr(dt, name)(axis=axis, keepdims=keepdims),
           lambda: func(full, axis=axis, keepdims=keepdims))


def norm_case(full, dt, kwargs, keepdims):
    _alike(full, lambda: np.linalg.norm(dt, keepdims=keepdims, **kwargs),
           lambda: np.linalg.norm(full, keepdims=keepdims, **kwargs))


@settings(max_examples=120)
@given(data=st.data())
def test_moments_match_numpy(data):
    mesh, shape, full, dt = draw_case(data, [np.float64, np.float32, np.int64,
                                             np.complex128])
    ndim = len(shape)
    axis = data.draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                               st.lists(st.integers(0, ndim - 1), unique=True,
                                        min_size=1).map(tuple)))
    keepdims = data.draw(st.booleans())
    ddof = data.draw(st.sampled_from([0, 1]))
    name = data.draw(st.sampled_from(["var", "std"]))
    moment_case(full, dt, name, axis, keepdims, ddof)


@settings(max_examples=120)
@given(data=st.data())
def test_arg_extremes_and_logicals_match_numpy(data):
    mesh, shape, full, dt = draw_case(data, [np.float64, np.float32, np.int64, np.int8,
                                             np.complex128, np.bool_])
    ndim = len(shape)
    name = data.draw(st.sampled_from(["argmax", "argmin", "all", "any"]))
    if name.startswith("arg"):
        axis = data.draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1)))
    else:
        axis = data.draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                                   st.lists(st.integers(0, ndim - 1), unique=True,
                                            min_size=1).map(tuple)))
    keepdims = data.draw(st.booleans())
    arg_or_logical_case(full, dt, name, axis, keepdims)


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_merged_reductions_match_numpy_on_empty_shards(shape):
    """The corners the property tests may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included),
    so that ranks hold no elements or the kept dims are empty; NumPy's value, or
    its exception type (argmax of an empty axis) on every rank."""
    ndim = len(shape)
    for k, (mesh, pls) in enumerate(corner_layouts(ndim)):
        full = corner_full(shape, k)
        dt = make(full, mesh, pls)
        for i, axis in enumerate(corner_axes(ndim)):
            keepdims = (i + k) % 2 == 1
            for name in ("var", "std"):
                moment_case(full, dt, name, axis, keepdims, (i + k) % 2)
            for name in ("all", "any") + (("argmax", "argmin") if type(axis) is not tuple
                                          else ()):
                arg_or_logical_case(full, dt, name, axis, keepdims)


def test_var_of_no_rows_sharded_by_column_is_empty():
    """A (0, 3) array sharded by column reduced along its columns: no output
    element, so no record to gather (the gather's reshape once met a size of zero
    it could not divide)."""
    mesh = mesh_of((W,))
    full = np.zeros((0, 3))
    dt = make(full, mesh, [S1])
    for keepdims in (False, True):
        for func in (np.var, np.std, np.argmax, np.argmin):
            out = func(dt, axis=1, keepdims=keepdims)
            check(out, func(full, axis=1, keepdims=keepdims), full.dtype)
    assert np.var(dt, axis=1).shape == (0,)


@settings(max_examples=80)
@given(data=st.data())
def test_norm_matches_numpy(data):
    mesh, shape, full, dt = draw_case(data, [np.float64, np.int64, np.complex128])
    ndim = len(shape)
    form = data.draw(st.sampled_from(["all", "vector", "matrix"]))
    keepdims = data.draw(st.booleans())
    if form == "all":
        kwargs = {}
    elif form == "vector":
        kwargs = {"axis": data.draw(st.integers(-ndim, ndim - 1)),
                  "ord": data.draw(st.sampled_from([None, 2, 1, 0, 3, np.inf, -np.inf]))}
    else:
        if ndim < 2:
            return
        axes = tuple(data.draw(st.permutations(range(ndim)))[:2])
        kwargs = {"axis": axes, "ord": data.draw(st.sampled_from(
            [None, "fro", 1, -1, np.inf, -np.inf]))}
    norm_case(full, dt, kwargs, keepdims)


def corner_norms(ndim):
    """The norms of a corner case: the whole array, vectors along the first and
    last axes, and matrices of the first two axes in both orders (and of the
    last and first in 3-D)."""
    out = [{}] + [{"axis": axis, "ord": o} for axis in sorted({0, ndim - 1})
                  for o in (None, 1, 0, 3, np.inf, -np.inf)]
    if ndim > 1:
        pairs = [(0, 1), (1, 0)] + ([(ndim - 1, 0)] if ndim > 2 else [])
        out += [{"axis": axes, "ord": o} for axes in pairs
                for o in ("fro", 1, -1, np.inf, -np.inf, 0)]
    return out


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_norm_matches_numpy_on_empty_shards(shape):
    """The corners the property test may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh. An empty axis gives
    a maximum of zero, as NumPy's norms start from zero; an order that is no
    matrix norm is NumPy's ValueError."""
    ndim = len(shape)
    for k, (mesh, pls) in enumerate(corner_layouts(ndim)):
        full = corner_full(shape, k)
        dt = make(full, mesh, pls)
        for i, kwargs in enumerate(corner_norms(ndim)):
            norm_case(full, dt, kwargs, (i + k) % 2 == 1)


def test_matrix_norm_of_fewer_rows_than_the_mesh():
    """A (1, 1, 2) array placed [Shard(0), Replicate()] on a 2-D mesh leaves half the
    ranks without rows; its matrix norms over the first two axes reshape the
    reduced result, which must move data instead of taking a strided view with a
    split factor of zero."""
    mesh = mesh_of((2, 2) if W == 4 else (W, 1))
    full = np.array([[[3.0, -4.0]]])
    for pls in ((S0, R), (S0, Shard(2)), (S1, S0)):
        dt = make(full, mesh, pls)
        for ord_, axes in ((1, (0, 1)), (-1, (0, 1)), (np.inf, (1, 0)), (-np.inf, (1, 0))):
            check(np.linalg.norm(dt, ord=ord_, axis=axes),
                  np.linalg.norm(full, ord=ord_, axis=axes), full.dtype)
    assert np.linalg.norm(make(full, mesh, (S0, R)), ord=1, axis=(0, 1)).shape == (2,)


def test_var_of_a_sharded_vector_sends_under_a_kib():
    mesh = mesh_of((W,))
    full = np.random.default_rng(1).normal(size=2 ** 20)
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        v, s = np.var(dt), dt.std(ddof=1)
    assert sum(mode.get_comm_bytes().values()) < 1024
    assert set(mode.get_comm_counts()) <= {"all_gather_into_tensor"}
    np.testing.assert_allclose(v.full_tensor(), np.var(full), rtol=1e-12)
    np.testing.assert_allclose(s.full_tensor(), np.std(full, ddof=1), rtol=1e-12)
    assert v.placements == (R,)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float64])
def test_var_of_a_whole_array_larger_than_a_block(dtype):
    """The deviations of a whole real array are summed block by block: several
    blocks per rank, a last one partly filled, uneven shards, integer and bool
    inputs cast to float64 as NumPy does, and a local part that is not C-ordered."""
    mesh = mesh_of((W,))
    rng = np.random.default_rng(3)
    full = (rng.normal(size=(101 * W + 1, 997)) * 50).astype(dtype)
    for dt in (make(full, mesh, [S0]), make(np.asfortranarray(full), mesh, [S1])):
        rtol = 1e-5 if dtype == np.float32 else 1e-11
        np.testing.assert_allclose(np.var(dt).full_tensor(), np.var(full), rtol=rtol)
        np.testing.assert_allclose(dt.std(ddof=1).full_tensor(), np.std(full, ddof=1),
                                   rtol=rtol)


@pytest.mark.parametrize("name", ["argmax", "argmin", "all", "any", "var"])
def test_reducing_a_sharded_axis_moves_the_result_only(name):
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        full = np.random.default_rng(2).normal(size=(64 * W + 3, 5))
        if name in ("all", "any"):
            full = full > (-2.0 if name == "all" else 2.0)
        pls = (S0,) if mesh.ndim == 1 else (S0, S1)
        dt = make(full, mesh, pls)
        with CommDebugMode() as mode:
            out = getattr(np, name)(dt, axis=0)
        # Per output element at most a value and an index (16 B) from each rank.
        assert sum(mode.get_comm_bytes().values()) <= 5 * 24 * W
        if name in ("all", "any"):
            # A bool Partial, as torch keeps one: nothing moves until it is read.
            assert mode.get_total_counts() == 0
            partial = Partial("min" if name == "all" else "max")
            assert out.placements == ((partial,) if mesh.ndim == 1 else (partial, S0))
        elif mesh.ndim == 2:
            assert out.placements == (R, S0)
        check(out, getattr(np, name)(full, axis=0), full.dtype)


@pytest.mark.parametrize("name", ["all", "any"])
def test_all_and_any_of_the_whole_array_leave_a_bool_partial_per_sharding_mesh_dim(name):
    """The whole array reduced (a mask asked ``if np.any(mask)``): each mesh dim
    that shards a dim leaves the bool Partial, a Replicate stays, a Partial input
    is reduced first (to whichever layout the executor finds cheapest, a bool
    Partial left where it shards); the same layout whether or not the call is the
    first of its kind, and NumPy's value."""
    partial = Partial("min" if name == "all" else "max")
    func = getattr(np, name)
    for mesh_shape in mesh_shapes_1d_2d():
        mesh = mesh_of(mesh_shape)
        full = np.random.default_rng(3).normal(size=(2 * W + 1, 3)) > -2.5
        two = mesh.ndim == 2
        for pls, expect in (((S0, R) if two else (S0,), (partial, R) if two else (partial,)),
                            ((R, S1) if two else (R,), (R, partial) if two else (R,))):
            dt = make(full, mesh, pls)
            for _ in range(2):
                with CommDebugMode() as mode:
                    out = func(dt)
                assert mode.get_total_counts() == 0
                assert out.placements == expect and out.shape == () and out.dtype == bool
                assert bool(out) == bool(func(full))
        pair = make(np.stack([full, full]).astype(np.int64), mesh, (S0, R) if two else (S0,))
        part = np.sum(pair, axis=0)
        assert part.placements[0] == Partial()
        out = func(part)
        assert bool(out) == bool(func(full))
        assert Partial() not in out.placements and out.dtype == bool
        assert set(out.placements) <= {partial, R}


def test_argmax_ties_and_nans_take_the_lowest_index():
    mesh = mesh_of((W,))
    full = np.zeros(3 * W + 1)
    full[[2, W + 1, 3 * W]] = 5.0
    dt = make(full, mesh, [S0])
    assert int(np.argmax(dt)) == 2
    full[[W, 3 * W - 1]] = np.nan
    dt = make(full, mesh, [S0])
    assert int(np.argmax(dt)) == W and int(np.argmin(dt)) == W
    with pytest.raises(ValueError, match="empty sequence"):
        np.argmax(make(np.zeros((0, 3)), mesh, [S1]), axis=0)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.complex64, np.int8, np.bool_])
def test_arg_extremes_along_a_leading_axis_keep_numpys_order(dtype):
    """Along an axis with whole rows after it (the lanes' kernel): ties to the first
    index, the first NaN as the extreme (in either part of a complex number),
    sharded or not."""
    rng = np.random.default_rng(4)
    full = rng.integers(0, 3, size=(3 * W + 2, 4, 3)).astype(dtype)
    if full.dtype.kind in "fc":
        full[[1, W + 1, 3 * W], 1, 2] = np.nan
        full[W, 2, 0] = np.nan
    if full.dtype.kind == "c":
        full[2, 3, 1] = complex(1, np.nan)
        full = full + 1j * rng.integers(0, 2, size=full.shape)
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        for pls in ([S0, S1], [S1, S0]) if mesh.ndim == 2 else ([S0], [S1], [R]):
            dt = make(full, mesh, pls)
            for axis in (0, 1):
                for name in ("argmax", "argmin"):
                    expect = getattr(np, name)(full, axis=axis)
                    check(getattr(np, name)(dt, axis=axis), expect, full.dtype)
                    check(getattr(np, name)(dt, axis=axis, keepdims=True),
                          np.expand_dims(expect, axis), full.dtype)


@pytest.mark.usefixtures("strict_numpy")
def test_norm_without_a_rule_names_itself():
    dt = make(np.ones((W, 2)), mesh_of((W,)), [S0])
    with pytest.raises(TypeError, match=r"numpy\.linalg\.norm: ord='nuc'"):
        np.linalg.norm(dt, "nuc")


@pytest.mark.world(3, 4, reason="needs a rank outside a two-rank mesh")
def test_ranks_outside_the_mesh_get_the_same_spec_and_no_data():
    mesh = DeviceMesh("cpu", [0, 1])
    full = np.arange(35.0).reshape(7, 5)
    dt = distribute_tensor(full, mesh, [S0])
    calls = [lambda x: np.var(x), lambda x: np.std(x, 0, keepdims=True),
             lambda x: np.argmax(x), lambda x: np.argmin(x, 0), lambda x: np.all(x > 3, 0),
             lambda x: np.any(x > 3), lambda x: np.linalg.norm(x),
             lambda x: np.cumsum(x, 0), lambda x: np.sort(x, 0), lambda x: np.median(x, 1)]
    member = mesh.get_coordinate() is not None
    for call in calls:
        out = call(dt)
        expect = call(full)
        assert out.shape == np.shape(expect)
        if member:
            check(out, expect, full.dtype)
        else:  # as torch: a 0-d result is 0-d everywhere, anything else empty
            local = out.to_local()
            assert local.shape == () if out.shape == () else local.size == 0


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.uint8, np.int16])
def test_moments_and_scans_keep_numpys_dtypes(dtype):
    mesh = mesh_of((W,))
    full = (np.random.default_rng(0).normal(size=(2 * W + 1, 4)) * 10).astype(dtype)
    dt = make(full, mesh, [S0])
    calls = [lambda x: np.var(x, 0, dtype=np.float32), lambda x: np.std(x, ddof=2),
             lambda x: np.var(x, keepdims=True), lambda x: np.cumsum(x, 0),
             lambda x: np.cumsum(x, 0, dtype=np.float64)]
    for call in calls:
        got, expect = call(dt).full_tensor(), call(full)
        assert got.dtype == expect.dtype and got.shape == expect.shape
        np.testing.assert_allclose(got.astype(np.float64), expect.astype(np.float64),
                                   rtol=2e-3, atol=2e-2)
