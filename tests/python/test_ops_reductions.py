"""Reductions on DTensors as NumPy functions and methods: full_tensor() equals
NumPy on the full array for random shapes (uneven included), axes (int, tuple,
None), keepdims, meshes and placements (Partial included); the placements a
reduction over a sharded axis gives, and no collective for x.sum(axis=1) on [S0]."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpitensor import DTensor, Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make,
                         matches_or_raises_alike, mesh_of, mesh_shapes, placements)

R, S0, S1 = Replicate(), Shard(0), Shard(1)
FUNCS = ["sum", "mean", "prod", "max", "min", "amax", "amin", "all", "any", "argmax",
         "argmin", "std", "var", "nansum"]
METHODS = {"sum", "mean", "prod", "max", "min", "all", "any", "argmax", "argmin", "std", "var"}


@settings(max_examples=60)
@given(data=st.data())
def test_reduction_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    name = data.draw(st.sampled_from(FUNCS))
    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    ndim = len(shape)
    if name in ("argmax", "argmin"):
        axis = data.draw(st.sampled_from([None] + list(range(-ndim, ndim))))
    else:
        axis = data.draw(st.one_of(
            st.none(), st.integers(-ndim, ndim - 1),
            st.lists(st.integers(0, ndim - 1), unique=True).map(tuple)))
    keepdims = data.draw(st.booleans())
    dtype = data.draw(st.sampled_from([np.float64, np.int64]))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    if name == "prod":
        full = rng.integers(1, 3, size=shape).astype(dtype)
    else:
        full = rng.integers(-9, 10, size=shape).astype(dtype)
    # A Partial input is only exact through linear reductions; others reduce it first.
    pls = placements(data.draw, ndim, mesh.ndim)
    dt = make(full, mesh, pls)
    func = getattr(np, name)
    expect = func(full, axis=axis, keepdims=keepdims)
    assert_matches(func(dt, axis=axis, keepdims=keepdims), expect)
    if name in METHODS:
        assert_matches(getattr(dt, name)(axis=axis, keepdims=keepdims), expect)


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_reduction_matches_numpy_on_empty_shards(shape):
    """The corners the property test may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included),
    each reduction along None, every axis and a pair (the method of one of them in
    turn: the methods reach the same code); NumPy's value, or its exception type
    where NumPy raises (max of an empty axis). amax and amin are max and min; the
    merged reductions have their own in test_ops_merge.py."""
    ndim = len(shape)
    axes = [None, *range(ndim)] + ([(0, ndim - 1)] if ndim > 1 else [])
    names = ("sum", "nansum", "mean", "prod", "max", "min")
    for k, (mesh, pls) in enumerate(corner_layouts(ndim)):
        full = (np.arange(int(np.prod(shape))).reshape(shape) % 3 - 1).astype(
            [np.float64, np.int64][k % 2])
        dt = make(full, mesh, pls)
        for i, axis in enumerate(axes):
            keepdims = (i + k) % 2 == 1
            method = names[(i + k) % len(names)]
            for name in names:
                func = getattr(np, name)
                calls = [lambda: func(dt, axis=axis, keepdims=keepdims)]
                if name == method and name in METHODS:
                    calls.append(lambda: getattr(dt, name)(axis=axis, keepdims=keepdims))
                for call in calls:
                    with warnings.catch_warnings():  # the mean of nothing, as NumPy
                        warnings.simplefilter("ignore", RuntimeWarning)
                        matches_or_raises_alike(
                            call, lambda: func(full, axis=axis, keepdims=keepdims))


def test_positional_and_extra_arguments():
    mesh = mesh_of((W,))
    full = np.arange(30.0).reshape(5, 6)
    dt = make(full, mesh, [S0])
    assert_matches(np.sum(dt, 0), full.sum(0))
    assert_matches(dt.sum(1, np.float32), full.sum(1, np.float32))
    assert_matches(np.std(dt, axis=0, ddof=1), np.std(full, axis=0, ddof=1))
    assert_matches(dt.var(None, None, None, 1), full.var(None, None, None, 1))
    assert_matches(np.mean(dt, dtype=np.float32), np.mean(full, dtype=np.float32))


@pytest.mark.parametrize("dtype", [np.int64, np.bool_], ids=["int64", "bool"])
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_a_dtype_cast_that_is_not_linear_reduces_a_partial_sum_first(name, dtype):
    """Casting each rank's part of a float Partial(sum) to int truncates it (to
    bool, tests it for zero) before the parts are added, which is not the cast of
    their sum: NumPy's value on the global array needs the sum first."""
    mesh = mesh_of((W,))
    first = mesh.get_coordinate()[0] == 0
    if dtype is np.bool_:  # parts that cancel: the global array is zeros
        local = np.full((2, 3), W - 1.0 if first else -1.0)
    else:  # 1.5 on every rank, each truncated to 1 alone
        local = np.full((2, 3), 1.5)
    x = DTensor.from_local(local, mesh, [Partial("sum")])
    full = x.full_tensor()
    func = getattr(np, name)
    for axis in (None, 0, 1):
        assert_matches(func(x, axis=axis, dtype=dtype), func(full, axis=axis, dtype=dtype))
    assert_matches(getattr(x, name)(dtype=dtype), func(full, dtype=dtype))


