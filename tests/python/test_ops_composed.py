"""NumPy functions run as NumPy's own steps over DTensor operations (rot90,
rollaxis, unstack, polyval, select, trapezoid, vdot), the ones that read shapes
only (tril/triu/diag_indices_from, einsum_path) and vander: NumPy's value on
every rank for Shard(0), Shard(1), Replicate and Partial(sum) layouts, uneven
shapes (a rank with no rows included) and a 2-D mesh; no gather (strict mode);
the shape-only ones and the local ones move nothing."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import (W, assert_matches, make, matches_or_raises_alike, mesh_of,
                         mesh_shapes)

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")
SHAPES = [(5, 3), (W * 2, 4), (1, 3), (3, 1)]


def layouts():
    """(mesh shape, placements) on every mesh of this run."""
    out = [((W,), (p,)) for p in (S0, S1, R, PS)]
    if W == 4:
        out += [((2, 2), pls) for pls in ((S0, S1), (S1, S0), (R, S0), (S0, PS))]
    return out


def arrays(shape, seed=0):
    return np.random.default_rng(seed).integers(-5, 6, shape).astype(np.float64)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_rearrangements_equal_numpys(shape, layout):
    mesh_shape, pls = layout
    full = arrays(shape)
    dt = make(full, mesh_of(mesh_shape), pls)
    with mt.strict():
        for k in (0, 1, 2, 3, -1):
            assert_matches(np.rot90(dt, k), np.rot90(full, k))
        assert_matches(np.rot90(dt, 1, axes=(1, 0)), np.rot90(full, 1, axes=(1, 0)))
        assert_matches(np.rollaxis(dt, 1), np.rollaxis(full, 1))
        for axis in (0, 1, -1):
            got, want = np.unstack(dt, axis=axis), np.unstack(full, axis=axis)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert_matches(g, w)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_polyval_select_trapezoid_vdot_equal_numpys(shape, layout):
    mesh_shape, pls = layout
    mesh = mesh_of(mesh_shape)
    full, other = arrays(shape), arrays(shape, 1)
    dt, do = make(full, mesh, pls), make(other, mesh, pls)
    with mt.strict():
        assert_matches(np.polyval([2.0, -1.0, 0.5], dt), np.polyval([2.0, -1.0, 0.5], full))
        assert_matches(np.polyval(np.array([3, 1]), dt), np.polyval(np.array([3, 1]), full))
        assert_matches(np.select([dt < 0, dt > 2], [do, 7], default=-1),
                       np.select([full < 0, full > 2], [other, 7], default=-1))
        assert_matches(np.select([dt > 0], [1], default=0.5),
                       np.select([full > 0], [1], default=0.5))
        for axis in (0, 1, -1):
            assert_matches(np.trapezoid(dt, axis=axis), np.trapezoid(full, axis=axis))
        xs = np.linspace(0.0, 2.0, shape[0])
        assert_matches(np.trapezoid(dt, x=xs, axis=0), np.trapezoid(full, x=xs, axis=0))
        assert_matches(np.trapezoid(dt, dx=0.25), np.trapezoid(full, dx=0.25))
        assert_matches(np.vdot(dt, do), np.vdot(full, other))
        z = make(full + 1j * other, mesh, pls)
        assert_matches(np.vdot(z, z), np.vdot(full + 1j * other, full + 1j * other))


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_vander_keeps_the_rows_of_its_input(layout):
    mesh_shape, pls = layout
    if any(p == S1 for p in pls):
        pytest.skip("a vector has no dim 1")
    mesh = mesh_of(mesh_shape)
    for n in (0, 1, 5, W * 3 + 1):
        full = np.arange(n, dtype=np.int32) - 2
        dt = make(full, mesh, pls)
        for N, inc in ((None, False), (3, True), (0, False), (1, True)):
            with CommDebugMode() as comm, mt.strict():
                got = np.vander(dt, N, increasing=inc)
            assert_matches(got, np.vander(full, N, increasing=inc))
            if not any(p.is_partial() for p in pls):
                assert comm.get_total_counts() == 0
                assert got.placements == tuple(S0 if p == S0 else p for p in pls)
    matches_or_raises_alike(lambda: np.vander(make(np.ones(4), mesh, pls), -1),
                            lambda: np.vander(np.ones(4), -1))


def test_shape_only_functions_move_nothing():
    mesh = mesh_of((W,))
    for shape in ((4, 4), (3, 5), (3, 3, 3)):
        full = np.zeros(shape)
        dt = make(full, mesh, [S0])
        with CommDebugMode() as comm, mt.strict():
            if len(shape) == 2:
                for k in (-1, 0, 2):
                    for f in (np.tril_indices_from, np.triu_indices_from):
                        got, want = f(dt, k), f(full, k)
                        assert all(np.array_equal(g, w) for g, w in zip(got, want))
            matches_or_raises_alike(lambda: np.diag_indices_from(dt),
                                    lambda: np.diag_indices_from(full),
                                    lambda g, w: all(map(np.array_equal, g, w)))
        assert comm.get_total_counts() == 0
    a, b = make(np.ones((3, 4)), mesh, [S0]), make(np.ones((4, 5)), mesh, [S1])
    with CommDebugMode() as comm:
        got = np.einsum_path("ij,jk->ik", a, b, optimize="optimal")
    assert got == np.einsum_path("ij,jk->ik", np.ones((3, 4)), np.ones((4, 5)),
                                 optimize="optimal")
    assert comm.get_total_counts() == 0


def test_bad_arguments_raise_numpys_errors():
    mesh = mesh_of((W,))
    full = np.ones((4, 3))
    dt = make(full, mesh, [S0])
    cases = [
        (lambda x: np.rot90(x, axes=(0, 0)), ValueError),
        (lambda x: np.rot90(x, axes=(0, 5)), ValueError),
        (lambda x: np.rot90(x, axes=(0,)), ValueError),
        (lambda x: np.rollaxis(x, 5), np.exceptions.AxisError),
        (lambda x: np.select([x > 0], [x, x]), ValueError),
        (lambda x: np.select([], []), ValueError),
        (lambda x: np.select([x], [x]), TypeError),
        (lambda x: np.vander(x), ValueError),
        (lambda x: np.tril_indices_from(x[0]), ValueError),
        (lambda x: np.diag_indices_from(x), ValueError),
    ]
    for call, kind in cases:
        with pytest.raises(kind):
            call(full)
        with pytest.raises(kind):
            call(dt)


@pytest.mark.parametrize("n", [0, 1, 7, 6 * W + 1])
@pytest.mark.parametrize("pl", [S0, R], ids=str)
def test_lexsort_and_sort_complex_equal_numpys(n, pl):
    """lexsort by stable argsorts and picks (ties, NaN and empty blocks included);
    sort_complex casts as NumPy does."""
    mesh = mesh_of((W,))
    rng = np.random.default_rng(n)
    a, c = rng.integers(0, 3, n), rng.integers(0, 2, n).astype(np.int16)
    b = rng.integers(0, 3, n).astype(np.float64)
    b[::5] = np.nan
    keys = tuple(make(k, mesh, [pl]) for k in (a, b, c))
    with mt.strict():  # the sorts' all-gathers are their splitters, not the keys
        got = np.lexsort(keys)
    assert np.array_equal(got.full_tensor(), np.lexsort((a, b, c)))
    for k, full in zip(keys, (a, b, c)):
        want = np.sort_complex(full)
        got = np.sort_complex(k).full_tensor()
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
    with pytest.raises(ValueError):
        np.lexsort((keys[0], make(np.zeros(n + 1), mesh, [pl])))


@pytest.mark.parametrize("pl", [S0, S1, R], ids=str)
def test_lexsort_of_one_dtensor_takes_its_rows_as_keys(pl):
    """A 2-D DTensor's rows are the keys, as NumPy's."""
    mesh = mesh_of((W,))
    rng = np.random.default_rng(3)
    full = rng.integers(0, 3, (3, 4 * W + 1))
    with mt.strict():
        got = np.lexsort(make(full, mesh, [pl]))
    assert np.array_equal(got.full_tensor(), np.lexsort(full))


@pytest.mark.parametrize("n", [1, 2, 9, 5 * W + 3])
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_unwrap_equals_numpys(n, layout):
    mesh_shape, pls = layout
    rng = np.random.default_rng(n)
    phases = np.angle(np.exp(1j * np.cumsum(rng.uniform(-2.5, 2.5, (n, 3)), axis=0)))
    ints = rng.integers(0, 12, (n, 3))
    mesh = mesh_of(mesh_shape)
    with mt.strict():
        for axis in (0, 1):
            assert_matches(np.unwrap(make(phases, mesh, pls), axis=axis),
                           np.unwrap(phases, axis=axis))
            assert_matches(np.unwrap(make(ints, mesh, pls), period=6, axis=axis),
                           np.unwrap(ints, period=6, axis=axis))


def test_tensorinv_and_tensorsolve_equal_numpys():
    mesh = mesh_of((W,))
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 2, 3))
    b = rng.standard_normal((2, 3, 6))
    rhs = rng.standard_normal((2, 3))
    with mt.strict():
        assert_matches(np.linalg.tensorinv(make(a, mesh, [S0]), ind=1),
                       np.linalg.tensorinv(a, ind=1))
        assert_matches(np.linalg.tensorsolve(make(b, mesh, [S0]), make(rhs, mesh, [S0])),
                       np.linalg.tensorsolve(b, rhs))
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.tensorsolve(make(b[:, :, :5], mesh, [S0]), make(rhs, mesh, [S0]))
    with pytest.raises(ValueError):
        np.linalg.tensorinv(make(a, mesh, [S0]), ind=0)


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_trim_zeros_and_fill_diagonal_equal_numpys(layout):
    mesh_shape, pls = layout
    mesh = mesh_of(mesh_shape)
    vec_pls = tuple(S0 if p == S1 else p for p in pls)
    with mt.strict():
        for full, lp in ((np.array([0, 0, 3, 1, 0, 2, 0]), vec_pls), (np.zeros(5), vec_pls),
                         (np.array([[0, 0, 0], [0, 1, 0], [0, 2, 0], [0, 0, 0]]), pls)):
            for trim in ("fb", "f", "b"):
                assert_matches(np.trim_zeros(make(full, mesh, lp), trim),
                               np.trim_zeros(full, trim))
        assert_matches(np.trim_zeros(make(np.eye(3), mesh, pls), axis=1),
                       np.trim_zeros(np.eye(3), axis=1))
    if any(p.is_partial() for p in pls):
        return  # fill_diagonal of a Partial is the fallback's
    for shape, wrap in (((5, 5), False), ((7, 3), True), ((7, 3), False), ((3, 6), False)):
        full = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
        dt = make(full, mesh, pls)
        with CommDebugMode() as comm, mt.strict():
            np.fill_diagonal(dt, [-1.0, -2.0], wrap=wrap)
        np.fill_diagonal(full, [-1.0, -2.0], wrap=wrap)
        assert comm.get_total_counts() == 0
        assert_matches(dt, full)
    with pytest.raises(ValueError):
        np.fill_diagonal(make(np.zeros((2, 3, 2)), mesh, (R,) * len(mesh_shape)), 1.0)
    with pytest.raises(ValueError):
        np.trim_zeros(make(np.ones(3), mesh, (R,) * len(mesh_shape)), "x")


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_choose_and_index_conversions_equal_numpys(layout):
    """choose, unravel_index and ravel_multi_index element by element; an index
    out of bounds on one rank's block only is NumPy's ValueError on every rank."""
    mesh_shape, pls = layout
    mesh = mesh_of(mesh_shape)
    rng = np.random.default_rng(4)
    a = rng.integers(0, 3, (5, 3))
    x, y, z = rng.standard_normal((3, 5, 3))
    flat = rng.integers(0, 20, (5, 3))
    d = lambda v: make(v, mesh, pls)  # noqa: E731
    with mt.strict():
        assert_matches(np.choose(d(a), [d(x), d(y), d(z)]), np.choose(a, [x, y, z]))
        assert_matches(np.choose(d(a + 4), [d(x), d(y)], mode="wrap"),
                       np.choose(a + 4, [x, y], mode="wrap"))
        for order in ("C", "F"):
            for got, want in zip(np.unravel_index(d(flat), (4, 5), order=order),
                                 np.unravel_index(flat, (4, 5), order=order)):
                assert_matches(got, want)
            assert_matches(np.ravel_multi_index((d(a), d(a + 1)), (3, 4), order=order),
                           np.ravel_multi_index((a, a + 1), (3, 4), order=order))
        assert_matches(np.ravel_multi_index((d(a + 5), d(a - 2)), (3, 4), mode=("wrap", "clip")),
                       np.ravel_multi_index((a + 5, a - 2), (3, 4), mode=("wrap", "clip")))
    bad = a.copy()
    bad[-1, -1] = 7  # on the last block only
    for ours, numpys in ((lambda: np.choose(d(bad), [d(x), d(y), d(z)]),
                          lambda: np.choose(bad, [x, y, z])),
                         (lambda: np.unravel_index(d(bad * 3), (2, 3)),
                          lambda: np.unravel_index(bad * 3, (2, 3))),
                         (lambda: np.ravel_multi_index((d(bad), d(a)), (3, 4)),
                          lambda: np.ravel_multi_index((bad, a), (3, 4)))):
        with pytest.raises(ValueError):
            numpys()
        with pytest.raises(ValueError):
            ours()
    with pytest.raises(TypeError):
        np.unravel_index(d(x), (4, 5))


@pytest.mark.parametrize("n", [W * 8, 61])
def test_polyfit_and_resize_equal_numpys(n):
    mesh = mesh_of((W,))
    rng = np.random.default_rng(n)
    x = np.linspace(-1.0, 2.0, n)
    y = 3 * x**2 - x + 0.5 + rng.normal(0, 0.1, n)
    w = np.abs(y) + 1
    d = lambda v: make(v, mesh, [S0])  # noqa: E731
    with mt.strict():
        np.testing.assert_allclose(np.polyfit(d(x), d(y), 2).full_tensor(),
                                   np.polyfit(x, y, 2), rtol=1e-9)
        c, cov = np.polyfit(d(x), d(y), 2, cov=True)
        np.testing.assert_allclose(cov.full_tensor(), np.polyfit(x, y, 2, cov=True)[1],
                                   rtol=1e-8)
        np.testing.assert_allclose(np.polyfit(d(x), d(y), 1, w=d(w)).full_tensor(),
                                   np.polyfit(x, y, 1, w=w), rtol=1e-9)
        got = np.polyfit(d(x), d(np.stack([y, -y], axis=1)), 1)
        np.testing.assert_allclose(got.full_tensor(),
                                   np.polyfit(x, np.stack([y, -y], axis=1), 1), rtol=1e-9)
        for shape in ((3, 4), 7, (0,), (2, 0)):
            assert_matches(np.resize(d(np.arange(5.0)), shape), np.resize(np.arange(5.0), shape))
    with pytest.raises(ValueError):
        np.polyfit(d(x), d(y), -1)
    with pytest.raises(TypeError):
        np.polyfit(d(x), d(y[:-1]), 1)


@pytest.mark.parametrize("pl", [S0, S1, R], ids=str)
def test_gradients_flow_through_the_composed_steps(pl):
    """Each composed function's steps record themselves: the gradient is the
    analytic one (and astype(copy=False) of the same dtype keeps the graph)."""
    mesh = mesh_of((W,))
    full = np.arange(12.0).reshape(4, 3)
    cases = [
        (lambda x: np.rot90(x).sum(), np.ones_like(full)),
        (lambda x: np.polyval([1.0, 0.0, 0.0], x).sum(), 2 * full),
        (lambda x: np.vdot(x, x), 2 * full),
        (lambda x: np.select([x > 5], [x * 3], default=1.0).sum(),
         np.where(full > 5, 3.0, 0.0)),
        (lambda x: np.trapezoid(x, axis=0).sum(),
         np.array([0.5, 1.0, 1.0, 0.5])[:, None] * np.ones((1, 3))),
        (lambda x: (x * 2).astype(np.float64, copy=False).sum(), np.full_like(full, 2.0)),
        (lambda x: np.rollaxis(x, 1).sum(), np.ones_like(full)),
        (lambda x: sum(t.sum() for t in np.unstack(x, axis=1)), np.ones_like(full)),
        (lambda x: np.resize(x, (5, 3)).sum(), np.array([[2.0] * 3] + [[1.0] * 3] * 3)),
    ]
    for f, want in cases:
        x = make(full, mesh, [pl])
        x.requires_grad_(True)
        f(x).backward()
        np.testing.assert_allclose(x.grad.full_tensor(), want)
    # a step without a backward rule is refused, never a lost gradient
    x = make(full, mesh, [pl])
    x.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="backward"):
        np.unwrap(x, axis=0)
