"""np.intersect1d, np.setdiff1d, np.setxor1d, np.isin with sharded test elements,
and the array API's np.unique_values, unique_counts, unique_inverse and
unique_all on DTensors: NumPy's values, dtypes and order on every rank for every
layout of the suite's meshes (Partial included) on corner and uneven shapes; a
sharded input is never gathered (strict mode passes, and past the sample sort's
gather threshold the all-gathers carry a few numbers per rank, not the array)."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor._algorithms._sample_sort import GATHER_SORT_BYTES
from mpitensor.debug import CommDebugMode
from ops_helpers import CORNER_SHAPES, W, corner_layouts, make, mesh_of, next_layout
from test_ops_unique import one_mesh_dim, same

R, S0, S1 = Replicate(), Shard(0), Shard(1)
SHAPES = CORNER_SHAPES + ((7,), (5, 4), (3, 5, 2))


@contextlib.contextmanager
def gathers_allowed(mesh, *pls):
    """The warnings filter of a call: a GatherWarning fails the test unless some
    input is sharded along two mesh dims (those go to the fallback)."""
    with warnings.catch_warnings():
        ok = all(one_mesh_dim(mesh, p) for p in pls)
        warnings.simplefilter("error" if ok else "ignore", GatherWarning)
        yield


def same_tuple(got, want):
    """A namedtuple result: the same type and fields, each compared by ``same``."""
    assert type(got) is type(want), (type(got), type(want))
    same(tuple(got), tuple(want))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_set_operations_every_layout(shape):
    rng = np.random.default_rng(len(shape) + sum(shape))
    a = rng.integers(-2, 4, size=shape).astype(np.int64)
    b = rng.integers(0, 6, size=shape[::-1]).astype(np.float64)
    for mesh, pls in corner_layouts(len(shape)):
        other = next_layout(pls, len(shape))
        da, db = make(a, mesh, pls), make(b, mesh, other)
        with gathers_allowed(mesh, pls, other):
            for unique in (False, True):
                for idx in (False, True):
                    same(np.intersect1d(da, db, unique, idx), np.intersect1d(a, b, unique, idx))
                same(np.setxor1d(da, db, unique), np.setxor1d(a, b, unique))
            same(np.setdiff1d(da, db), np.setdiff1d(a, b))
            same(np.setdiff1d(db, [1.0, 7.0]), np.setdiff1d(b, [1.0, 7.0]))
            same(np.intersect1d([0, 3, 5], db), np.intersect1d([0, 3, 5], b))
            same(np.isin(da, db), np.isin(a, b))
            same(np.isin(db, da, invert=True), np.isin(b, a, invert=True))
            same(np.isin([[0, 1], [5, 9]], da), np.isin([[0, 1], [5, 9]], a))


@pytest.mark.parametrize("n", [0, 1, 4, 13, 5000])
def test_set_operations_with_nans_and_repeats(n):
    """NaNs are never equal, in NumPy's set operations; with assume_unique the
    repeats of inputs that break the promise are kept as NumPy's steps keep them."""
    rng = np.random.default_rng(n)
    a = np.where(rng.random(n) < 0.2, np.nan, rng.integers(0, 9, n).astype(np.float32))
    b = np.where(rng.random(n + 3) < 0.2, np.nan, rng.integers(0, 9, n + 3).astype(np.float64))
    mesh = mesh_of((W,))
    for pa, pb in [(S0, S0), (S0, R), (R, S0)]:
        da, db = make(a, mesh, [pa]), make(b, mesh, [pb])
        with warnings.catch_warnings(), mpitensor.strict():
            warnings.simplefilter("error", GatherWarning)
            for unique in (False, True):
                same(np.intersect1d(da, db, unique, True), np.intersect1d(a, b, unique, True))
                same(np.setxor1d(da, db, unique), np.setxor1d(a, b, unique))
            same(np.setdiff1d(da, db), np.setdiff1d(a, b))
            same(np.isin(da, db), np.isin(a, b))


def test_setdiff1d_assume_unique_keeps_the_first_arrays_order():
    rng = np.random.default_rng(3)
    a = rng.permutation(40).reshape(8, 5)
    b = rng.permutation(30)[:11]
    for mesh, pls in corner_layouts(2):
        da, db = make(a, mesh, pls), make(b, mesh, next_layout(pls, 1))
        with gathers_allowed(mesh, pls):
            same(np.setdiff1d(da, db, assume_unique=True), np.setdiff1d(a, b, assume_unique=True))