def test_sum_and_mean_of_an_int8_partial_sum_wrap_as_its_global_value_does():
    """An int8 Partial(sum)'s global value wraps in int8; np.sum adds int8 in int64
    and np.mean in float64, where the parts added one by one would not wrap."""
    mesh = mesh_of((W,))
    x = DTensor.from_local(np.full((3, 2), 100, np.int8), mesh, [Partial("sum")])
    full = x.full_tensor()
    for axis in (None, 0):
        assert_matches(np.sum(x, axis=axis), np.sum(full, axis=axis))
        assert_matches(np.mean(x, axis=axis), np.mean(full, axis=axis))
    assert_matches(x.sum(), full.sum())


def test_mean_of_float16_over_a_sharded_axis_adds_as_wide_as_numpy():
    """NumPy's mean of float16 adds in float32, so a mean of values near float16's
    largest is that value, not inf: the shards' means, a Partial(avg) moved nowhere,
    are added in float32 too when they are combined (all-reduce, reduce-scatter)."""
    mesh = mesh_of((W,))
    full = np.full((12, 2), 6e4, np.float16)
    x = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        out = np.mean(x, axis=0)
    assert mode.get_total_counts() == 0
    assert out.placements == (Partial("avg"),)
    assert_matches(out, np.mean(full, axis=0))
    assert_matches(out.redistribute(mesh, [S0]), np.mean(full, axis=0))
    assert_matches(np.mean(x), np.mean(full))
    assert_matches(x.mean(axis=0), full.mean(axis=0))


@pytest.mark.parametrize("name,op", [("sum", "sum"), ("mean", "avg"), ("max", "max"),
                                     ("min", "min"), ("prod", "product")])
def test_reducing_a_sharded_axis_gives_partial(name, op):
    mesh = mesh_of((W,))
    full = np.arange(1.0, 2.0 * W * 3 + 1).reshape(2 * W, 3) / 8
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        out = getattr(np, name)(dt, axis=0)
    assert mode.get_total_counts() == 0
    assert out.placements == (Partial(op),)
    assert_matches(out, getattr(np, name)(full, axis=0))


def test_sum_and_prod_over_empty_shards_stay_partial():
    """3 rows over W ranks leave the last ones empty at W = 4: their sum is 0 and
    their product 1, the identities, so the result stays Partial with no
    communication."""
    mesh = mesh_of((W,))
    full = np.arange(1.0, 7.0).reshape(3, 2) / 4
    dt = make(full, mesh, [S0])
    for name, op in (("sum", "sum"), ("prod", "product")):
        with CommDebugMode() as mode:
            out = getattr(np, name)(dt, axis=0)
        assert mode.get_total_counts() == 0
        assert out.placements == (Partial(op),)
        assert_matches(out, getattr(np, name)(full, axis=0))


def _numpy_outcome(call):
    try:
        return call(), None
    except ValueError as e:
        return None, str(e)


