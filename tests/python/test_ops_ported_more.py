"""More of torch's own DTensor tests (test_math_ops, test_pointwise_ops,
test_view_ops, test_tensor_ops, test_matrix_ops, test_embedding_ops) ported to
NumPy where the operation exists. Each check states what torch checks:
values equal NumPy's on the full arrays (uneven shards included), output
placements as torch's unless ours moves fewer bytes (docs/porting_from_torch.md),
and no more collective calls than torch makes for the same op and placements."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, nn
from mpitensor.debug import CommDebugMode
from mpitensor.nn import functional as F
from ops_helpers import W, assert_matches, make, mesh_of, mesh_shapes

R, S0, S1, S2, PS = Replicate(), Shard(0), Shard(1), Shard(2), Partial("sum")
RNG = np.random.default_rng(33)


def counts(mode) -> dict:
    return {k: v for k, v in mode.get_comm_counts().items() if v}


def sharded_on(pls, mesh_shape, axes) -> int:
    """How many mesh dims of more than one rank shard one of `axes`."""
    return sum(p.is_shard() and p.dim in axes and mesh_shape[m] > 1
               for m, p in enumerate(pls))


# -- test_math_ops: linear_op_reductions, test_mean ------------------------------------

REDUCTIONS = ["all", "any", "sum", "prod", "max", "min", "amax", "amin", "mean"]


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
@pytest.mark.parametrize("shape", [(12, 8, 8), (7, 5, 3)], ids=str)
@pytest.mark.parametrize("op", REDUCTIONS)
def test_reductions_over_every_axis_match_numpy(mesh_shape, shape, op):
    mesh = mesh_of(mesh_shape)
    full = RNG.standard_normal(shape)
    if op in ("all", "any"):   # torch checks bool inputs: all() once summed them
        full = full < 0
    func = getattr(np, op)
    pls = [S0] if len(mesh_shape) == 1 else [S0, S1]
    d = make(full, mesh, pls)
    for axis, keepdims in itertools.product([None, 0, 1, 2, (0, 2)], [False, True]):
        got = func(d, axis=axis, keepdims=keepdims)
        assert_matches(got, func(full, axis=axis, keepdims=keepdims))
        axes = range(full.ndim) if axis is None else np.atleast_1d(axis)
        even = all(full.shape[p.dim] % mesh_shape[m] == 0
                   for m, p in enumerate(pls) if p.is_shard())
        if op != "mean" or even:
            # torch keeps a Partial for a reduced sharded axis: nothing moves.
            # (An uneven mean is no average of the shards' means.)
            with CommDebugMode() as mode:
                got = func(d, axis=axis, keepdims=keepdims)
            assert mode.get_total_counts() == 0, (axis, counts(mode))
            for m, p in enumerate(pls):
                if mesh_shape[m] > 1 and p.dim in axes:
                    assert got.placements[m].is_partial()


# -- test_math_ops: test_softmax_fwd -----------------------------------------------------

@pytest.mark.parametrize("shard_dim", [-1, 0, 1, 2])
def test_softmax_placements_and_moves(shard_dim):
    mesh = mesh_of((W,))
    x = RNG.random((8, 12, 16))
    for axis in (-1, 0, 1, 2):
        d = make(x, mesh, [Shard(shard_dim % 3)])
        with CommDebugMode() as mode:
            y = F.softmax(d, axis=axis)
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        assert_matches(y, e / e.sum(axis=axis, keepdims=True))
        if shard_dim % 3 != axis % 3:
            assert y.placements == (Shard(shard_dim % 3),)
            assert mode.get_total_counts() == 0
        elif W == 1:
            assert mode.get_total_counts() == 0
        else:
            # torch all-gathers to Replicate; one all-to-all moves the shard off
            # the softmax axis for fewer bytes (the documented deviation).
            assert not (y.placements[0].is_shard() and y.placements[0].dim == axis % 3)
            assert mode.get_total_counts() == 1


# -- test_math_ops: test_shard_math_ops ---------------------------------------------------

@pytest.mark.world(4, reason="a (2, 2) mesh")
@pytest.mark.parametrize("pls", [[S0, S0], [S0, S1]], ids=str)
def test_scalar_arithmetic_on_doubly_sharded_arrays(pls):
    mesh = mesh_of((2, 2))
    full = np.ones((4, 4))
    d = make(full, mesh, pls)
    for op in (np.add, np.subtract, np.multiply, np.divide):
        with CommDebugMode() as mode:
            got = op(d, 2)
        assert mode.get_total_counts() == 0
        assert got.placements == tuple(pls)
        assert_matches(got, op(full, 2))


# -- test_math_ops: test_layer_norm_fwd, test_layer_norm_bwd ------------------------------

LN_CASES = [(s, n, False) for s in range(3) for n in range(3)] + [
    (s, n, True) for s in range(3) for n in range(3) if s < n]


@pytest.mark.parametrize("shard_dim,norm_idx,affine", LN_CASES, ids=str)
def test_layer_norm_moves_only_for_a_sharded_normalized_dim(shard_dim, norm_idx, affine):
    mesh = mesh_of((W,))
    x = RNG.random((20, 5, 10))
    shape = x.shape[norm_idx:]
    ln = mt.distribute_module(nn.LayerNorm(shape, elementwise_affine=affine), mesh)
    xd = make(x, mesh, [Shard(shard_dim)]).requires_grad_()
    with CommDebugMode() as fwd:
        y = ln(xd)
    axes = tuple(range(norm_idx, 3))
    mu = x.mean(axis=axes, keepdims=True)
    ref = (x - mu) / np.sqrt(x.var(axis=axes, keepdims=True) + 1e-5)
    assert_matches(y.detach(), ref)
    want = 1 if shard_dim >= norm_idx and W > 1 else 0
    assert fwd.get_total_counts() == want
    with CommDebugMode() as bwd:
        y.sum().backward()
    # Each normalised row sums to zero, so the gradient of the sum is zero.
    np.testing.assert_allclose(xd.grad.full_tensor(), 0.0, atol=1e-9)
    if not affine:
        assert bwd.get_total_counts() <= want
        return
    # The parameters' gradients stay Partial over the sharded outer dim, as
    # torch's: backward reduces nothing (training.md).
    assert counts(bwd) == {}
    assert ln.weight.grad.placements == ln.bias.grad.placements == (Partial(),)
    assert_matches(ln.weight.grad, ref.sum(axis=tuple(range(norm_idx))))
    assert_matches(ln.bias.grad, np.full(shape, float(np.prod(x.shape[:norm_idx]))))


# -- test_math_ops: test_topk (np.partition), test_shard0_svd, test_std -------------------

@pytest.mark.parametrize("pls", [[S0], [S1], [S2], [R]], ids=str)
def test_partition_along_axis_zero_moves_at_most_once(pls):
    mesh = mesh_of((W,))
    t = RNG.standard_normal((12, 8, 8))
    d = make(t, mesh, pls)
    with CommDebugMode() as mode:
        got = np.partition(d, -3, axis=0)
    top = np.sort(got.full_tensor()[-3:], axis=0)
    np.testing.assert_array_equal(top, np.sort(t, axis=0)[-3:])
    assert mode.get_total_counts() == (1 if pls == [S0] and W > 1 else 0)


def test_svd_of_shard0_square_gathers_nothing():
    """A small square [S(0)] matrix's SVD is that of its blocks' stacked R
    factors (ScaLAPACK's when large): no all-gather, and U and Vh stay sharded
    as A."""
    mesh = mesh_of((W,))
    a = RNG.standard_normal((8, 8))
    d = make(a, mesh, [S0])
    with CommDebugMode() as mode:
        u, s, vh = np.linalg.svd(d, full_matrices=False)
    assert "all_gather_into_tensor" not in counts(mode)
    rs = np.linalg.svd(a, compute_uv=False)
    np.testing.assert_allclose(s.full_tensor(), rs, rtol=1e-10, atol=1e-12)
    uf, vf = u.full_tensor(), vh.full_tensor()
    np.testing.assert_allclose((uf * s.full_tensor()) @ vf, a, atol=1e-12)
    if W > 1:
        assert u.placements == (S0,) and vh.placements == (S0,)


@pytest.mark.world(4, reason="a (2, 2) mesh")
def test_std_of_a_fully_sharded_matrix():
    mesh = mesh_of((2, 2))
    g = np.array([[-20.0, -18.0, -12.0, 0.0], [-20.0, -18.0, -8.0, 4.0]])
    d = make(g, mesh, [S0, S1])
    with CommDebugMode() as mode:
        got = np.std(d, axis=1, ddof=1)
    assert_matches(got, np.array([9.0, 11.0]))
    assert mode.get_total_counts() == 1
    assert got.placements == (S0, R)


# -- test_math_ops: test_vector_norm, test_dist, partial reductions ----------------------

@pytest.mark.parametrize("pls", [[S0], [R], [PS]], ids=str)
def test_norm_and_distance_match_numpy(pls):
    mesh = mesh_of((W,))
    a, b = RNG.standard_normal((12, 8)), RNG.standard_normal((12, 8))
    da, db = make(a, mesh, pls), make(b, mesh, pls)
    assert_matches(np.linalg.norm(da), np.linalg.norm(a))
    for p in (1, 2, np.inf):
        # torch.dist(a, b, p): the vector p-norm of the difference.
        got = np.linalg.norm((da - db).reshape(-1), p)
        assert_matches(got, np.linalg.norm((a - b).ravel(), p))
    # Inputs that are Partial because a sharded axis was summed (keepdims).
    sa, sb = np.sum(da, axis=0, keepdims=True), np.sum(db, axis=0, keepdims=True)
    ref = np.linalg.norm((a.sum(0, keepdims=True) - b.sum(0, keepdims=True)).ravel())
    assert_matches(np.linalg.norm((sa - sb).reshape(-1)), ref)


def test_norm_of_partial_vector_matches_numpy():
    """torch's test_vector_norm_partial: the norm of a Partial(sum) is the norm of
    its sum."""
    mesh = mesh_of((W,))
    rank = mesh.get_coordinate()[0]
    d = DTensor.from_local(np.array([rank, 1.0]), mesh, [PS])
    assert_matches(np.linalg.norm(d), np.linalg.norm([sum(range(W)), W]))


@pytest.mark.parametrize("func", [np.max, np.min])
def test_max_and_min_of_partial_sum_reduce_once(func):
    mesh = mesh_of((W,))
    rank = mesh.get_coordinate()[0]
    local = np.random.default_rng(rank).random(3)
    d = DTensor.from_local(local, mesh, [PS])
    full = d.full_tensor()
    with CommDebugMode() as mode:
        got = func(d)
    assert_matches(got, func(full))
    assert mode.get_total_counts() <= 1


def test_max_of_partial_max_stays_partial():
    mesh = mesh_of((W,))
    rank = mesh.get_coordinate()[0]
    d = DTensor.from_local(np.random.default_rng(rank).random(3), mesh, [Partial("max")])
    with CommDebugMode() as mode:
        got = np.max(d)
    assert mode.get_total_counts() == 0
    assert got.placements == (Partial("max"),)
    assert_matches(got, np.max(d.full_tensor()))


# -- test_math_ops: test_cumsum, test_conj_complex_dtensor ------------------------------

def test_cumsum_along_an_unsharded_axis_is_local():
    mesh = mesh_of((W,))
    x = RNG.random((3, 5))
    d = make(x, mesh, [S0])
    with CommDebugMode() as mode:
        got = np.cumsum(d, axis=1)
    assert mode.get_total_counts() == 0 and got.placements == (S0,)
    assert_matches(got, np.cumsum(x, axis=1))
    with CommDebugMode() as mode:
        got = np.cumsum(d, axis=0)
    # torch all-gathers once; one exclusive scan of the shard totals instead.
    assert mode.get_total_counts() <= 1 and got.placements == (S0,)
    assert_matches(got, np.cumsum(x, axis=0))


def test_conj_of_replicated_complex_is_local():
    mesh = mesh_of((W,))
    z = (RNG.standard_normal((1, 1)) + 1j * RNG.standard_normal((1, 1))).astype(np.complex64)
    d = make(z, mesh, [R])
    with CommDebugMode() as mode:
        got = np.conj(d) + 1
    assert mode.get_total_counts() == 0
    assert_matches(got, np.conj(z) + 1)


# -- test_pointwise_ops ------------------------------------------------------------------

def partial_from(local, mesh, op="sum"):
    """A DTensor whose parts on the ranks are `local(rank)`."""
    rank = mesh.get_coordinate()[0]
    return DTensor.from_local(np.asarray(local(rank)), mesh, [Partial(op)])


def test_partial_plus_partial_stays_partial():
    mesh = mesh_of((W,))
    a = partial_from(lambda r: np.full((2, 2), r + 1.0), mesh)
    b = partial_from(lambda r: np.full((2, 2), 2.0 * r), mesh)
    with CommDebugMode() as mode:
        c = a + b
    assert mode.get_total_counts() == 0 and c.placements == (PS,)
    assert_matches(c, a.full_tensor() + b.full_tensor())


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_partial_plus_replicate_keeps_the_partial(op):
    mesh = mesh_of((W,))
    a = partial_from(lambda r: np.arange(4.0).reshape(2, 2) * (r + 1), mesh, op)
    b = make(np.array([[1.5], [-2.0]]), mesh, [R])
    with CommDebugMode() as mode:
        c = a + b
    assert mode.get_total_counts() == 0
    if W > 1:
        assert c.placements == (Partial(op),)
    assert_matches(c, a.full_tensor() + b.full_tensor())


@pytest.mark.parametrize("pls,shape", [([S0], (8, 5)), ([R], (8, 5)), ([S1], (3, 12))],
                         ids=str)
def test_activations_are_local(pls, shape):
    mesh = mesh_of((W,))
    x = RNG.standard_normal(shape)
    d = make(x, mesh, pls)
    with CommDebugMode() as mode:
        outs = [F.relu(d), F.gelu(d), F.gelu(d, approximate="tanh"), F.silu(d),
                1.0 / (1.0 + np.exp(-d))]
    assert mode.get_total_counts() == 0
    assert all(o.placements == tuple(pls) for o in outs)
    erf = np.vectorize(math.erf)
    tanh_gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    refs = [np.maximum(x, 0), 0.5 * x * (1 + erf(x / np.sqrt(2))), tanh_gelu,
            x / (1 + np.exp(-x)), 1 / (1 + np.exp(-x))]
    for o, r in zip(outs, refs):
        assert_matches(o, r)


def test_multiply_with_out_writes_the_destination():
    mesh = mesh_of((W,))
    x, y = RNG.standard_normal((8, 4)), RNG.standard_normal((8, 4))
    dx, dy, dz = make(x, mesh, [S0]), make(y, mesh, [S0]), make(np.zeros((8, 4)), mesh, [S0])
    with CommDebugMode() as mode:
        got = np.multiply(dx, dy, out=dz)
    assert mode.get_total_counts() == 0
    assert got is dz
    assert_matches(dz, x * y)
    assert_matches(dx, x)


def test_partial_times_partial_reduces_one_operand():
    mesh = mesh_of((W,))
    a = partial_from(lambda r: np.ones((2, 2)), mesh)
    b = partial_from(lambda r: np.ones((2, 2)), mesh)
    with CommDebugMode() as mode:
        c = a * b
    assert mode.get_total_counts() == (1 if W > 1 else 0)
    if W > 1:
        assert c.placements == (PS,)
    assert_matches(c, np.full((2, 2), float(W * W)))


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_partial_times_scalar_or_replicate_stays_partial(op):
    mesh = mesh_of((W,))
    full = np.ones((8, 8))
    d = partial_from(lambda r: full, mesh, op)
    want = full * (W if op == "sum" else 1) * 2.0
    others = [2.0, np.float64(2.0), make(np.array(2.0), mesh, [R]),
              make(np.full((8, 8), 2.0), mesh, [R])]
    for other in others:
        with CommDebugMode() as mode:
            z = d * other
            q = d / other
        assert mode.get_total_counts() == 0
        if W > 1:
            assert z.placements == q.placements == (Partial(op),)
        assert_matches(z, want)
        assert_matches(q, want / 4.0)


def test_partial_max_times_replicate_is_reduced():
    """torch all-reduces a Partial(max) that meets a product; ours may reduce-scatter
    instead (fewer bytes), never keeping the max pending."""
    mesh = mesh_of((W,))
    d = partial_from(lambda r: np.full((8, 8), float(r)), mesh, "max")
    ones = make(np.ones((8, 8)), mesh, [R])
    with CommDebugMode() as mode:
        z = d * ones
    assert not z.placements[0].is_partial()
    assert mode.get_total_counts() <= 1
    assert_matches(z, np.full((8, 8), W - 1.0))


@pytest.mark.parametrize("pls,shape", [([S0], (8, 5)), ([R], (8, 5)), ([S1], (4, 12))],
                         ids=str)
def test_masked_fill_is_local(pls, shape):
    mesh = mesh_of((W,))
    full = np.arange(float(np.prod(shape))).reshape(shape) - 20
    mask = full % 3 == 0
    d, dm = make(full, mesh, pls), make(mask, mesh, pls)
    with CommDebugMode() as mode:
        np.copyto(d, -999.0, where=dm)
        filled = np.where(dm, 42.0, d)
    assert mode.get_total_counts() == 0
    want = np.where(mask, -999.0, full)
    assert_matches(d, want)
    assert_matches(filled, np.where(mask, 42.0, want))


def test_inplace_clip_of_partial_sum_keeps_the_partial():
    """torch refuses an in-place op whose result is not the output's Partial; here
    the clip of the sum is written into the Partial(sum) (once, zeros elsewhere)."""
    mesh = mesh_of((W,))
    d = partial_from(lambda r: np.array(64.0), mesh)
    np.clip(d, None, 10.0 * W - 1, out=d)
    assert d.placements == (Partial("sum"),)
    assert float(d.full_tensor()) == min(64.0 * W, 10.0 * W - 1)


def test_scalar_mul_and_div_of_partial_scale_each_part():
    mesh = mesh_of((W,))
    d = partial_from(lambda r: np.array([float(r)]), mesh)
    rank = mesh.get_coordinate()[0]
    for got, factor in ((d * 2, 2.0), (d / 2, 0.5)):
        np.testing.assert_array_equal(got.to_local(), [rank * factor])
        if W > 1:
            assert got.placements == (PS,)
        assert_matches(got, np.array([sum(range(W)) * factor]))


@pytest.mark.parametrize("func,op", [(np.maximum, "max"), (np.minimum, "min")])
def test_maximum_minimum_keep_a_matching_partial(func, op):
    mesh = mesh_of((W,))
    a = partial_from(lambda r: np.random.default_rng(r).random((8, 8)) * r, mesh, op)
    b = partial_from(lambda r: np.random.default_rng(r + 9).random((8, 8)) * (W - r), mesh, op)
    with CommDebugMode() as mode:
        c = func(a, b)
    assert mode.get_total_counts() == 0
    assert c.placements == (Partial(op),)
    assert_matches(c, func(a.full_tensor(), b.full_tensor()))


# -- test_matrix_ops -------------------------------------------------------------------

M, K, N = 12, 8, 4
MAT1, MAT2 = RNG.standard_normal((M, K)), RNG.standard_normal((K, N))
# (bias shape, bias, mat1, mat2 placements, output placement): torch's addmm cases,
# with `bias + mat1 @ mat2` as two NumPy operations.
ADDMM = [((N,), R, S0, R, S0), ((M, N), S0, S0, R, S0), ((N,), S0, R, S1, S1),
         ((M, N), S1, R, S1, S1), ((N,), PS, S1, S0, PS), ((M, N), PS, S1, S0, PS),
         ((N,), R, R, R, R), ((M, N), R, R, R, R), ((), R, S0, R, S0), ((), R, R, S1, S1),
         ((1, N), R, S0, R, S0), ((1, N), S1, R, S1, S1), ((M, 1), S0, S0, R, S0),
         ((M, 1), R, R, S1, S1)]


@pytest.mark.parametrize("bias_shape,pb,p1,p2,out", ADDMM, ids=str)
def test_bias_plus_matmul_keeps_torch_addmm_placements(bias_shape, pb, p1, p2, out):
    mesh = mesh_of((W,))
    bias = RNG.standard_normal(bias_shape)
    db, d1, d2 = make(bias, mesh, [pb]), make(MAT1, mesh, [p1]), make(MAT2, mesh, [p2])
    with CommDebugMode() as mode:
        got = db + d1 @ d2
    assert mode.get_total_counts() == 0
    if W > 1:
        assert got.placements == (out,)
    assert_matches(got, bias + MAT1 @ MAT2)


def test_bias_plus_matmul_of_empty_operands():
    mesh = mesh_of((W,))
    a, b, bias = np.zeros((12, 0)), np.zeros((0, 4)), RNG.standard_normal(4)
    got = make(bias, mesh, [R]) + make(a, mesh, [S0]) @ make(b, mesh, [R])
    assert_matches(got, bias + a @ b)


def test_contraction_sharded_both_sides_gives_partial_and_gradients():
    mesh = mesh_of((W,))
    bias = RNG.standard_normal(N)
    d1 = make(MAT1, mesh, [S1]).requires_grad_()
    d2 = make(MAT2, mesh, [S0]).requires_grad_()
    db = make(bias, mesh, [R]).requires_grad_()
    out = db + d1 @ d2
    if W > 1:
        assert out.placements == (PS,)
    assert_matches(out.detach(), bias + MAT1 @ MAT2)
    out.sum().backward()
    assert_matches(d2.grad, MAT1.T @ np.ones((M, N)))
    assert_matches(d1.grad, np.ones((M, N)) @ MAT2.T)
    assert_matches(db.grad, np.full(N, float(M)))


@pytest.mark.parametrize("p1,p2", list(itertools.product([S0, S1, R], repeat=2)), ids=str)
def test_matmul_every_pair_values_and_gradients(p1, p2):
    mesh = mesh_of((W,))
    t1, t2 = RNG.standard_normal((12, 8)), RNG.standard_normal((8, 16))
    d1, d2 = make(t1, mesh, [p1]).requires_grad_(), make(t2, mesh, [p2]).requires_grad_()
    out = d1 @ d2
    assert_matches(out.detach(), t1 @ t2)
    out.sum().backward()
    assert_matches(d1.grad, np.ones((12, 16)) @ t2.T)
    assert_matches(d2.grad, t1.T @ np.ones((12, 16)))


def test_linear_of_a_replicated_input_with_row_sharded_weight():
    mesh = mesh_of((W,))
    x, w = RNG.standard_normal((1, 47, 64)), RNG.standard_normal((64, 64))
    dx, dw = make(x, mesh, [R]), make(w, mesh, [S0])
    with CommDebugMode() as mode:
        got = F.linear(dx, dw)
    assert mode.get_total_counts() == 0
    assert got.placements == (S2,)
    assert_matches(got, x @ w.T)


def test_matmul_with_empty_shards_is_local():
    """torch's unshardable case: (W-1, W) rows over W ranks leave a rank empty."""
    mesh = mesh_of((W,))
    a = np.arange(float((W - 1) * W)).reshape(W - 1, W) if W > 1 else np.ones((1, 1))
    w = np.arange(float(W * W)).reshape(W, W)
    da, dw = make(a, mesh, [S0]), make(w, mesh, [R])
    with CommDebugMode() as mode:
        got = da @ dw
    assert mode.get_total_counts() == 0
    assert_matches(got, a @ w)


def test_transpose_moves_the_shard_and_keeps_partial():
    mesh = mesh_of((W,))
    t = RNG.standard_normal((12, 8))
    d, v = make(t, mesh, [S0]), make(np.arange(8.0), mesh, [S0])
    with CommDebugMode() as mode:
        once, twice, vec = d.T, d.T.T, v.T
    assert mode.get_total_counts() == 0
    assert once.shape == (8, 12) and once.placements == (S1,)
    assert twice.shape == (12, 8) and twice.placements == (S0,)
    assert vec.placements == (S0,)
    assert_matches(vec, np.arange(8.0))
    c = (make(MAT1, mesh, [S1]) @ make(MAT2, mesh, [S0])).T
    if W > 1:
        assert c.placements == (PS,)
    assert_matches(c, (MAT1 @ MAT2).T)


BMM = list(itertools.product([S0, S1, S2, R], repeat=2))


@pytest.mark.parametrize("p1,p2", BMM, ids=str)
def test_batched_matmul_every_pair_values_and_gradients(p1, p2):
    mesh = mesh_of((W,))
    a, b = RNG.random((4, 8, 4)), RNG.random((4, 4, 8))
    da, db = make(a, mesh, [p1]).requires_grad_(), make(b, mesh, [p2]).requires_grad_()
    out = da @ db
    assert_matches(out.detach(), a @ b)
    out.sum().backward()
    assert_matches(da.grad, np.ones((4, 8, 8)) @ np.swapaxes(b, 1, 2))
    assert_matches(db.grad, np.swapaxes(a, 1, 2) @ np.ones((4, 8, 8)))


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_matmul_of_two_partials_reduces_one(mesh_shape, op):
    """torch keeps one operand Partial (matmul is linear in each) and all-reduces
    the other: one all-reduce per mesh dim of more than one rank."""
    mesh = mesh_of(mesh_shape)
    coord = mesh.get_coordinate()
    rng = np.random.default_rng(sum(c * 7 ** i for i, c in enumerate(coord)))
    pls = [Partial(op)] * mesh.ndim
    a = DTensor.from_local(rng.standard_normal((16, 12)), mesh, pls)
    b = DTensor.from_local(rng.standard_normal((12, 20)), mesh, pls)
    with CommDebugMode() as mode:
        got = a @ b
    wide = sum(n > 1 for n in mesh_shape)
    assert mode.get_total_counts() <= wide
    assert_matches(got, a.full_tensor() @ b.full_tensor())


@pytest.mark.world(4, reason="a (2, 2) mesh")
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_matmul_of_partials_on_different_mesh_dims_is_local(op):
    mesh = mesh_of((2, 2))
    coord = mesh.get_coordinate()
    # Equal parts along the Replicate mesh dim: seeded by the Partial coordinate.
    a_part = np.random.default_rng(coord[0]).standard_normal((16, 12))
    b_part = np.random.default_rng(coord[1] + 2).standard_normal((12, 20))
    a = DTensor.from_local(a_part, mesh, [Partial(op), R])
    b = DTensor.from_local(b_part, mesh, [R, Partial(op)])
    with CommDebugMode() as mode:
        got = a @ b
    assert mode.get_total_counts() == 0
    assert got.placements == (Partial(op), Partial(op))
    assert_matches(got, a.full_tensor() @ b.full_tensor())


@pytest.mark.parametrize("p1,p2", list(itertools.product([R, S0, S1], repeat=2)), ids=str)
def test_tensordot_over_the_first_axes(p1, p2):
    mesh = mesh_of((W,))
    a, b = RNG.standard_normal((4, 4)), RNG.standard_normal((4, 15))
    got = np.tensordot(make(a, mesh, [p1]), make(b, mesh, [p2]), axes=([0], [0]))
    assert_matches(got, np.tensordot(a, b, axes=([0], [0])))


# -- test_embedding_ops ----------------------------------------------------------------

EMBEDDINGS = [(1, (5, 4), 17, 12), (1, (6, 7, 6), 21, 11), (1, (8, 6, 5, 4), 23, 13),
              (1, (8, 6, 5, 4, 7), 23, 16), (1, (4,), 15, 14), (0, (5, 12), 16, 22),
              (0, (6, 7, 6), 13, 22), (0, (34,), 15, 14)]


@pytest.mark.parametrize("shard_dim,idx_shape,vocab,dim", EMBEDDINGS, ids=str)
def test_sharded_embedding_forward_and_backward_are_local(shard_dim, idx_shape, vocab, dim):
    mesh = mesh_of((W,))
    weight = RNG.standard_normal((vocab, dim))
    emb = nn.Embedding(vocab, dim)
    emb.weight = nn.Parameter(weight.copy())

    def shard(name, module, device_mesh):
        for pname, param in module.named_parameters():
            module.register_parameter(
                pname, nn.Parameter(distribute_tensor(param, device_mesh, [Shard(shard_dim)])))

    emb = mt.distribute_module(emb, mesh, shard)
    idx = np.random.default_rng(10).integers(0, vocab, idx_shape)
    target = np.random.default_rng(11).standard_normal(idx_shape + (dim,))
    didx, dtarget = make(idx, mesh, [R]), make(target, mesh, [R])
    with CommDebugMode() as fwd:
        out = emb(didx)
    assert fwd.get_total_counts() == 0
    if W > 1:
        # Rows of the vocabulary give each rank some lookups: a Partial sum
        # (torch's _MaskPartial); columns give the output's last dim.
        assert out.placements == ((PS,) if shard_dim == 0 else (Shard(len(idx_shape)),))
    assert_matches(out.detach(), weight[idx])
    with CommDebugMode() as bwd:
        (out * dtarget).sum().backward()
    assert bwd.get_total_counts() == 0
    want = np.zeros_like(weight)
    np.add.at(want, idx, target)
    assert emb.weight.grad.placements == (Shard(shard_dim),)
    assert_matches(emb.weight.grad, want)
    assert_matches(F.embedding(didx, emb.weight).detach(), weight[idx])


def test_rowwise_embedding_output_is_reduced_by_one_all_reduce():
    mesh = mesh_of((W,))
    weight = RNG.standard_normal((10, 20))
    dw = make(weight, mesh, [S0])
    idx = np.random.default_rng(3).integers(0, 10, (8, 8))
    out = F.embedding(make(idx, mesh, [R]), dw)
    with CommDebugMode() as mode:
        full = out.full_tensor()
    assert counts(mode) == ({"all_reduce": 1} if W > 1 else {})
    np.testing.assert_allclose(full, weight[idx], rtol=1e-12)


# -- test_view_ops ---------------------------------------------------------------------

def randn(*shape):
    return RNG.standard_normal(shape)


# (operation, input, input dims that cannot stay sharded): torch's dimmap_test cases.
# A dim that is repeated, or that is not the first of a group merged by a reshape,
# cannot keep its shard; every other dim of size > 1 can, so no placement built
# from those moves anything (when the shards are even).
VIEWS = [
    ("atleast_1d", np.atleast_1d, randn(), ()),
    ("atleast_1d", np.atleast_1d, randn(12), ()),
    ("atleast_1d", np.atleast_1d, randn(12, 6), ()),
    ("atleast_2d", np.atleast_2d, randn(), ()),
    ("atleast_2d", np.atleast_2d, randn(12), ()),
    ("atleast_2d", np.atleast_2d, randn(12, 6, 4), ()),
    ("atleast_3d", np.atleast_3d, randn(), ()),
    ("atleast_3d", np.atleast_3d, randn(12), ()),
    ("atleast_3d", np.atleast_3d, randn(12, 6), ()),
    ("atleast_3d", np.atleast_3d, randn(12, 6, 4, 3), ()),
    ("broadcast_to", lambda a: np.broadcast_to(a, (1, 12, 6)), randn(12, 6), ()),
    ("broadcast_to", lambda a: np.broadcast_to(a, (5, 12, 6)), randn(12, 6), ()),
    ("broadcast_to", lambda a: np.broadcast_to(a, (3, 12, 4, 6)), randn(12, 1, 6), ()),
    ("broadcast_to", lambda a: np.broadcast_to(a, (3, 6, 4, 12)), randn(6, 1, 12), ()),
    ("expand", lambda a: a.expand(3, 12, 4, -1, 2) if isinstance(a, DTensor)
     else np.broadcast_to(a, (3, 12, 4, 6, 2)), randn(12, 1, 6, 1), ()),
    ("ravel", np.ravel, randn(12, 6), (1,)),
    ("ravel", np.ravel, randn(12), ()),
    ("ravel", np.ravel, randn(), ()),
    ("moveaxis", lambda a: np.moveaxis(a, 1, 2), randn(12, 6, 4, 8), ()),
    ("moveaxis", lambda a: np.moveaxis(a, 1, 0), randn(6, 12, 4), ()),
    ("moveaxis", lambda a: np.moveaxis(a, (1, 2), (0, 1)), randn(12, 4, 6), ()),
    ("moveaxis", lambda a: np.moveaxis(a, (0, 2, 1), (2, 1, 0)), randn(12, 6, 4), ()),
    ("moveaxis", lambda a: np.moveaxis(a, (1, 2), (-3, -2)), randn(12, 6, 4), ()),
    ("transpose", lambda a: np.transpose(a, (2, 0, 1)), randn(12, 6, 4), ()),
    ("transpose", lambda a: np.transpose(a, (-1, -3, -2)), randn(12, 6, 4), ()),
    ("swapaxes", lambda a: np.swapaxes(a, 2, 0), randn(12, 6, 4, 6), ()),
    ("swapaxes", lambda a: np.swapaxes(a, -1, 0), randn(12, 6, 4, 6), ()),
    ("tile", lambda a: np.tile(a, (1, 2, 1, 1, 2)), randn(12, 6), (1,)),
    ("tile", lambda a: np.tile(a, (1, 3)), randn(12, 6, 4), (2,)),
    ("reshape", lambda a: np.reshape(a, (72, 4)), randn(6, 12, 4), (1,)),
    ("expand_dims", lambda a: np.expand_dims(a, 1), randn(12, 6, 4), ()),
    ("reshape", lambda a: a.reshape(-1), randn(1, 1, 12), ()),
    ("reshape", lambda a: a.reshape(-1), randn(1, 1, 12, 6), (3,)),
    ("reshape", lambda a: a.reshape(-1), randn(1, 1, 12, 1, 6, 1), (4,)),
    ("reshape", lambda a: a.reshape(12, 4, 5, 3), randn(24, 5, 6), (1, 2)),
]


def torch_view_mesh_shapes():
    # torch runs these on a (world/2, 2) mesh; ours on every mesh of the suite.
    return mesh_shapes() + ([(W // 2, 2)] if W in (2,) else [])


@pytest.mark.parametrize("mesh_shape", torch_view_mesh_shapes(), ids=str)
@pytest.mark.parametrize("case", range(len(VIEWS)), ids=lambda i: f"{i}-{VIEWS[i][0]}")
def test_view_ops_keep_every_shard_they_can(mesh_shape, case):
    _, op, full, frozen = VIEWS[case]
    mesh = mesh_of(mesh_shape)
    want = op(full)
    choices = [R] + [Shard(i) for i, n in enumerate(full.shape) if n > 1 and i not in frozen]
    for pls in itertools.product(choices, repeat=len(mesh_shape)):
        d = make(full, mesh, pls)
        with CommDebugMode() as mode:
            got = op(d)
        assert_matches(got, want)
        shards = [(p.dim, mesh_shape[m]) for m, p in enumerate(pls) if p.is_shard()]
        per_dim = {}
        for dim, n in shards:
            per_dim[dim] = per_dim.get(dim, 1) * n
        if all(full.shape[dim] % n == 0 for dim, n in per_dim.items()):
            assert mode.get_total_counts() == 0, (pls, counts(mode))


@pytest.mark.parametrize("rows", [1, W + 1])
def test_reshape_of_uneven_rows_is_a_local_view(rows):
    """torch's test_dtensor_view_op_uneven: the sharded dim stays, so nothing moves
    and the local result is a view of the local shard."""
    mesh = mesh_of((W,))
    p = randn(rows, 2, 2, 2)
    d = make(p, mesh, [S0])
    with CommDebugMode() as mode:
        views = [d.reshape(rows, 2, 4), d.reshape(rows, 4, 2), d.reshape(rows, 8),
                 d.reshape(d.shape)]
    assert mode.get_total_counts() == 0
    for v in views:
        assert np.shares_memory(v.to_local(), d.to_local()) or d.to_local().size == 0
    assert_matches(views[2], p.reshape(rows, 8))


def test_reshape_across_the_sharded_dim_matches_numpy():
    mesh = mesh_of((W,))
    x = randn(4, 4)
    assert_matches(make(x, mesh, [S0]).reshape(-1, 8), x.reshape(-1, 8))


def test_complex_view_round_trip_on_sharded_rows():
    """view_as_complex / view_as_real: NumPy's ``.view`` of the last dim pairs."""
    mesh = mesh_of((W,))
    inp = randn(24, 13, 2)
    d = make(inp, mesh, [S0])
    with CommDebugMode() as mode:
        z = d[..., 0] + 1j * d[..., 1]
        back = np.stack([np.real(z), np.imag(z)], axis=-1)
    assert mode.get_total_counts() == 0
    assert_matches(z, inp[..., 0] + 1j * inp[..., 1])
    assert_matches(back, inp)


def test_tile_gathers_only_a_repeated_sharded_dim_and_keeps_partial():
    mesh = mesh_of((W,))
    x = randn(8, 6)
    d = make(x, mesh, [S1])
    with CommDebugMode() as mode:
        got = np.tile(d, (2, 3))
    assert_matches(got, np.tile(x, (2, 3)))
    assert counts(mode) == ({"all_gather_into_tensor": 1} if W > 1 else {})
    p = make(x, mesh, [PS])
    with CommDebugMode() as mode:
        kept = np.tile(p, 2)
    assert mode.get_total_counts() == 0
    if W > 1:
        assert kept.placements == (PS,)
    assert_matches(kept, np.tile(x, 2))
    assert_matches(np.tile(d, 0), np.tile(x, 0))
    a, b = np.atleast_2d(make(np.arange(4.0), mesh, [S0]), make(np.array(3.0), mesh, [R]))
    assert_matches(a, np.arange(4.0)[None])
    assert_matches(b, np.array([[3.0]]))


@pytest.mark.parametrize("pls", [[S0], [S1], [R]], ids=str)
@pytest.mark.parametrize("reps", [(1, 3), (2, 1, 2), 2], ids=str)
def test_tile_backward_sums_the_copies(pls, reps):
    mesh = mesh_of((W,))
    x = randn(5, 4)
    w = make(x, mesh, pls).requires_grad_()
    t = np.tile(x, reps)
    weights = np.arange(float(t.size)).reshape(t.shape)
    (np.tile(w, reps) * make(weights, mesh, [R])).sum().backward()
    # Output element (..., i, j) is a copy of x[i % 5, j % 4].
    i, j = np.indices(t.shape[-2:])
    want = np.zeros_like(x)
    np.add.at(want, (i % 5, j % 4), weights.reshape(-1, *t.shape[-2:]).sum(axis=0))
    assert_matches(w.grad, want)


# -- test_tensor_ops -------------------------------------------------------------------

COPIES = [((12, 12), (12, 12), [R], [R]), ((12, 12), (12, 12), [S0], [S0]),
          ((128,), (16, 128), [R], [R]), ((128,), (16, 128), [S0], [S1]),
          ((16, 1), (4, 8, 16, 6), [S1], [R]), ((16, 1), (4, 8, 16, 6), [S1], [S0]),
          ((16, 1), (4, 8, 16, 6), [S1], [S1]), ((16, 1), (4, 8, 16, 6), [S1], [S2])]


@pytest.mark.parametrize("src_shape,dst_shape,src_pls,dst_pls", COPIES, ids=str)
def test_copyto_broadcasts_and_keeps_the_destination_placements(src_shape, dst_shape,
                                                               src_pls, dst_pls):
    mesh = mesh_of((W,))
    src = RNG.standard_normal(src_shape)
    d_src, d_dst = make(src, mesh, src_pls), make(np.zeros(dst_shape), mesh, dst_pls)
    np.copyto(d_dst, d_src)
    assert d_dst.placements == tuple(dst_pls)
    assert_matches(d_dst, np.broadcast_to(src, dst_shape))


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_copyto_of_partial_into_partial_copies_the_parts(op):
    """torch's copy_ is pointwise: each rank copies its part and the Partial stays."""
    mesh = mesh_of((W,))
    rank = mesh.get_coordinate()[0]
    part = np.random.default_rng(rank).standard_normal((16, 1))
    src = DTensor.from_local(part, mesh, [Partial(op)])
    dst = DTensor.from_local(np.zeros((2, 4, 16, 6)), mesh, [Partial(op)])
    with CommDebugMode() as mode:
        np.copyto(dst, src)
    assert mode.get_total_counts() == 0
    assert dst.placements == (Partial(op),)
    np.testing.assert_array_equal(dst.to_local(), np.broadcast_to(part, (2, 4, 16, 6)))


def test_strides_of_a_shard_and_of_a_contiguous_transpose():
    mesh = mesh_of((W,))
    x = RNG.random((3, 5, 6))
    d = make(x, mesh, [S0])
    assert d.stride() == (30, 6, 1)
    c = d.transpose(2, 1, 0).contiguous()
    assert c.stride() == (15, 3, 1)
    assert c.to_local().flags.c_contiguous
    assert_matches(c, x.transpose(2, 1, 0))


def test_inplace_and_out_keep_the_destination():
    mesh = mesh_of((W,))
    x = RNG.standard_normal((12, 3))
    a, m = make(x, mesh, [S0]), make(x, mesh, [S0])
    a_id, m_id = id(a), id(m)
    a += 3
    m *= 3
    assert id(a) == a_id and id(m) == m_id
    assert_matches(a, x + 3)
    assert_matches(m, x * 3)
    g = RNG.standard_normal((12, 3))
    s = make(x, mesh, [S0])
    s += make(g, mesh, [PS])
    assert s.placements == (S0,)
    assert_matches(s, x + g)
    out = make(np.zeros((12, 3)), mesh, [R])
    res = np.add(make(x, mesh, [S0]), 3, out=out)
    assert res is out and out.placements == (R,)
    assert_matches(out, x + 3)


@pytest.mark.parametrize("pls", [[S0], [PS]], ids=str)
def test_like_constructors_and_fill(pls):
    mesh = mesh_of((W,))
    x = RNG.standard_normal((4, 8))
    d = make(x, mesh, pls)
    with CommDebugMode() as mode:
        outs = [np.zeros_like(d), np.ones_like(d), np.full_like(d, 42.0), np.empty_like(d),
                np.zeros_like(d, dtype=np.float32)]
    assert mode.get_total_counts() == 0
    for got, want in zip(outs[:3], (np.zeros((4, 8)), np.ones((4, 8)), np.full((4, 8), 42.0))):
        assert_matches(got, want)
    assert outs[3].shape == (4, 8)
    assert outs[4].dtype == np.float32 and d.dtype == np.float64
    assert_matches(outs[4], np.zeros((4, 8), np.float32))


def test_fill_of_a_shard_fills_every_element():
    mesh = mesh_of((W,))
    d = make(RNG.standard_normal((4, 8)), mesh, [S0])
    d.fill(42.0)
    assert_matches(d, np.full((4, 8), 42.0))
    d.fill(0)
    assert_matches(d, np.zeros((4, 8)))


@pytest.mark.parametrize("axis", [0, 1])
def test_stack_moves_the_shard_with_its_dim(axis):
    mesh = mesh_of((W,))
    x = RNG.standard_normal((8, 8))
    d = make(x, mesh, [S1])
    with CommDebugMode() as mode:
        got = np.stack([d, d.copy()], axis=axis)
    assert mode.get_total_counts() == 0
    assert got.placements == (S2,)
    assert_matches(got, np.stack([x, x], axis=axis))


def test_array_equal_combines_every_shard():
    mesh = mesh_of((W,))
    ones = make(np.ones((4, 4)), mesh, [S0])
    assert np.array_equal(ones, make(np.ones((4, 4)), mesh, [S0]))
    rank = mesh.get_coordinate()[0]
    other = DTensor.from_local(np.ones((1, 4)) * (1 if rank == 0 else 2), mesh, [S0])
    assert not np.array_equal(make(np.ones((W, 4)), mesh, [S0]), other) or W == 1
    assert np.array_equal(make(np.ones((W, 4)), mesh, [S0]), make(np.ones((W, 4)), mesh, [R]))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_take_along_axis_like_torch_gather(axis):
    """torch.gather: a Replicate input with a Replicate index, or with an index
    sharded on the gather axis (the output sharded there), moves nothing."""
    mesh = mesh_of((W,))
    x = RNG.standard_normal((12, 8, 16))
    shape = list(x.shape)
    shape[axis] = 5
    idx = np.random.default_rng(4).integers(0, x.shape[axis], shape)
    want = np.take_along_axis(x, idx, axis=axis)
    dx = make(x, mesh, [R])
    for pls in ([R], [Shard(axis)]):
        di = make(idx, mesh, pls)
        with CommDebugMode() as mode:
            got = np.take_along_axis(dx, di, axis=axis)
        assert mode.get_total_counts() == 0
        assert got.placements == tuple(pls)
        assert_matches(got, want)
    # A sharded input along another dim: the index follows it; along the axis:
    # made whole first.
    other = (axis + 1) % 3
    for pls in ([Shard(other)], [Shard(axis)], [PS]):
        got = np.take_along_axis(make(x, mesh, pls), make(idx, mesh, [R]), axis=axis)
        assert_matches(got, want)
    with pytest.raises(TypeError, match="equal"):
        np.take_along_axis(dx, make(idx[:1, :1, :1], mesh, [R]), axis=axis)


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_stack_and_concatenate_of_partial_with_replicate_move_nothing(op):
    """torch's stack of [P, R] and [P, P] gives [P, P] with no collective: joining
    is linear, so a Replicate input joins the Partial on one rank only (sum), or
    as it is (avg, and max when the Partial comes first)."""
    mesh = mesh_of((W,))
    rank = mesh.get_coordinate()[0]
    p = DTensor.from_local(np.random.default_rng(rank).standard_normal((4, 3)), mesh,
                           [Partial(op)])
    r = make(np.arange(12.0).reshape(4, 3), mesh, [R])
    full_p, full_r = p.full_tensor(), r.full_tensor()
    with CommDebugMode() as mode:
        outs = [np.stack([p, r]), np.concatenate([p, r], axis=1)]
    assert mode.get_total_counts() == 0
    assert all(o.placements == (Partial(op),) for o in outs) or W == 1
    assert_matches(outs[0], np.stack([full_p, full_r]))
    assert_matches(outs[1], np.concatenate([full_p, full_r], axis=1))


@pytest.mark.world(4, reason="a (2, 2) mesh")
def test_stack_of_partials_on_a_2d_mesh():
    mesh = mesh_of((2, 2))
    coord = mesh.get_coordinate()
    pr = DTensor.from_local(np.random.default_rng(coord[0]).standard_normal((4, 8)), mesh,
                            [PS, R])
    pp = DTensor.from_local(np.random.default_rng(9 + 2 * coord[0] + coord[1])
                            .standard_normal((4, 8)), mesh, [PS, PS])
    with CommDebugMode() as mode:
        got = np.stack([pr, pp])
    assert mode.get_total_counts() == 0
    assert got.shape == (2, 4, 8)
    assert got.placements == (PS, PS)
    assert_matches(got, np.stack([pr.full_tensor(), pp.full_tensor()]))