def test_large_set_operations_move_no_whole_array():
    mesh = mesh_of((W,))
    rng = np.random.default_rng(9)
    a, b = rng.integers(0, 3000, 40000), rng.integers(1000, 5000, 30000)
    da, db = make(a, mesh, [S0]), make(b, mesh, [S0])
    with warnings.catch_warnings(), mpitensor.strict():
        warnings.simplefilter("error", GatherWarning)
        for call in (lambda x, y: np.intersect1d(x, y, return_indices=True),
                     np.setdiff1d, np.setxor1d, np.isin):
            with CommDebugMode() as mode:
                got = call(da, db)
            same(got, call(a, b))
            nbytes = mode.get_comm_bytes()
            gathered = sum(v for k, v in nbytes.items() if "gather" in k)
            assert gathered < 64 * W * W, nbytes
            # The lookups and the sorts move each rank's part a few times, never
            # the whole of both arrays to every rank.
            assert sum(nbytes.values()) < 8 * (da.to_local().nbytes + db.to_local().nbytes) \
                + 4096 * W, nbytes
            if W > 1:
                assert mode.get_comm_counts()["all_to_all_single"] >= 2


def test_isin_keeps_the_elements_layout_and_checks_kind_on_every_rank():
    mesh = mesh_of((W,))
    a = np.arange(12).reshape(3, 4) % 5
    test = np.arange(0, 20, 3)
    da, dt = make(a, mesh, [S1]), make(test, mesh, [S0])
    got = np.isin(da, dt)
    assert got.placements == da.placements
    same(got, np.isin(a, test))
    same(np.isin(da, dt, kind="table"), np.isin(a, test, kind="table"))
    with pytest.raises(ValueError):
        np.isin(da, make(test.astype(float), mesh, [S0]), kind="table")
    with pytest.raises(ValueError):
        np.isin(da, dt, kind="hash")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unique_array_api_every_layout(shape):
    rng = np.random.default_rng(sum(shape) + 1)
    full = rng.integers(-3, 9, size=shape)
    for dtype in (np.int64, np.uint8, np.float64, np.bool_):
        x = full.astype(dtype)
        # A Partial(sum) of booleans has no parts that sum to the value.
        for mesh, pls in corner_layouts(len(shape), partial=dtype is not np.bool_):
            dx = make(x, mesh, pls)
            with gathers_allowed(mesh, pls):
                same(np.unique_values(dx), np.unique(x, equal_nan=False))
                same_tuple(np.unique_counts(dx), np.unique_counts(x))
                same_tuple(np.unique_inverse(dx), np.unique_inverse(x))
                same_tuple(np.unique_all(dx), np.unique_all(x))


@pytest.mark.parametrize("n,high", [(13, 5), (900, 2000), (5000, 40), (40000, 30),
                                    (40000, 3000)])
def test_unique_values_of_integers_is_sorted(n, high):
    """unique_values of integers comes sorted, as np.unique's and every other
    library's (NumPy's own hash order is not what its clients expect: a label
    encoder numbers the labels by it), and nothing larger than the result's
    bytes is gathered."""
    full = np.random.default_rng(n).integers(-high, high, n).astype(np.int32)
    mesh = mesh_of((W,))
    dx = make(full, mesh, [S0])
    with warnings.catch_warnings(), mpitensor.strict():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            got = np.unique_values(dx)
    same(got, np.unique(full))
    if full.nbytes > GATHER_SORT_BYTES:
        gathered = sum(v for k, v in mode.get_comm_bytes().items() if "gather" in k)
        assert gathered < full.nbytes, mode.get_comm_bytes()


@pytest.mark.parametrize("n", [0, 1, 13, 5000])
def test_unique_array_api_nans_each_a_value(n):
    rng = np.random.default_rng(n)
    full = np.where(rng.random(n) < 0.3, np.nan, rng.integers(0, 4, n).astype(np.float32))
    mesh = mesh_of((W,))
    for pls in [(S0,), (R,)]:
        dx = make(full, mesh, pls)
        with warnings.catch_warnings(), mpitensor.strict():
            warnings.simplefilter("error", GatherWarning)
            same(np.unique_values(dx), np.unique(full, equal_nan=False))
            same_tuple(np.unique_counts(dx), np.unique_counts(full))
            same_tuple(np.unique_all(dx), np.unique_all(full))
        # NumPy numbers NaNs in its unstable sort's order: the fallback answers.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GatherWarning)
            same_tuple(np.unique_inverse(dx), np.unique_inverse(full))


def test_unique_inverse_without_nans_moves_no_whole_array():
    full = np.random.default_rng(4).integers(0, 50, 40000).astype(np.float64)
    dx = make(full, mesh_of((W,)), [S0])
    with warnings.catch_warnings(), mpitensor.strict():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            got = np.unique_inverse(dx)
    same_tuple(got, np.unique_inverse(full))
    gathered = sum(v for k, v in mode.get_comm_bytes().items() if "gather" in k)
    assert gathered < 64 * W * W, mode.get_comm_bytes()