def _check_extreme(mesh, full, pls, axis, keepdims):
    """np.max/min/amax/amin and the methods of a DTensor laid out by ``pls`` match
    NumPy, moving at most one all-reduce of the output per mesh dim; NumPy's error
    when the reduced axis is empty."""
    dt = make(full, mesh, pls)
    for name in ("max", "min", "amax", "amin"):
        calls = [lambda f=getattr(np, name): f(dt, axis=axis, keepdims=keepdims)]
        if name in METHODS:
            calls.append(lambda n=name: getattr(dt, n)(axis=axis, keepdims=keepdims))
        expect, error = _numpy_outcome(
            lambda: getattr(np, name)(full, axis=axis, keepdims=keepdims))
        for call in calls:
            if error is not None:
                with pytest.raises(ValueError, match=error):
                    call()
                continue
            with CommDebugMode() as mode:
                out = call()
            counts = dict(mode.get_comm_counts())
            assert set(counts) <= {"all_reduce"} and counts.get("all_reduce", 0) <= mesh.ndim, (
                name, counts)
            assert_matches(out, expect)


@pytest.mark.parametrize("rows", ["W - 1", "W + 1"])
@pytest.mark.parametrize("dtype", [np.float64, np.int8, np.uint16])
def test_max_and_min_over_empty_shards_reduce_the_output_not_the_input(rows, dtype):
    """W - 1 rows over W ranks leave the last shard empty (W + 1 leaves one at
    W = 3 and 4): that rank gives the dtype's identity and the output is
    all-reduced (one all-reduce of its size); before, the input was gathered (a
    1-D array) or moved by an all-to-all. At W = 1, W - 1 rows are none: NumPy's
    "zero-size array ... has no identity" on every rank."""
    n = eval(rows, {"W": W})  # noqa: S307 - the test's own parameter
    mesh = mesh_of((W,))
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    full = np.random.default_rng(n).integers(-9 if info is None or info.min < 0 else 0, 10,
                                             size=(n, 3)).astype(dtype)
    if info is not None and n:
        full[-1, 0], full[0, 1] = info.min, info.max  # the identities themselves
    for axis in (0, None, (0, 1), -2):
        for keepdims in (False, True):
            _check_extreme(mesh, full, [S0], axis, keepdims)
    _check_extreme(mesh, full.T.copy(), [S1], 1, False)
    _check_extreme(mesh, full[:, 0].copy(), [S0], None, False)


def test_max_and_min_over_empty_shards_propagate_nan_and_raise_on_empty_axes():
    mesh = mesh_of((W,))
    full = np.arange(3.0 * max(W - 1, 1)).reshape(-1, 3)
    full[0, 1] = np.nan
    _check_extreme(mesh, full[:W - 1], [S0], 0, False)
    _check_extreme(mesh, np.zeros((0, 3)), [S0], 0, False)
    _check_extreme(mesh, np.zeros((3, 0)), [S0], 1, False)
    _check_extreme(mesh, np.zeros((3, 0)), [S0], 0, False)


@pytest.mark.world(4, reason="a (2, 2) mesh")
@pytest.mark.parametrize("pls", [(S0, S0), (S0, S1), (R, S0), (S1, S0)],
                         ids=["S0S0", "S0S1", "RS0", "S1S0"])
def test_max_and_min_over_empty_nested_shards(pls):
    """3 rows over [S0, S0] of a (2, 2) mesh cut 2, 1 and then 1, 1, 1, 0."""
    mesh = mesh_of((2, 2))
    full = np.random.default_rng(1).standard_normal((3, 1))
    for axis in (0, None, 1):
        _check_extreme(mesh, full, list(pls), axis, False)


def test_sum_over_unsharded_axis_no_communication():
    mesh = mesh_of((W,))
    full = np.arange(64.0).reshape(8, 8)
    x = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        y = x.sum(axis=1)
    assert mode.get_total_counts() == 0
    assert y.placements == (S0,)
    assert_matches(y, full.sum(axis=1))


def test_mean_over_uneven_shards_replicates_first():
    mesh = mesh_of((W,))
    full = np.arange(float((W + 1) * 2)).reshape(W + 1, 2)  # W+1 rows: uneven for W > 1
    out = np.mean(make(full, mesh, [S0]), axis=0)
    # one rank's single shard is even: it may stay Partial(avg) there
    assert not out.placements[0].is_partial() or W == 1
    assert_matches(out, full.mean(axis=0))


