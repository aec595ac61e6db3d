"""Ufuncs on DTensors (operators, np.* ufuncs, scalars, broadcasting, out=): the
result equals NumPy on the full arrays for random shapes (uneven included), meshes
and placements (Partial included); the key placement outcomes and collective
counts; and the errors for mixed ndarrays, different meshes and unsupported calls."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpitensor import DTensor, Partial, Replicate, Shard, init_device_mesh
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make, mesh_of,
                         mesh_shapes, next_layout, placements)

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")
BINARY = [np.add, np.subtract, np.multiply, np.true_divide, np.maximum, np.minimum,
          np.power, np.greater, np.equal, np.floor_divide, np.arctan2, np.logical_and]
UNARY = [np.negative, np.positive, np.exp, np.abs, np.sqrt, np.sin, np.isfinite,
         np.floor, np.square, np.logical_not]
INT_OK = {np.add, np.subtract, np.multiply, np.maximum, np.minimum, np.greater,
          np.equal, np.floor_divide, np.logical_and, np.negative, np.positive,
          np.abs, np.square, np.logical_not}


@st.composite
def broadcast_pair(draw):
    out = draw(st.lists(st.integers(1, 7), min_size=0, max_size=3))
    shapes = []
    for _ in range(2):
        drop = draw(st.integers(0, len(out)))
        s = [1 if draw(st.booleans()) and draw(st.booleans()) else n for n in out[drop:]]
        shapes.append(tuple(s))
    return shapes


def values(rng, shape, dtype):
    if dtype == np.int64:
        return np.asarray(rng.integers(1, 9, size=shape), dtype=np.int64)
    return np.asarray(rng.uniform(0.5, 2.0, size=shape))


@settings(max_examples=40)
@given(data=st.data())
def test_binary_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    op = data.draw(st.sampled_from(BINARY))
    dtype = data.draw(st.sampled_from([np.float64, np.int64] if op in INT_OK else [np.float64]))
    sa, sb = data.draw(broadcast_pair())
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    a, b = values(rng, sa, dtype), values(rng, sb, dtype)
    da = make(a, mesh, placements(data.draw, a.ndim, mesh.ndim))
    db = make(b, mesh, placements(data.draw, b.ndim, mesh.ndim))
    assert_matches(op(da, db), op(a, b))


@settings(max_examples=40)
@given(data=st.data())
def test_unary_and_scalar_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=0, max_size=3)))
    dtype = data.draw(st.sampled_from([np.float64, np.int64]))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    a = values(rng, shape, dtype)
    da = make(a, mesh, placements(data.draw, a.ndim, mesh.ndim))
    ops = [op for op in UNARY if dtype == np.float64 or op in INT_OK]
    op = data.draw(st.sampled_from(ops))
    assert_matches(op(da), op(a))
    c = data.draw(st.sampled_from([2, 3.5, np.float32(1.5), np.int64(4), np.array(2.0)]))
    assert_matches(da + c, a + c)
    assert_matches(c - da, c - a)
    assert_matches(da * c, a * c)
    assert_matches(da / c, a / c)
    assert_matches(c / da, c / a)
    assert_matches(np.maximum(da, c), np.maximum(a, c))
    assert_matches(da ** 2, a ** 2)


POWER_DTYPES = [np.bool_, np.int8, np.uint8, np.int64, np.float16, np.float32, np.float64,
                np.complex64, np.complex128]
POWER_EXPONENTS = [2, -1, 0.5, 3, 2.0, -1.0, np.int64(2), np.float64(0.5), True]


def _power_outcome(f):
    """(dtype, bytes) of f(), or the type of its error."""
    try:
        with np.errstate(all="ignore"):
            r = f()
    except Exception as e:  # noqa: BLE001 - the outcome compared is the error's type
        return type(e)
    r = r.full_tensor() if isinstance(r, DTensor) else np.asarray(r)
    return r.dtype, r.tobytes()


@pytest.mark.parametrize("dtype", POWER_DTYPES, ids=lambda t: np.dtype(t).name)
def test_the_power_operator_takes_numpys_paths(dtype):
    """``x ** 2``, ``x ** -1`` and ``x ** 0.5`` are NumPy's square, reciprocal and
    sqrt for the exponents and dtypes NumPy takes them for (a bool squared is
    int8, a complex reciprocal's zeros keep their sign): the result's dtype and
    bytes are NumPy's, or its error, in every layout, and in place too."""
    full = (np.arange(12).reshape(3, 4) % 4 - (0 if dtype in (np.bool_, np.uint8) else 1))
    full = full.astype(dtype)
    for mesh, pls in corner_layouts(2, partial=False):
        for e in POWER_EXPONENTS:
            dt = make(full, mesh, pls)
            want = _power_outcome(lambda: full ** e)
            assert _power_outcome(lambda: dt ** e) == want, (pls, e)
            mine, theirs = dt.copy(), full.copy()

            def into_theirs():
                nonlocal theirs
                theirs **= e
                return theirs

            def into_mine():
                nonlocal mine
                mine **= e
                return mine

            assert _power_outcome(into_mine) == _power_outcome(into_theirs), (pls, e)


def test_conj_of_a_real_dtensor_is_the_dtensor_and_copy_takes_numpys_orders():
    """ndarray.conj() of a real array is the array itself (a bool stays bool, a
    write through it is a write into it); copy() takes every order NumPy takes and
    refuses the others with NumPy's errors."""
    mesh = mesh_of((W,))
    for full in (np.array([True, False, True, True, False]), np.arange(5.0)):
        dt = make(full, mesh, (Shard(0),))
        c = dt.conj()
        assert c is dt and c.dtype == full.conj().dtype
        c[1] = 1
        assert dt.full_tensor()[1] == 1
    z = make(np.arange(5.0) * 1j, mesh, (Shard(0),))
    assert_matches(z.conj(), (np.arange(5.0) * 1j).conj())
    assert z.conj() is not z
    for order in ("C", "F", "A", "K", "c", None):
        assert_matches(z.copy(order), np.arange(5.0) * 1j)
        assert_matches(np.copy(z, order=order), np.arange(5.0) * 1j)
    for order, error in (("X", ValueError), (3, TypeError)):
        with pytest.raises(error, match="order must be"):
            z.copy(order)
        with pytest.raises(error, match="order must be"):
            np.copy(z, order=order)


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_elementwise_matches_numpy_on_empty_shards(shape):
    """The corners the property tests may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included):
    the unary ufuncs, scalar operands, a second operand laid out otherwise and a
    broadcast row every rank holds."""
    ndim = len(shape)
    full = np.arange(float(np.prod(shape))).reshape(shape) % 3 + 0.5
    row = np.arange(1.0, shape[-1] + 1)
    for mesh, pls in corner_layouts(ndim):
        dt = make(full, mesh, pls)
        other = make(full[::-1] + 1, mesh, next_layout(pls, ndim))
        drow = make(row, mesh, (R,) * mesh.ndim)
        for f in UNARY:
            assert_matches(f(dt), f(full))
        assert_matches(2 - dt * 3, 2 - full * 3)
        assert_matches(dt + other, full + (full[::-1] + 1))
        assert_matches(np.maximum(other, dt), np.maximum(full[::-1] + 1, full))
        assert_matches(dt / drow, full / row)


@pytest.mark.parametrize("mesh_shape", mesh_shapes())
def test_out_and_inplace(mesh_shape):
    mesh = mesh_of(mesh_shape)
    a = np.arange(35.0).reshape(5, 7)
    b = np.arange(7.0)
    for pa in ([S0] * mesh.ndim, [S1] * mesh.ndim, [R] * mesh.ndim):
        da, db = make(a, mesh, pa), make(b, mesh, [R] * mesh.ndim)
        da += db
        assert tuple(da.placements) == tuple(pa)
        assert_matches(da, a + b)
        target = make(np.zeros((5, 7)), mesh, [S1] * mesh.ndim)
        res = np.multiply(make(a, mesh, pa), 2.0, out=(target,))
        assert res is target and tuple(target.placements) == (S1,) * mesh.ndim
        assert_matches(target, a * 2.0)


def test_partial_rules_placements():
    mesh = mesh_of((W,))
    one = np.ones((4, 4))
    p, r = make(one, mesh, [PS]), make(one, mesh, [R])
    expect_p = (PS,)
    with CommDebugMode() as mode:
        outs = [p + p, -p, p * r, p * 2.0, p / r, p / 2.0, p - p]
    assert mode.get_total_counts() == 0
    for o in outs:
        assert o.placements == expect_p
    assert_matches(p + 1.0, one + 1.0)  # the scalar is added once, not once per rank
    assert_matches(np.exp(p), np.exp(one))
    pm = DTensor.from_local(np.full((4,), float(mesh.get_rank())), mesh, [Partial("max")])
    assert np.maximum(pm, pm).placements == (Partial("max"),)
    assert_matches(np.maximum(pm, 0.5), np.maximum(np.full(4, W - 1.0), 0.5))


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_additive_rules_keep_partial_as_torch(mesh_shape):
    """torch's additive rules: P(sum) +- R keeps P(sum) with nothing moved (the
    Replicate operand counts once: exact for integers), P(avg|max) + R keeps the
    Partial (of floats: integers wrap, so theirs is reduced first), P(max) + P(max)
    is one all-reduce, R - P(max) is reduced first."""
    mesh = mesh_of(mesh_shape)
    nd = mesh.ndim
    a = np.arange(20, dtype=np.int64).reshape(4, 5) - 7
    b = np.arange(5, dtype=np.int64) * 3 + 1
    ps, r = make(a, mesh, [PS] * nd), make(b, mesh, [R] * nd)
    with CommDebugMode() as mode:
        outs = [(ps + r, a + b), (r + ps, b + a), (ps - r, a - b), (r - ps, b - a)]
    assert mode.get_total_counts() == 0
    wide = [m for m in range(nd) if mesh.shape[m] > 1]  # one rank: any tie
    for got, want in outs:
        assert all(got.placements[m] == PS for m in wide), got.placements
        assert_matches(got, want)
    rank = float(mesh.get_rank())
    pmax = DTensor.from_local(np.full((4, 5), rank), mesh, [Partial("max")] * nd)
    top = np.full((4, 5), W - 1.0)
    with CommDebugMode() as mode:
        kept = pmax + r
    assert mode.get_total_counts() == 0
    assert all(kept.placements[m] == Partial("max") for m in wide)
    assert_matches(kept, top + b)
    other = DTensor.from_local(np.full((4, 5), rank), mesh, [Partial("max")] * nd)
    with CommDebugMode() as mode:
        both = pmax + other
    assert all(both.placements[m] == Partial("max") for m in wide)
    assert sum(mode.get_comm_counts().values()) == mode.get_comm_counts()["all_reduce"]
    assert mode.get_comm_counts()["all_reduce"] == len(wide)  # one per mesh dim
    assert_matches(both, 2 * top)
    # The same DTensor twice moves once, so both operands are reduced by that one
    # move (a reduce-scatter, half an all-reduce's bytes) and nothing stays pending
    # (torch all-reduces one operand and keeps P(max)).
    with CommDebugMode() as mode:
        same = pmax + pmax
    assert not any(same.placements[m].is_partial() for m in wide), same.placements
    assert mode.get_total_counts() == len(wide)  # one per mesh dim
    assert_matches(same, 2 * top)
    flipped = r - pmax
    assert all(flipped.placements[m] != Partial("max") for m in wide)
    assert_matches(flipped, b - top)


def test_negating_or_shifting_an_int_partial_max_or_min_reduces_it_first():
    """Per rank, -x, x + r and x - r of an integer Partial(max|min) wrap where the
    reduced value does not (-(-128) is -128 in int8, 0 - 1 is 255 in uint8), so the
    order that turns -P(max) into P(min) and keeps P(max) + R breaks: the Partial
    is reduced first and the result is NumPy's on the global array. Floats keep
    the rewrite, with nothing moved."""
    mesh = mesh_of((W,))
    first = mesh.get_coordinate()[0] == 0
    pmax = DTensor.from_local(np.array([-128, 127] if first else [5, 0], np.int8), mesh,
                              [Partial("max")])
    pmin = DTensor.from_local(np.array([0, 9] if first else [200, 7], np.uint8), mesh,
                              [Partial("min")])
    top, low = pmax.full_tensor(), pmin.full_tensor()
    one8 = DTensor.from_local(np.ones(2, np.int8), mesh, [R])
    one_u8 = DTensor.from_local(np.ones(2, np.uint8), mesh, [R])
    assert_matches(-pmax, -top)
    assert_matches(np.negative(pmin), np.negative(low))
    assert_matches(pmax + one8, top + np.int8(1))
    assert_matches(pmax - one8, top - np.int8(1))
    assert_matches(pmin - one_u8, low - np.uint8(1))
    assert_matches(pmin + one_u8, low + np.uint8(1))
    pf = DTensor.from_local(np.array([-128.0, 127.0] if first else [5.0, 0.0]), mesh,
                            [Partial("max")])
    with CommDebugMode() as mode:
        neg = -pf
    assert mode.get_total_counts() == 0
    assert neg.placements == (Partial("min"),)
    assert_matches(neg, -pf.full_tensor())


def test_shard_plus_shard_no_communication():
    mesh = mesh_of((W,))
    x = make(np.arange(64.0).reshape(8, 8), mesh, [S0])
    with CommDebugMode() as mode:
        y = x + x
    assert mode.get_total_counts() == 0
    assert y.placements == (S0,)
    assert_matches(y, 2 * np.arange(64.0).reshape(8, 8))


def test_cached_decision_repeats_the_same():
    mesh = mesh_of((W,))
    x = make(np.arange(12.0).reshape(3, 4), mesh, [S1])
    y = make(np.arange(4.0), mesh, [R])
    first, second = x * y, x * y
    assert first.placements == second.placements
    assert_matches(second, np.arange(12.0).reshape(3, 4) * np.arange(4.0))


def test_mixed_ndarray_is_replicated_once_agreed():
    mesh = mesh_of((W,))
    x = make(np.ones((4, 3)), mesh, [S0])
    assert_matches(x + np.ones(3), np.full((4, 3), 2.0))
    assert_matches(np.ones((4, 3)) * x, np.ones((4, 3)))
    if W > 1:
        with pytest.raises(ValueError, match=r"numpy\.add.*different calls"):
            x + np.full(3, float(mesh.get_rank()))
    assert_matches(x + np.float64(2.0), np.full((4, 3), 3.0))  # 0-d is a scalar


_A = np.arange(35.0).reshape(7, 5) % 6 - 2.5
MIXED_CALLS = {
    "outer": lambda a, n: np.outer(n[:, 0], a[:, 1]),
    "inner": lambda a, n: np.inner(n, a),
    "tensordot": lambda a, n: np.tensordot(n, a, axes=([0], [0])),
    "cross": lambda a, n: np.cross(n[:, :3], a[:, :3]),
    "linalg.outer": lambda a, n: np.linalg.outer(a[:, 0], n[:, 1]),
    "vecdot": lambda a, n: np.linalg.vecdot(n, a, axis=0),
    "vdot": lambda a, n: np.vdot(n, a),
    "take_along_axis": lambda a, n: np.take_along_axis(n, np.argsort(a, 0), 0),
    "take_along_axis_indices": lambda a, n: np.take_along_axis(a, np.argsort(n, 0), 0),
    "diff_prepend": lambda a, n: np.diff(n, axis=0, prepend=a[:1]),
    "digitize": lambda a, n: np.digitize(n, np.sort(a[:, 0])),
    "solve": lambda a, n: np.linalg.solve(n[:5, :5] + 6 * np.eye(5), a[:5]),
    "multi_dot": lambda a, n: np.linalg.multi_dot([n.T, a, n[0]]),
    "gradient": lambda a, n: np.gradient(n, np.sort(a[:, 0]) + np.arange(7.0), axis=0),
    "column_stack": lambda a, n: np.column_stack([n[:, 0], a[:, 1]]),
    "histogram_weights": lambda a, n: np.histogram(n, bins=4, weights=a),
}


@pytest.mark.parametrize("name", list(MIXED_CALLS))
@pytest.mark.parametrize("pls", [[S0], [S1], [R]], ids=str)
def test_an_ndarray_beside_a_dtensor_is_replicated_in_every_rule(name, pls):
    """Every rule takes a plain ndarray beside a DTensor, in either place, as the
    executor does (Replicate, once the call agreed that every rank holds it), or
    answers on the gathered arrays where its rule has none (histogram's weights=):
    these refused it with a TypeError."""
    call = MIXED_CALLS[name]
    dt = make(_A, mesh_of((W,)), pls)
    got = call(dt, _A.copy())
    want = call(_A, _A.copy())
    for g, w in zip(got, want) if isinstance(want, tuple) else [(got, want)]:
        if isinstance(g, DTensor):
            assert_matches(g, w)
        else:
            np.testing.assert_allclose(g, w)


def test_different_meshes_value_error():
    """DTensors of two meshes mix only where one is a replica of the whole value on
    the same ranks: sharded on both, or needing a gradient, they are refused."""
    a = mesh_of((W,))
    b = init_device_mesh("cpu", (W,), mesh_dim_names=("other",))
    x, y = make(np.ones(4), a, [S0]), make(np.ones(4), b, [S0])
    with pytest.raises(ValueError, match="different device meshes"):
        x + y
    with pytest.raises(ValueError, match="different device meshes"):
        np.concatenate([x, y])
    r = make(np.ones(4), b, [R]).requires_grad_()
    with pytest.raises(ValueError, match="different device meshes"):
        x + r
    with pytest.raises(ValueError, match="different device meshes"):
        np.where(x > 0, r, x)


def _other_mesh():
    """A mesh of every rank that is not the tests' 1-D one: 2-D where W is even."""
    if W % 2 == 0:
        return init_device_mesh("cpu", (2, W // 2)), [S0, S1]
    return init_device_mesh("cpu", (W,), mesh_dim_names=("other",)), [S1]


@pytest.mark.parametrize("call", ["add", "radd", "ufunc", "where", "maximum_out",
                                  "concatenate", "sum_where", "matmul"])
def test_a_replicate_of_another_mesh_of_the_same_ranks_mixes_in(call):
    """The array API's clients make constants on the default mesh beside data on
    the program's (SciPy's ttest_1samp, ttest_ind, pearsonr on a 2-D mesh): a
    DTensor Replicate on every dim of a mesh of the same ranks joins the other
    operand's mesh, through the executor (operators, ufuncs) and through the
    Python door (registered functions, lists among their arguments), and an
    elementwise call moves nothing for it."""
    grid, pls = _other_mesh()
    rng = np.random.default_rng(5)
    X, C = rng.standard_normal((6, 4)), rng.standard_normal(4)
    x, c = make(X, grid, pls), make(C, mesh_of((W,)), [R])
    cases = {
        "add": (lambda: x + c, X + C, True),
        "radd": (lambda: c - x, C - X, True),
        "ufunc": (lambda: np.hypot(c, x), np.hypot(C, X), True),
        "where": (lambda: np.where(x > 0, c, x), np.where(X > 0, C, X), True),
        "maximum_out": (lambda: np.maximum(x, c, out=x.copy()), np.maximum(X, C), True),
        "concatenate": (lambda: np.concatenate([x, c[None]]), np.concatenate([X, C[None]]),
                        False),
        "sum_where": (lambda: np.sum(x * c, axis=0), np.sum(X * C, axis=0), False),
        "matmul": (lambda: x @ c, X @ C, False),
    }
    f, want, local = cases[call]
    with CommDebugMode() as comm:
        got = f()
    assert got.device_mesh == grid
    assert_matches(got, want)
    if local:
        assert comm.get_total_counts() == 0


@pytest.mark.usefixtures("strict_numpy")
def test_unsupported_calls_are_type_errors():
    mesh = mesh_of((W,))
    x = make(np.ones((4, 3)), mesh, [S0])
    with pytest.raises(TypeError, match=r"numpy\.linalg\.eig"):
        np.linalg.eig(make(np.eye(4), mesh, [S0]))  # no distributed engine
    with pytest.raises(TypeError, match=r"numpy\.arctan2\.accumulate"):
        np.arctan2.accumulate(x)  # NumPy's own is no fold of its steps: gathered
    with pytest.raises(TypeError, match=r"where="):
        np.add(x, x, where=True)
    with pytest.raises(TypeError, match="full_tensor"):
        np.asarray(x)


@pytest.mark.usefixtures("strict_numpy")
@pytest.mark.parametrize("ufunc", [np.add, np.maximum, np.multiply, np.logical_or])
@pytest.mark.parametrize("shape, axis, pl", [
    ((11,), 0, [S0]), ((9, 4), 0, [S0]), ((4, 9), 1, [Shard(1)]), ((9, 4), 1, [S0]),
    ((3,), 0, [S0]), ((9, 4), 0, [R])], ids=str)
def test_reduceat_gives_numpys_value_without_a_gather(ufunc, shape, axis, pl):
    """Segments that span ranks, empty or reversed ones (a[i] alone), repeated
    indices: each rank's pieces, gathered over the sharding mesh dim (two
    all-gathers of one record per segment) and combined."""
    g = np.random.default_rng(7).standard_normal(shape)
    if ufunc is np.logical_or:
        g = g > 0.5
    x = make(g, mesh_of((W,)), pl)
    n = shape[axis]
    for idx in ([0], [0, 2, 5], [n - 1, 0, n - 1], [1, 1, 0]):
        idx = [i for i in idx if i < n]
        with CommDebugMode() as mode:
            got = ufunc.reduceat(x, idx, axis=axis)
        want = ufunc.reduceat(g, idx, axis=axis)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.full_tensor(), want, rtol=1e-12)
        sharded = any(p.is_shard() and p.dim == axis for p in pl) and W > 1
        assert mode.get_total_counts() == (2 if sharded else 0)


@pytest.mark.parametrize("ufunc", [np.gcd, np.fmax, np.logaddexp, np.bitwise_or])
def test_reduce_over_an_empty_axis_is_numpys_identity_or_error(ufunc):
    dtype = np.int64 if ufunc in (np.gcd, np.bitwise_or) else np.float64
    g = np.zeros((0, 3), dtype)
    x = make(g, mesh_of((W,)), [S0])
    try:
        want = ufunc.reduce(g, axis=0)
    except ValueError as e:
        with pytest.raises(ValueError, match="no identity"):
            ufunc.reduce(x, axis=0)
        assert "no identity" in str(e)
        return
    got = ufunc.reduce(x, axis=0)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.full_tensor(), want)


def test_reduceat_checks_its_indices_as_numpy():
    x = make(np.arange(6.0), mesh_of((W,)), [S0])
    with pytest.raises(IndexError, match="out-of-bounds"):
        np.add.reduceat(x, [0, 6])
    with pytest.raises(IndexError, match="out-of-bounds"):
        np.add.reduceat(x, [-1])


@pytest.mark.usefixtures("strict_numpy")
@pytest.mark.parametrize("pl", [[S0], [Shard(1)], [R]], ids=str)
def test_ufunc_at_updates_in_place_without_moving_anything(pl):
    """Repeated and negative indices, an index per leading dim, a broadcast operand,
    a one-operand ufunc: each rank applies the updates that land in its block."""
    cases = [((np.array([0, 0, 4, 6]),), np.array([[1.0], [2.0], [3.0], [4.0]])),
             ((np.array([0, 0, 4]), np.array([1, 1, 2])), [1.0, 2.0, 3.0]),
             ((np.array([0, 0, 4]),), 1.0), ((2,), np.arange(3.0)),
             ((np.array([-1, 1]),), 5.0)]
    for idx, b in cases:
        g = np.arange(21.0).reshape(7, 3)
        x = make(g, mesh_of((W,)), pl)
        key = idx if len(idx) > 1 else idx[0]
        with CommDebugMode() as mode:
            assert np.add.at(x, key, b) is None
        np.add.at(g, key, b)
        assert mode.get_total_counts() == 0
        np.testing.assert_array_equal(x.full_tensor(), g)
    g = np.arange(5.0)
    x = make(g, mesh_of((W,)), [S0])
    np.negative.at(x, [1, 3])
    np.negative.at(g, [1, 3])
    np.testing.assert_array_equal(x.full_tensor(), g)
    with pytest.raises(IndexError, match="out of bounds"):
        np.add.at(x, [5], 1.0)


@pytest.mark.usefixtures("strict_numpy")
@pytest.mark.parametrize("ufunc", [np.maximum, np.minimum, np.fmax, np.bitwise_or,
                                   np.logical_xor, np.gcd, np.equal, np.not_equal,
                                   np.logaddexp, np.logaddexp2, np.hypot])
@pytest.mark.parametrize("shape, axis, pl", [
    ((11,), 0, [S0]), ((9, 4), 0, [S0]), ((4, 9), 1, [Shard(1)]), ((9, 4), 1, [S0]),
    ((3,), 0, [S0]), ((9, 4), 0, [R])], ids=str)
def test_reduce_and_accumulate_of_every_regroupable_ufunc(ufunc, shape, axis, pl):
    """The ufuncs without a NumPy function of their own: reduce is reduceat's one
    segment, accumulate a scan of each block and the totals of the ranks before."""
    rng = np.random.default_rng(2)
    ints, bools = rng.integers(-60, 60, shape) * 6, rng.standard_normal(shape) > 0
    g = {np.bitwise_or: ints, np.gcd: ints, np.logical_xor: bools, np.equal: bools,
         np.not_equal: bools}.get(ufunc, rng.standard_normal(shape))
    x = make(g, mesh_of((W,)), pl)
    # logaddexp and hypot regroup a sum, which rounds otherwise, as add's does.
    rounds = ufunc in (np.logaddexp, np.logaddexp2, np.hypot)
    for method, kw in (("accumulate", {}), ("reduce", {}), ("reduce", {"keepdims": True})):
        got = getattr(ufunc, method)(x, axis=axis, **kw)
        want = getattr(ufunc, method)(g, axis=axis, **kw)
        assert got.dtype == want.dtype and got.shape == want.shape, (method, kw)
        if rounds:
            np.testing.assert_allclose(got.full_tensor(), want, rtol=1e-14)
        else:
            np.testing.assert_array_equal(got.full_tensor(), want)
    if ufunc in (np.gcd, np.equal):  # no loop of floats: NumPy's error on every rank
        with pytest.raises(TypeError, match="loop"):
            ufunc.reduce(make(rng.standard_normal(shape), mesh_of((W,)), pl), axis=axis)
