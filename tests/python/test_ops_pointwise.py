"""The per-element NumPy functions that are not ufuncs (_pointwise.py), the ones that
read only shapes and dtypes (_metadata.py), the array API's scans and the nan scans
and product, and np.put / np.place in place (_put.py): NumPy's value bit for bit and its dtype on every rank, for every
layout of the suite's meshes on shapes that leave shards empty; nothing moves
for a Shard or Replicate input of the per-element and metadata functions, nor
for put and place by a plain mask; NumPy's
exception types for bad arguments."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from mpitensor import Partial, Replicate, Shard, strict
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import W, corner_layouts, make, matches_or_raises_alike, mesh_of, mesh_shapes

R, S0, S1 = Replicate(), Shard(0), Shard(1)
SHAPES = ((0, 3), (3, 0), (1, 3), (2, 1), (5, 4), (4, 7), (3, 2, 5))
SPECIAL = np.array([1.5, -2.5, np.nan, np.inf, -np.inf, 0.0, -0.0, 7.25, -3.0, 2.0, 1e300])


def exact(result, expect):
    """``result`` (a DTensor) is ``expect`` bit for bit: shape, dtype and bytes."""
    expect = np.asarray(expect)
    got = result.full_tensor()
    assert got.shape == expect.shape, (got.shape, expect.shape)
    assert got.dtype == expect.dtype, (got.dtype, expect.dtype)
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expect).tobytes(), \
        (got, expect)


def values(shape, kind):
    n = int(np.prod(shape))
    base = np.resize(SPECIAL, n).reshape(shape)
    if kind == "c":
        return base + 1j * np.resize(SPECIAL[::-1], n).reshape(shape) * (np.arange(n) % 3 == 0
                                                                       ).reshape(shape)
    if kind == "i":
        return (np.arange(n).reshape(shape) % 7 - 3).astype(np.int32)
    return base


def no_gather():
    w = warnings.catch_warnings()
    w.__enter__()
    warnings.simplefilter("error", GatherWarning)
    warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's own, on inf and nan
    return w


def plain(pls):
    return not any(p.is_partial() for p in pls)


ELEMENTWISE = [
    ("angle", lambda x: np.angle(x), "fic"),
    ("angle_deg", lambda x: np.angle(x, deg=True), "fc"),
    ("fix", np.fix, "fi"),
    ("i0", np.i0, "fi"),
    ("sinc", np.sinc, "fc"),
    ("iscomplex", np.iscomplex, "fic"),
    ("isreal", np.isreal, "fic"),
    ("isneginf", np.isneginf, "fi"),
    ("isposinf", np.isposinf, "fi"),
    ("nan_to_num", np.nan_to_num, "fic"),
    ("nan_to_num_kw", lambda x: np.nan_to_num(x, nan=-1.0, posinf=9.0, neginf=-9.0), "fc"),
    ("astype", lambda x: np.astype(x, np.float32), "fic"),
    ("digitize", lambda x: np.digitize(x.real if x.dtype.kind == "c" else x,
                                       np.array([-3.0, 0.0, 1.5, 2.0])), "fi"),
    ("digitize_right_down", lambda x: np.digitize(x, np.array([5, 2, 0, -1]), right=True), "fi"),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", ELEMENTWISE, ids=lambda o: o[0])
def test_elementwise_bit_for_bit(op, shape):
    _, func, kinds = op
    for kind in kinds:
        full = values(shape, kind)
        for mesh, pls in corner_layouts(len(shape)):
            dt = make(full, mesh, pls)
            # Partial parts sum to the value up to the sign of a zero.
            ref = full if plain(pls) else dt.full_tensor()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expect = func(ref)
            w = no_gather()
            try:
                with CommDebugMode() as mode:
                    got = func(dt)
            finally:
                w.__exit__(None, None, None)
            if plain(pls):
                assert mode.get_total_counts() == 0
                assert got.placements == pls
            exact(got, expect)


def test_real_if_close_and_nan_to_num_in_place():
    for mesh, pls in corner_layouts(2, partial=False):
        full = np.arange(12.0).reshape(4, 3) + 1e-16j
        dt = make(full, mesh, pls)
        w = no_gather()
        try:
            exact(np.real_if_close(dt), np.real_if_close(full))
            bumped = make(full + (np.arange(12).reshape(4, 3) == 11) * 1j, mesh, pls)
            exact(np.real_if_close(bumped), full + (np.arange(12).reshape(4, 3) == 11) * 1j)
            x = make(np.array([[np.nan, 1.0, np.inf]] * 4), mesh, pls)
            assert np.nan_to_num(x, copy=False) is x
            exact(x, np.nan_to_num(np.array([[np.nan, 1.0, np.inf]] * 4)))
            ints = make(np.arange(12).reshape(4, 3), mesh, pls)
            assert np.nan_to_num(ints, copy=False) is ints
        finally:
            w.__exit__(None, None, None)
    for mesh, pls in corner_layouts(2):
        if plain(pls):
            continue
        full = np.array([[np.inf, 1.0, 2.0]] * 4)
        x = make(full, mesh, pls)
        ref = x.full_tensor()
        w = no_gather()
        try:
            assert np.nan_to_num(x, copy=False, posinf=5.0) is x
            assert x.placements == pls
            exact(x, np.nan_to_num(ref, posinf=5.0))
        finally:
            w.__exit__(None, None, None)


def test_numpys_errors():
    mesh = mesh_of((W,))
    c = make(np.ones((4, 3), complex), mesh, (S0,))
    f = make(np.ones((4, 3)), mesh, (S0,))
    cases = [
        (lambda x: np.isposinf(x), c, np.ones((4, 3), complex)),
        (lambda x: np.isneginf(x), c, np.ones((4, 3), complex)),
        (lambda x: np.i0(x), c, np.ones((4, 3), complex)),
        (lambda x: np.digitize(x, [1, 2]), c, np.ones((4, 3), complex)),
        (lambda x: np.digitize(x, [3, 1, 2]), f, np.ones((4, 3))),
        (lambda x: np.digitize(x, [[1, 2]]), f, np.ones((4, 3))),
        (lambda x: np.astype(x, np.float32, device="gpu"), f, np.ones((4, 3))),
        (lambda x: np.cumulative_sum(x), f, np.ones((4, 3))),
        (lambda x: np.cumulative_sum(x, axis=2), f, np.ones((4, 3))),
        (lambda x: np.size(x, 2), f, np.ones((4, 3))),
        (lambda x: np.common_type(x), make(np.ones((4, 3), bool), mesh, (S0,)),
         np.ones((4, 3), bool)),
        (lambda x: np.can_cast(x, x), f, np.ones((4, 3))),
        (lambda x: np.linalg.vector_norm(x, ord="fro"), f, np.ones((4, 3))),
    ]
    for func, dt, full in cases:
        matches_or_raises_alike(lambda: func(dt), lambda: func(full),
                                compare=lambda got, expect: exact(got, expect))


def test_metadata_moves_nothing():
    for mesh, pls in corner_layouts(3):
        for full in (np.zeros((5, 0, 3), np.float32), np.zeros((3, 4, 2), np.int16)):
            dt = make(full, mesh, pls)
            other = make(np.zeros((4, 1), np.complex64), mesh, pls[:0] + (R,) * mesh.ndim)
            with CommDebugMode() as mode:
                assert np.ndim(dt) == np.ndim(full)
                assert np.shape(dt) == np.shape(full)
                assert np.size(dt) == np.size(full) and np.size(dt, 1) == np.size(full, 1)
                assert np.size(dt, (0, 2)) == np.size(full, (0, 2))
                assert np.iscomplexobj(dt) is np.iscomplexobj(full)
                assert np.isrealobj(dt) is np.isrealobj(full)
                assert np.common_type(dt, other) is np.common_type(full, np.zeros(1, np.complex64))
                assert np.result_type(dt, 3.0, np.int8) == np.result_type(full, 3.0, np.int8)
                for to in (np.float16, np.int8, np.float64):
                    for casting in ("safe", "same_kind", "unsafe"):
                        assert np.can_cast(dt, to, casting) == np.can_cast(full, to, casting)
                assert np.min_scalar_type(dt) == np.min_scalar_type(full)
                assert np.may_share_memory(dt, dt.T) and not np.may_share_memory(dt, dt.copy())
            assert mode.get_total_counts() == 0


def test_min_scalar_type_of_a_scalar_and_shares_memory():
    for shape in mesh_shapes():
        mesh = mesh_of(shape)
        for pls in ((R,) * mesh.ndim, (Partial("sum"),) * mesh.ndim):
            for value in (3, 300, -70000, 2.5, 1e300):
                full = np.array(value)
                dt = make(full, mesh, pls)
                assert np.min_scalar_type(dt) == np.min_scalar_type(full)
        dt = make(np.arange(24.0).reshape(6, 4), mesh, (S0,) * mesh.ndim)
        assert np.shares_memory(dt, dt.T) is True
        assert np.shares_memory(dt, dt.copy()) is False
        assert np.shares_memory(dt[:, :1], dt[:, 1:]) is False


def test_broadcast_arrays():
    for mesh, pls in corner_layouts(2):
        a_full = np.arange(15.0).reshape(5, 3)
        b_full = np.arange(3.0).reshape(1, 3) - 1
        a = make(a_full, mesh, pls)
        b = make(b_full, mesh, tuple(R if p == S0 else p for p in pls))
        w = no_gather()
        try:
            with CommDebugMode() as mode:
                got = np.broadcast_arrays(a, b)
            if plain(pls):
                assert mode.get_total_counts() == 0
        finally:
            w.__exit__(None, None, None)
        assert isinstance(got, tuple) and got[0] is a
        for g, e in zip(got, np.broadcast_arrays(a_full, b_full)):
            exact(g, e)


SCAN_SHAPES = ((0, 3), (1, 3), (2, 1), (5, 4), (7,), (0,), (3, 2, 5))


@pytest.mark.parametrize("shape", SCAN_SHAPES, ids=str)
def test_scans_and_nanprod(shape):
    n = int(np.prod(shape))
    # Small integers as floats: every sum and product is exact, so any order of
    # accumulation is NumPy's value to the bit.
    full = (np.arange(n) % 5 - 2).astype(np.float64).reshape(shape)
    full.reshape(-1)[::4] = np.nan
    ints = (np.arange(n) % 4 + 1).astype(np.int8).reshape(shape)
    for mesh, pls in corner_layouts(len(shape)):
        dt, di = make(full, mesh, pls), make(ints, mesh, pls)
        w = no_gather()
        try:
            for ax in range(len(shape)):
                for init in (False, True):
                    exact(np.cumulative_sum(di, axis=ax, include_initial=init),
                          np.cumulative_sum(ints, axis=ax, include_initial=init))
                    exact(np.cumulative_prod(di, axis=ax, include_initial=init),
                          np.cumulative_prod(ints, axis=ax, include_initial=init))
                    exact(np.cumulative_sum(dt, axis=ax, dtype=np.float32,
                                            include_initial=init),
                          np.cumulative_sum(full, axis=ax, dtype=np.float32,
                                            include_initial=init))
                exact(np.nancumsum(dt, axis=ax), np.nancumsum(full, axis=ax))
                exact(np.nancumprod(dt, axis=ax), np.nancumprod(full, axis=ax))
                exact(np.nanprod(dt, axis=ax), np.nanprod(full, axis=ax))
                exact(np.nanprod(di, axis=ax, keepdims=True), np.nanprod(ints, axis=ax,
                                                                          keepdims=True))
            exact(np.nanprod(dt), np.asarray(np.nanprod(full)))
            if len(shape) == 1:
                exact(np.cumulative_sum(dt), np.cumulative_sum(full))
                exact(np.cumulative_prod(di, include_initial=True),
                      np.cumulative_prod(ints, include_initial=True))
        finally:
            w.__exit__(None, None, None)


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_scan_along_a_sharded_axis_moves_lanes_not_the_array(mesh_shape):
    mesh = mesh_of(mesh_shape)
    full = (np.arange(64 * 8) % 3).astype(np.float64).reshape(64, 8)
    pls = (S0,) * mesh.ndim
    dt = make(full, mesh, pls)
    with CommDebugMode() as mode:
        got = np.cumulative_sum(dt, axis=0)
        nan = np.nancumsum(dt, axis=0)
    assert got.placements == pls and nan.placements == pls
    # What moves is a few lanes' totals per rank, not the 64 rows.
    assert sum(mode.get_comm_bytes().values()) <= 4 * W * 8 * 8
    exact(got, np.cumulative_sum(full, axis=0))
    exact(nan, np.nancumsum(full, axis=0))


def _none(got, expect):
    assert got is None and expect is None


def _after(func, full, *args):
    out = full.copy()
    func(out, *args)
    return out


@pytest.mark.parametrize("shape", ((0, 3), (1, 3), (5, 4), (7,), (3, 2, 5)), ids=str)
def test_put_writes_in_place_without_moving(shape):
    size = int(np.prod(shape))
    full = np.arange(size, dtype=np.float64).reshape(shape)
    cases = [([0, size - 1, 3, 3, -1, 5], [-1.5, -2.5, 7.0]), ([], [1.0]), ([2], []),
             ([4, 1, 4], [9, 8])]
    for mesh, pls in corner_layouts(len(shape), partial=False):
        for ind, v in cases:
            for mode in ("raise", "wrap", "clip"):
                ind2 = ind if mode == "raise" else ind + [size + 2, -size - 3]
                dt = make(full, mesh, pls)

                def ours():
                    with CommDebugMode() as m:
                        assert np.put(dt, ind2, v, mode=mode) is None
                    assert m.get_total_counts() == 0
                    return dt
                matches_or_raises_alike(ours, lambda: _after(np.put, full, ind2, v, mode),
                                        compare=exact)
    mesh = mesh_of((W,))
    dt, de = make(np.zeros((4, 3)), mesh, (S0,)), make(np.zeros((0, 3)), mesh, (S0,))
    bad = [(lambda x: np.put(x, [12], [1.0]), dt, np.zeros((4, 3))),
           (lambda x: np.put(x, [-13], [1.0]), dt, np.zeros((4, 3))),
           (lambda x: np.put(x, [0], [1.0], mode="x"), dt, np.zeros((4, 3))),
           (lambda x: np.put(x, [0], [1.0]), de, np.zeros((0, 3)))]
    for func, ours, full in bad:
        matches_or_raises_alike(lambda: func(ours), lambda: func(full.copy()), compare=_none)


@pytest.mark.parametrize("shape", ((0, 3), (1, 3), (5, 4), (7,), (3, 2, 5)), ids=str)
def test_place_by_a_plain_mask_moves_nothing_and_by_a_dtensor_mask_scans(shape):
    size = int(np.prod(shape))
    full = np.arange(size, dtype=np.float64).reshape(shape)
    mask = (np.arange(size) % 3 != 1).reshape(shape)
    for mesh, pls in corner_layouts(len(shape), partial=False):
        for vals in ([-1.0, -2.0, -3.0, -4.0, -5.0], [7], np.arange(100.0)):
            expect = _after(np.place, full, mask, vals)
            dt = make(full, mesh, pls)
            with CommDebugMode() as m:
                np.place(dt, mask, vals)
            assert m.get_total_counts() == 0
            exact(dt, expect)
            if all(p.is_replicate() or p == S0 for p in pls):
                dt, dm = make(full, mesh, pls), make(mask, mesh, pls)
                with warnings.catch_warnings():
                    warnings.simplefilter("error", GatherWarning)
                    np.place(dt, dm, vals)
                exact(dt, expect)
        dt = make(full, mesh, pls)
        matches_or_raises_alike(lambda: np.place(dt, mask, []),
                                lambda: np.place(full.copy(), mask, []),
                                compare=_none)
        matches_or_raises_alike(lambda: np.place(dt, make(mask, mesh, pls), []),
                                lambda: np.place(full.copy(), mask, []),
                                compare=_none)
        matches_or_raises_alike(lambda: np.place(dt, np.zeros(size, bool), []),
                                lambda: np.place(full.copy(), np.zeros(size, bool), []),
                                compare=_none)
        matches_or_raises_alike(lambda: np.place(dt, np.ones(size + 1, bool), [1.0]),
                                lambda: np.place(full.copy(), np.ones(size + 1, bool), [1.0]),
                                compare=_none)


@pytest.mark.parametrize("shape", ((0, 3), (1, 3), (5, 4), (7,), ()), ids=str)
def test_piecewise_with_constant_pieces(shape):
    full = values(shape, "f") if shape else np.array(-2.5)
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        ref = full if plain(pls) else dt.full_tensor()
        plain_pls = tuple(R if p.is_partial() else p for p in pls)
        lo, hi = make(ref < 0, mesh, plain_pls), make(ref > 5, mesh, plain_pls)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            with CommDebugMode() as mode:
                got = np.piecewise(dt, [lo, hi], [-1.0, 1.0, 0.5])
            if plain(pls):
                assert mode.get_total_counts() == 0, (pls, mode.get_comm_counts())
            if len(shape) == 1:  # one condition, not a list: NumPy takes it as [lo]
                exact(np.piecewise(dt, lo, [7, 9]), np.piecewise(ref, ref < 0, [7, 9]))
        exact(got, np.piecewise(ref, [ref < 0, ref > 5], [-1.0, 1.0, 0.5]))
    mesh = mesh_of((W,))
    dt = make(np.arange(6.0), mesh, (S0,))
    cond = make(np.arange(6.0) > 2, mesh, (S0,))
    matches_or_raises_alike(lambda: np.piecewise(dt, [cond], [1.0, 2.0, 3.0]),
                            lambda: np.piecewise(np.arange(6.0), [np.arange(6.0) > 2],
                                                 [1.0, 2.0, 3.0]), compare=exact)
    # A callable sees the whole selection, which no rank holds: it is gathered.
    centred = [lambda v: v - v.mean(), 0.0]
    with strict(), pytest.raises(TypeError):
        np.piecewise(dt, [cond], centred)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherWarning)
        exact(np.piecewise(dt, [cond], centred),
              np.piecewise(np.arange(6.0), [np.arange(6.0) > 2], centred))


@pytest.mark.parametrize("shape", ((0, 3), (1, 3), (5, 4), (7,)), ids=str)
def test_spaces_between_dtensor_endpoints(shape):
    n = int(np.prod(shape))
    lo = (np.arange(n) % 4 + 1.0).reshape(shape)
    hi = (np.arange(n) % 3 + 10.0).reshape(shape) * np.where(np.arange(n) % 2, 1, -1
                                                           ).reshape(shape)
    for mesh, pls in corner_layouts(len(shape)):
        dlo, dhi = make(lo, mesh, pls), make(hi, mesh, pls)
        ref_lo = lo if plain(pls) else dlo.full_tensor()
        ref_hi = hi if plain(pls) else dhi.full_tensor()
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            with CommDebugMode() as mode:
                np.linspace(dlo, dhi, 5, axis=-1)
                np.logspace(dlo, 2.0, 5, axis=0)
            if plain(pls):
                assert mode.get_total_counts() == 0
            for axis in (0, 1, -1):
                exact(np.linspace(dlo, dhi, 5, axis=axis), np.linspace(ref_lo, ref_hi, 5,
                                                                       axis=axis))
                exact(np.linspace(dlo, 3.0, 4, endpoint=False, axis=axis, dtype=np.float32),
                      np.linspace(ref_lo, 3.0, 4, endpoint=False, axis=axis,
                                  dtype=np.float32))
                exact(np.logspace(dlo, dhi, 3, base=2.0, axis=axis),
                      np.logspace(ref_lo, ref_hi, 3, base=2.0, axis=axis))
                exact(np.geomspace(dlo, dhi, 6, axis=axis),
                      np.geomspace(ref_lo, ref_hi, 6, axis=axis))
    mesh = mesh_of((W,))
    zero = np.arange(8.0)
    dz = make(zero, mesh, (S0,))
    matches_or_raises_alike(lambda: np.geomspace(dz, 10.0, 3),
                            lambda: np.geomspace(zero, 10.0, 3), compare=exact)
    matches_or_raises_alike(lambda: np.linspace(dz, 10.0, -1),
                            lambda: np.linspace(zero, 10.0, -1), compare=exact)