@pytest.mark.usefixtures("strict_numpy")
def test_unsupported_arguments():
    mesh = mesh_of((W,))
    dt = make(np.ones((4, 2)), mesh, [S0])
    with pytest.raises(ValueError, match="out= has shape"):
        np.sum(dt, out=dt)
    with pytest.raises(TypeError, match="numpy.sum"):  # strict(): no gather into it
        np.sum(dt, axis=0, out=np.zeros(2))
    out = make(np.zeros(2), mesh, [Replicate()])
    assert np.sum(dt, axis=0, out=out) is out
    assert_matches(out, np.full(2, 4.0))
    with pytest.raises(TypeError, match="initial="):
        np.sum(dt, initial=1.0)
    with pytest.raises(np.exceptions.AxisError):
        dt.sum(axis=2)


@pytest.fixture
def small_blocks(monkeypatch):
    """``small_blocks(name)``: the block size ``name`` of mpitensor._ops._reductions
    lowered to 0, so that small blocks take the path it guards, and handed to the C
    executor (which sends smaller blocks to ndarray's method directly); after the
    test, the sizes back and handed again."""
    from mpitensor._ops import _reductions

    def lower(name):
        monkeypatch.setattr(_reductions, name, 0)
        _reductions.register_locals()
    yield lower
    monkeypatch.undo()
    _reductions.register_locals()


@pytest.mark.parametrize("name", ["min", "max", "amin", "amax"])
@pytest.mark.parametrize("special", ["none", "nan", "inf", "-inf", "zero", "negzero", "mixed"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int16])
def test_extreme_along_an_axis_is_numpys_bits(name, special, dtype, small_blocks):
    """max/min down the rows of a tall local block run the lanes kernel (made to
    take blocks of few rows here): the bits are NumPy's with NaN, infinities and
    signed zeros in some columns."""
    from mpitensor._ops import _reductions
    if dtype is np.int16 and special != "none":
        pytest.skip("integers have no NaN, infinity or signed zero")
    small_blocks("_LANES_MIN_ROWS")
    rng = np.random.default_rng(3)
    full = rng.standard_normal((401, 30)) * 1000
    if special == "nan":
        full[7, 3] = np.nan
    elif special in ("inf", "-inf"):
        full[5, 2] = float(special)
    elif special == "zero":
        full[:, 4] = np.abs(full[:, 4])
        full[9, 4] = 0.0
    elif special == "negzero":
        # the two zeros compare equal: which one an extreme is follows the order
        full[:, 4] = np.abs(full[:, 4]) if name.endswith("min") else -np.abs(full[:, 4])
        full[9, 4], full[11, 4] = 0.0, -0.0
        full[5] = np.abs(full[5]) if name.endswith("min") else -np.abs(full[5])
        full[5, 0], full[5, 29] = 0.0, -0.0
    elif special == "mixed":
        full[1, 1], full[2, 2], full[3, 3] = np.nan, np.inf, -0.0
    full = full.astype(dtype)
    mesh = mesh_of((W,))
    func = getattr(np, name)
    for pls in ([R], [S0], [S1]):
        dt = make(full, mesh, pls)
        for axis in (0, 1, (0, 1)):
            got = func(dt, axis=axis).full_tensor()
            expect = func(full, axis=axis)
            assert got.tobytes() == np.asarray(expect).tobytes(), (pls, axis)
            if name in METHODS:
                got = getattr(dt, name)(axis=axis).full_tensor()
                assert got.tobytes() == np.asarray(expect).tobytes(), (pls, axis)


@pytest.mark.parametrize("name", ["all", "any"])
@pytest.mark.parametrize("mask", ["false", "true", "one-true", "one-false"])
def test_all_and_any_of_a_mask_of_one_value_are_numpys(name, mask, small_blocks):
    """all/any of a large boolean block that holds one value take two flat passes
    instead of NumPy's reduce (made to take small blocks here too): NumPy's
    result along each axis, keepdims too, also where one element differs."""
    small_blocks("_UNIFORM_MIN_SIZE")
    full = np.full((9, 4, 5), mask in ("true", "one-false"))
    if mask.startswith("one"):
        full[6, 2, 3] = not full[6, 2, 3]
    func = getattr(np, name)
    mesh = mesh_of((W,))
    for pls in ([R], [S0], [S1]):
        dt = make(full, mesh, pls)
        for axis in (0, 1, 2, (0, 2), (1, 2), None):
            for keepdims in (False, True):
                assert_matches(func(dt, axis=axis, keepdims=keepdims),
                               func(full, axis=axis, keepdims=keepdims))


@pytest.mark.parametrize("name", ["sum", "max", "min", "amax", "amin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("columns", [2, 3, 7, 8])
def test_a_short_last_axis_is_folded_with_numpys_bits(name, dtype, columns, monkeypatch,
                                                      small_blocks):
    """A reduction along a short last axis of a tall block folds its columns
    (scikit-learn's logsumexp over classes; made to take small blocks here too):
    the bits are NumPy's, with zeros of both signs, NaN and infinities, in C,
    Fortran and strided layouts, keepdims too; 8 columns take NumPy's reduce."""
    from mpitensor._ops import _reductions
    small_blocks("_FOLD_MIN_SIZE")
    folds = []
    fold = _reductions._fold
    monkeypatch.setattr(_reductions, "_fold", lambda *a, **k: folds.append(1) or fold(*a, **k))
    rng = np.random.default_rng(columns)
    shape = (3 * W + 50, columns)
    full = rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, shape)
    for value, share in ((0.0, 0.3), (-0.0, 0.3), (np.nan, 0.02), (np.inf, 0.02), (-np.inf, 0.02)):
        full[rng.random(full.shape) < share] = value
    full = full.astype(dtype)
    mesh = mesh_of((W,))
    func = getattr(np, name)
    local = make(full, mesh, [S0]).to_local()
    layouts = (lambda a: a, np.asfortranarray, lambda a: np.repeat(a, 2, axis=1)[:, ::2])
    with np.errstate(invalid="ignore"):
        for layout in layouts:
            # NumPy's own sum of 8 columns depends on the layout: compared alike
            dt = DTensor.from_local(layout(local), mesh, [S0], shape=full.shape,
                                    stride=(columns, 1))
            for kwargs in ({"axis": 1}, {"axis": -1, "keepdims": True}, {"axis": (1,)}):
                expect = np.asarray(func(layout(full), **kwargs))
                got = func(dt, **kwargs).full_tensor()
                assert got.dtype == expect.dtype and got.tobytes() == expect.tobytes(), kwargs
                if name in METHODS:
                    got = getattr(dt, name)(**kwargs).full_tensor()
                    assert got.tobytes() == expect.tobytes(), kwargs
    assert bool(folds) == (columns < 8 and dt.to_local().size > 0)


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("columns", [2, 7])
def test_a_folded_extreme_without_zeros_or_nan_is_numpys(name, columns, monkeypatch,
                                                         small_blocks):
    """Where no row's extreme is a zero or NaN, the fold's own extreme is the
    answer (the test above mostly sees NumPy's reduce, its rows having zeros and
    NaN): its bits are NumPy's."""
    from mpitensor._ops import _reductions
    small_blocks("_FOLD_MIN_SIZE")
    folds = []
    fold = _reductions._fold
    monkeypatch.setattr(_reductions, "_fold", lambda *a, **k: folds.append(1) or fold(*a, **k))
    rng = np.random.default_rng(columns)
    full = rng.uniform(1.0, 2.0, (3 * W + 50, columns)) * rng.choice([-1.0, 1.0], columns)
    got = getattr(np, name)(make(full, mesh_of((W,)), [S0]), axis=1).full_tensor()
    assert got.tobytes() == getattr(np, name)(full, axis=1).tobytes()
    assert folds


@pytest.mark.parametrize("name", ["std", "var"])
@pytest.mark.parametrize("pls", [[R], [S0], [S1]], ids=str)
def test_moments_take_the_array_apis_correction(name, pls):
    """``correction=`` (NumPy 2's other name for ddof, which SciPy passes) runs
    distributed, and with ``ddof=`` too it is NumPy's ValueError."""
    full = np.random.default_rng(4).standard_normal((9, 4))
    dt = make(full, mesh_of((W,)), pls)
    func = getattr(np, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a GatherWarning would fail the test
        for axis in (None, 0, 1):
            assert_matches(func(dt, axis=axis, correction=1),
                           func(full, axis=axis, correction=1))
            assert_matches(getattr(dt, name)(axis=axis, correction=1),
                           func(full, axis=axis, correction=1))
    matches_or_raises_alike(lambda: func(dt, ddof=1, correction=1),
                            lambda: func(full, ddof=1, correction=1))
