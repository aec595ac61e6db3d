"""Autograd on DTensors: the engine (leaves, accumulation, retain_grad, grad mode,
autograd.grad), torch's gradient placements for redistribute, from_local,
to_local and full_tensor, and every operation's backward checked against central
finite differences in float64 on even and uneven shapes and on any placements, at
every world size; a tensor-parallel MLP's backward collectives; torch when present.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, _trace, distribute_tensor
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import DeviceMesh, local_mesh
from ops_helpers import W, make, mesh_of, mesh_shapes

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")


def leaves(arrays, mesh, pls):
    return [make(a, mesh, p).requires_grad_() for a, p in zip(arrays, pls)]


def numeric_grad(prog, arrays, mesh, pls, i, eps=1e-6):
    """Central differences of prog's scalar value in arrays[i], every element. They
    are taken on this rank alone (a mesh of as many dims, each of one rank, where
    every placement holds the whole array), so that no perturbed element costs a
    collective; on ``mesh`` itself for a program that names it (it refuses DTensors
    of another mesh, before anything moves, on every rank alike)."""
    try:
        return _differences(prog, arrays, _alone(mesh.ndim), pls, i, eps)
    except (ValueError, TypeError, RuntimeError):
        return _differences(prog, arrays, mesh, pls, i, eps)


def _differences(prog, arrays, mesh, pls, i, eps):
    g = np.zeros_like(arrays[i])
    with mt.no_grad():
        for idx in np.ndindex(arrays[i].shape):
            vals = []
            for step in (eps, -eps):
                moved = [a.copy() for a in arrays]
                moved[i][idx] += step
                dts = [make(a, mesh, p) for a, p in zip(moved, pls)]
                vals.append(float(prog(*dts).full_tensor()))
            g[idx] = (vals[0] - vals[1]) / (2 * eps)
    return g


_ALONE: dict = {}


def _alone(ndim: int) -> DeviceMesh:
    """This rank alone as a mesh of ``ndim`` dims of size 1 (over MPI_COMM_SELF)."""
    if ndim not in _ALONE:
        _ALONE[ndim] = DeviceMesh("cpu", np.zeros((1,) * ndim, dtype=int),
                                  comm=MPI.COMM_SELF)
    return _ALONE[ndim]


def check(prog, arrays, mesh, pls, rtol=1e-6, atol=1e-6):
    """Backward of prog (a scalar of the leaves) equals finite differences (each
    leaf's .grad in the placements backward made it in, as torch's)."""
    dts = leaves(arrays, mesh, pls)
    out = prog(*dts)
    assert out.shape == () and out.requires_grad and not out.is_leaf
    out.backward()
    for i, (dt, p) in enumerate(zip(dts, pls)):
        assert dt.grad is not None, f"input {i} got no gradient"
        assert dt.grad.dtype == dt.dtype
        got = dt.grad.full_tensor()
        np.testing.assert_allclose(got, numeric_grad(prog, arrays, mesh, pls, i),
                                   rtol=rtol, atol=atol, err_msg=f"input {i}")


def weighted(y, seed=7):
    """A scalar that weighs every element of y differently (so every element's
    gradient is checked), Replicate weights not requiring grad."""
    c = np.random.default_rng(seed).uniform(0.5, 1.5, size=y.shape)
    mesh = y.device_mesh
    return (y * distribute_tensor(c, mesh, [R] * mesh.ndim, src_data_rank=None)).sum()


MESHES = mesh_shapes()
# Placements per mesh dim for a 2-D operand: sharded on either dim, replicated, or
# a Partial(sum) made of parts.
PL2 = [S0, S1, R, PS]


def layouts(mesh_shape, n):
    """A few placement tuples for n operands, each with one placement per mesh dim,
    covering every option for each operand."""
    k = len(mesh_shape)
    out = []
    for j in range(len(PL2)):
        out.append(tuple(tuple(PL2[(j + i + m) % len(PL2)] for m in range(k))
                         for i in range(n)))
    return out


def rng_arrays(seed, *shapes, positive=False):
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.5, 2.0, s) if positive else rng.standard_normal(s) for s in shapes]


SHAPES = [(4, 4), (3, 5)]  # even at every world size, uneven at 2 and 4 ranks


# -- elementwise with broadcasting ------------------------------------------------------

BINARY = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b,
    "maximum": np.maximum,
    "power": lambda a, b: a ** b,
}


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_ufuncs_match_finite_differences(mesh_shape, shape, name):
    mesh = mesh_of(mesh_shape)
    f = BINARY[name]
    positive = name in ("divide", "power")
    for j, pls in enumerate(layouts(mesh_shape, 2)):
        a, b = rng_arrays(j, shape, shape, positive=positive)
        if name == "maximum":
            b = a + np.where(np.arange(a.size).reshape(shape) % 2, 0.5, -0.5)
        check(lambda x, y: weighted(f(x, y)), [a, b], mesh, pls)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bshape", ["row", "col", "vector"])
def test_broadcasting_sums_the_gradient_over_broadcast_dims(mesh_shape, shape, bshape):
    mesh = mesh_of(mesh_shape)
    other = {"row": (1, shape[1]), "col": (shape[0], 1), "vector": (shape[1],)}[bshape]
    for j, pls in enumerate(layouts(mesh_shape, 2)):
        pb = tuple(S0 if p == S1 and len(other) == 1 else p for p in pls[1])
        a, b = rng_arrays(10 + j, shape, other, positive=True)
        for f in (lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x / y,
                  lambda x, y: y - x):
            check(lambda x, y: weighted(f(x, y)), [a, b], mesh, (pls[0], pb))


UNARY = {
    "negative": lambda a: -a,
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "absolute": lambda a: np.abs(a - 1.3),  # both signs
    "power_scalar": lambda a: a ** 3,
    "power_fraction": lambda a: a ** 2.5,
    # the exponents NumPy's ** computes by square, reciprocal and sqrt
    "power_two": lambda a: a ** 2,
    "power_minus_one": lambda a: a ** -1,
    "power_half": lambda a: a ** 0.5,
    "reciprocal": np.reciprocal,
    "scalar_power": lambda a: 1.5 ** a,
    "scalar_ops": lambda a: (2.0 - a) * 3.0 / 4.0 + 1.0,
    "scalar_divide": lambda a: 2.0 / a,
    "maximum_scalar": lambda a: np.maximum(a, 1.0),
}


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_ufuncs_match_finite_differences(mesh_shape, shape, name):
    mesh = mesh_of(mesh_shape)
    for j, (pl, _) in enumerate(layouts(mesh_shape, 2)):
        (a,) = rng_arrays(20 + j, shape, positive=True)
        a = np.where(np.abs(a - 1.0) < 1e-3, 1.1, a)  # no tie with maximum's scalar
        check(lambda x: weighted(UNARY[name](x)), [a], mesh, (pl,))


# -- reductions -------------------------------------------------------------------------

@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("func", ["sum", "mean"])
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1), -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum_and_mean_match_finite_differences(mesh_shape, shape, func, axis, keepdims):
    mesh = mesh_of(mesh_shape)
    for j, (pl, _) in enumerate(layouts(mesh_shape, 2)):
        (a,) = rng_arrays(30 + j, shape)

        def prog(x):
            y = getattr(x, func)(axis=axis, keepdims=keepdims)
            return weighted(y) if y.shape else y * 1.5
        check(prog, [a], mesh, (pl,))
        if j == 0:  # the NumPy functions take the same path
            check(lambda x: weighted(getattr(np, func)(x, axis=axis, keepdims=keepdims)
                                     * 1.0 + 0.0 * x.sum()), [a], mesh, (pl,))


# -- matmul, transpose, reshape ------------------------------------------------------------

@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("dims", [(4, 8, 4), (3, 5, 2)], ids=str)
def test_matmul_2d_matches_finite_differences(mesh_shape, dims):
    mesh = mesh_of(mesh_shape)
    n, k, m = dims
    for j, pls in enumerate(layouts(mesh_shape, 2)):
        a, b = rng_arrays(40 + j, (n, k), (k, m))
        check(lambda x, y: weighted(x @ y), [a, b], mesh, pls)
        check(lambda x, y: weighted(np.dot(x, y)), [a, b], mesh, pls)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("case", ["batched", "broadcast_b", "vector_b", "vector_a"])
def test_matmul_batched_and_1d_match_finite_differences(mesh_shape, case):
    mesh = mesh_of(mesh_shape)
    sa, sb = {"batched": ((2, 3, 4), (2, 4, 5)), "broadcast_b": ((3, 2, 4), (4, 5)),
              "vector_b": ((3, 4), (4,)), "vector_a": ((4,), (4, 3))}[case]
    for j in range(3):
        a, b = rng_arrays(50 + j, sa, sb)
        opts = [R, S0, PS]
        pa = tuple(opts[(j + m) % 3] for m in range(len(mesh_shape)))
        pb = tuple(opts[(j + m + 1) % 3] for m in range(len(mesh_shape)))
        check(lambda x, y: weighted(x @ y), [a, b], mesh, (pa, pb))


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_transpose_and_reshape_match_finite_differences(mesh_shape, shape):
    mesh = mesh_of(mesh_shape)
    for j, (pl, _) in enumerate(layouts(mesh_shape, 2)):
        (a,) = rng_arrays(60 + j, shape)
        check(lambda x: weighted(x.T * 2.0), [a], mesh, (pl,))
        check(lambda x: weighted(np.transpose(x, (1, 0))), [a], mesh, (pl,))
        check(lambda x: weighted(x.reshape(-1)), [a], mesh, (pl,))
        check(lambda x: weighted(x.reshape(shape[1], shape[0]) * 3.0), [a], mesh, (pl,))
        check(lambda x: weighted(np.reshape(x, (1, -1, 1))), [a], mesh, (pl,))


# -- the MLP: Colwise then Rowwise ------------------------------------------------------------

def mlp(x, w1, b1, w2):
    return (np.tanh(x @ w1 + b1) @ w2).redistribute(x.device_mesh, [R]).sum()


@pytest.mark.parametrize("dims", [(4, 8, 8, 4), (3, 5, 6, 2)], ids=str)
def test_tensor_parallel_mlp_matches_finite_differences(dims):
    mesh = mesh_of((W,))
    n, d, h, o = dims
    arrays = rng_arrays(70, (n, d), (d, h), (h,), (h, o))
    # ColwiseParallel's weight and bias sharded on the output features, Rowwise's
    # weight on the input features, the input Replicate.
    pls = [(R,), (S1,), (S0,), (S0,)]
    check(mlp, arrays, mesh, pls)


def test_colwise_input_gradient_is_all_reduced_and_rowwise_output_gradient_is_not():
    mesh = mesh_of((W,))
    x, w1, b1, w2 = rng_arrays(71, (4, 8), (8, 8), (8,), (8, 4))
    dx = distribute_tensor(x, mesh, [R], requires_grad=True)
    dw1 = distribute_tensor(w1, mesh, [S1], requires_grad=True)
    db1 = distribute_tensor(b1, mesh, [S0], requires_grad=True)
    dw2 = distribute_tensor(w2, mesh, [S0], requires_grad=True)
    with CommDebugMode() as fwd:
        h = np.tanh(dx @ dw1 + db1)           # Colwise: no communication
        y = (h @ dw2).redistribute(mesh, [R])  # Rowwise: the output's all-reduce
    h.retain_grad()
    loss = (y * 1.0).sum()
    with CommDebugMode() as bwd_rowwise:
        (gh,) = mt.autograd.grad(loss, [h], retain_graph=True)
    with CommDebugMode() as bwd:
        loss.backward()
    one = 1 if W > 1 else 0
    assert dict(fwd.get_comm_counts()) == ({"all_reduce": 1} if W > 1 else {})
    # Rowwise's backward: its output's Replicate gradient goes to the Partial as is.
    assert dict(bwd_rowwise.get_comm_counts()) == {}
    assert gh.placements == (S1,)
    # Colwise's input gradient is a Partial sum over the sharded features, kept
    # Partial in the Replicate input's .grad, as torch's: no collective.
    assert dict(bwd.get_comm_counts()) == {} and one in (0, 1)
    assert dx.grad.placements == (Partial(),)
    assert dw1.grad.placements == (S1,)
    assert db1.grad.placements == (S0,) and dw2.grad.placements == (S0,)
    # One CommDebugMode around both passes files each collective on its side.
    for t in (dx, dw1, db1, dw2):
        t.grad = None
    with CommDebugMode() as both:
        loss = (((np.tanh(dx @ dw1 + db1)) @ dw2).redistribute(mesh, [R]) * 1.0).sum()
        loss.backward()
    sides = both.comm_module_counts.get("Global", {"forward": {}, "backward": {}})
    assert dict(sides["forward"]) == ({"all_reduce": 1} if W > 1 else {})
    # the input's Partial gradient stays Partial in .grad: nothing in backward
    assert dict(sides["backward"]) == {}
    table = both.generate_comm_debug_tracing_table(noise_level=0)
    assert "BACKWARD PASS" not in table
    g = 1 - np.tanh(x @ w1 + b1) ** 2
    np.testing.assert_allclose(dx.grad.full_tensor(), (np.ones((4, 4)) @ w2.T * g) @ w1.T,
                               rtol=1e-12)


# -- the placement rules of DTensor's own methods ---------------------------------------------

def test_redistribute_backward_goes_back_to_the_input_placements():
    mesh = mesh_of((W,))
    (a,) = rng_arrays(80, (4, 6))
    x = distribute_tensor(a, mesh, [S0], requires_grad=True)
    y = x.redistribute(mesh, [S1])
    g = distribute_tensor(np.ones((4, 6)) * 2, mesh, [S1])
    with CommDebugMode() as mode:
        y.backward(g)
    assert y.grad_fn.name == "Redistribute"
    assert x.grad.placements == (S0,)
    assert dict(mode.get_comm_counts()) == ({"all_to_all_single": 1} if W > 1 else {})
    np.testing.assert_array_equal(x.grad.full_tensor(), np.full((4, 6), 2.0))


def test_a_partial_input_gets_a_replicate_gradient_with_no_communication():
    mesh = mesh_of((W,))
    (a,) = rng_arrays(81, (4, 6))
    x = make(a, mesh, [PS]).requires_grad_()
    y = x.redistribute(mesh, [R])  # all-reduce forward
    seen = []
    with CommDebugMode() as mode:
        (gx,) = mt.autograd.grad(weighted(y), [x])
        seen.append(dict(mode.get_comm_counts()))
    assert seen == [{}]
    assert gx.placements == (R,)


def test_redistribute_backward_casts_back_to_the_input_dtype():
    mesh = mesh_of((W,))
    x = distribute_tensor(np.ones((4, 2)), mesh, [S0], requires_grad=True)
    y = x.redistribute(mesh, [R], forward_dtype=np.float32)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float64 and x.grad.placements == (S0,)
    np.testing.assert_array_equal(x.grad.full_tensor(), np.ones((4, 2)))


def test_to_local_in_grad_mode_is_a_local_dtensor_and_from_local_takes_it_back():
    mesh = mesh_of((W,))
    (a,) = rng_arrays(82, (5, 3))
    x = distribute_tensor(a, mesh, [S0], requires_grad=True)
    local = x.to_local()
    assert type(local) is DTensor and local.device_mesh is local_mesh()
    assert local.requires_grad and local.grad_fn.name == "ToLocal"
    # Local NumPy work on the shard, recorded; from_local closes the round trip.
    y = DTensor.from_local(np.exp(local) * 2.0, mesh, [S0], shape=(5, 3),
                           stride=(3, 1))
    assert y.grad_fn.name == "FromLocal"
    weighted(y).backward()
    c = np.random.default_rng(7).uniform(0.5, 1.5, size=(5, 3))
    np.testing.assert_allclose(x.grad.full_tensor(), 2 * np.exp(a) * c, rtol=1e-12)
    # Outside grad mode, and for tensors that need no grad: the plain ndarray.
    with mt.no_grad():
        assert type(x.to_local()) is np.ndarray
    assert type(x.detach().to_local()) is np.ndarray
    # A local DTensor never turns into an ndarray silently.
    with pytest.raises(TypeError):
        np.asarray(local)


def test_to_local_grad_placements_wrap_the_local_gradient():
    mesh = mesh_of((W,))
    x = distribute_tensor(np.arange(8.0), mesh, [R], requires_grad=True)
    # Each rank uses its replica for a different job: the local gradients are parts
    # of a sum, Partial; the Replicate input's gradient all-reduces them.
    local = x.to_local(grad_placements=[Partial()])
    r = mesh.get_rank()
    part = (local * float(r + 1)).sum()
    with CommDebugMode() as mode:
        part.backward()
    total = sum(range(1, W + 1))
    np.testing.assert_array_equal(x.grad.full_tensor(), np.full(8, float(total)))
    # kept Partial in .grad, as torch's: reduced by whoever reads it
    assert dict(mode.get_comm_counts()) == {} and x.grad.placements == (Partial(),)
    # The default is the forward placements: Replicate, each rank's own value.
    y = distribute_tensor(np.arange(8.0), mesh, [R], requires_grad=True)
    (y.to_local() * 3.0).sum().backward()
    np.testing.assert_array_equal(y.grad.to_local(), np.full(8, 3.0))


def test_full_tensor_grad_placements():
    mesh = mesh_of((W,))
    (a,) = rng_arrays(83, (5, 2))
    x = distribute_tensor(a, mesh, [S0], requires_grad=True)
    full = x.full_tensor()
    assert type(full) is DTensor and full.shape == (5, 2)
    (full * 2.0).sum().backward()  # default grad placements: Replicate
    np.testing.assert_array_equal(x.grad.full_tensor(), np.full((5, 2), 2.0))
    z = distribute_tensor(a, mesh, [S0], requires_grad=True)
    loss = (z.full_tensor(grad_placements=[Partial()]) * 1.0).sum()
    with CommDebugMode() as mode:
        loss.backward()
    np.testing.assert_array_equal(z.grad.full_tensor(), np.full((5, 2), float(W)))
    assert dict(mode.get_comm_counts()) == ({"reduce_scatter_tensor": 1} if W > 1 else {})


def test_from_local_backward_redistributes_to_the_forward_placements():
    mesh = mesh_of((W,))
    base = distribute_tensor(np.ones((2 * W, 3)), mesh, [R], requires_grad=True)
    local = base.to_local()  # (2W, 3) on the local mesh
    y = DTensor.from_local(local * 1.0, mesh, [S0])  # global (2W*W, 3)
    g = distribute_tensor(np.arange(2.0 * W * W * 3).reshape(2 * W * W, 3), mesh, [R])
    y.backward(g)
    r = mesh.get_rank()
    expect = np.arange(2.0 * W * W * 3).reshape(2 * W * W, 3)[2 * W * r:2 * W * (r + 1)]
    np.testing.assert_array_equal(base.grad.to_local(), expect)


def test_from_local_refuses_a_dtensor_of_another_mesh():
    mesh = mesh_of((W,))
    x = distribute_tensor(np.ones(4), mesh, [R])
    with pytest.raises(TypeError, match="local mesh"):
        DTensor.from_local(x, mesh, [R])


# -- the engine ----------------------------------------------------------------------------

def test_leaves_flags_and_factories():
    mesh = mesh_of((W,))
    for make_one in (lambda: mt.zeros(4, 2, device_mesh=mesh, requires_grad=True),
                     lambda: mt.ones(4, device_mesh=mesh, requires_grad=True),
                     lambda: mt.empty(3, device_mesh=mesh, requires_grad=True),
                     lambda: mt.full((2, 2), 1.5, device_mesh=mesh, requires_grad=True),
                     lambda: mt.rand(5, device_mesh=mesh, requires_grad=True),
                     lambda: mt.randn(5, device_mesh=mesh, requires_grad=True),
                     lambda: distribute_tensor(np.ones(4), mesh, [S0], requires_grad=True)):
        t = make_one()
        assert t.requires_grad and t.is_leaf and t.grad_fn is None and t.grad is None
    assert not mt.zeros(4, device_mesh=mesh).requires_grad
    t = distribute_tensor(np.ones(4), mesh, [S0], requires_grad=True)
    assert distribute_tensor(t, mesh, [S0]) is t and t.requires_grad  # keeps its flag
    with pytest.raises(RuntimeError, match="floating point"):
        mt.zeros(4, dtype=np.int64, device_mesh=mesh, requires_grad=True)
    y = t * 2
    assert y.requires_grad and not y.is_leaf and y.grad_fn.name == "multiply"
    with pytest.raises(RuntimeError, match="leaf"):
        y.requires_grad_(False)
    d = y.detach()
    assert not d.requires_grad and d.is_leaf
    assert (d * 2).grad_fn is None
    assert not (t > 0).requires_grad  # bool results need no gradient


def test_gradients_accumulate_across_backward_calls_and_retain_grad():
    mesh = mesh_of((W,))
    w = distribute_tensor(np.arange(6.0), mesh, [S0], requires_grad=True)
    h = w * 3.0
    h.retain_grad()
    (h * h).sum().backward()
    np.testing.assert_array_equal(h.grad.full_tensor(), 6 * np.arange(6.0))
    np.testing.assert_array_equal(w.grad.full_tensor(), 18 * np.arange(6.0))
    (w * 2.0).sum().backward()
    np.testing.assert_array_equal(w.grad.full_tensor(), 18 * np.arange(6.0) + 2)
    w.grad = None
    (w + w).sum().backward()  # two paths into one leaf add up
    np.testing.assert_array_equal(w.grad.full_tensor(), np.full(6, 2.0))


def test_the_graph_is_freed_unless_retained():
    mesh = mesh_of((W,))
    w = distribute_tensor(np.ones(4), mesh, [S0], requires_grad=True)
    loss = (w * w).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_array_equal(w.grad.full_tensor(), np.full(4, 4.0))
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_backward_needs_a_gradient_for_non_scalars_and_a_tensor_that_requires_grad():
    mesh = mesh_of((W,))
    w = distribute_tensor(np.ones(4), mesh, [S0], requires_grad=True)
    with pytest.raises(RuntimeError, match="scalar outputs"):
        (w * 2).backward()
    with pytest.raises(RuntimeError, match="does not require grad"):
        distribute_tensor(np.ones(4), mesh, [S0]).sum().backward()
    with pytest.raises(RuntimeError, match="shape"):
        (w * 2).backward(distribute_tensor(np.ones(3), mesh, [S0]))


def test_grad_mode():
    mesh = mesh_of((W,))
    w = distribute_tensor(np.ones(4), mesh, [S0], requires_grad=True)
    with mt.no_grad():
        assert not mt.autograd.is_grad_enabled()
        y = w * 2
        with mt.enable_grad():
            z = w * 2
    assert mt.autograd.is_grad_enabled()
    assert not y.requires_grad and z.requires_grad

    @mt.no_grad()
    def step():
        return w * 2
    assert not step().requires_grad
    with mt.autograd.set_grad_enabled(False):
        assert not (w * 2).requires_grad
    assert (w * 2).requires_grad


def test_autograd_grad_leaves_dot_grad_alone():
    mesh = mesh_of((W,))
    w = distribute_tensor(np.arange(4.0), mesh, [S0], requires_grad=True)
    v = distribute_tensor(np.ones(4), mesh, [R], requires_grad=True)
    (gw,) = mt.autograd.grad((w * w).sum(), [w])
    assert w.grad is None and gw.placements == (S0,)
    np.testing.assert_array_equal(gw.full_tensor(), 2 * np.arange(4.0))
    with pytest.raises(RuntimeError, match="not have been used"):
        mt.autograd.grad((w * 2).sum(), [v])
    assert mt.autograd.grad((w * 2).sum(), [w, v], allow_unused=True)[1] is None


def test_operations_without_a_rule_refuse_rather_than_drop_the_gradient():
    mesh = mesh_of((W,))
    w = distribute_tensor(np.ones((4, 2)), mesh, [S0], requires_grad=True)
    with pytest.raises(NotImplementedError, match="no_grad"):
        np.ptp(w, axis=0)
    with pytest.raises(NotImplementedError, match="arctan"):
        np.arctan(w)
    with pytest.raises(RuntimeError, match="in-place"):
        w += 1.0
    with mt.no_grad():
        w -= 0.5  # an update outside grad mode is fine
    np.testing.assert_array_equal(w.detach().full_tensor(), np.full((4, 2), 0.5))


def test_a_dtensor_by_keyword_that_requires_grad_is_refused_not_dropped():
    """A recorded function's node takes its positional arguments as inputs: one
    given by keyword (``np.sum(a=x)``) would get no gradient, so the call raises,
    whatever the function; positionally, under no_grad or detached, it runs."""
    mesh = mesh_of((W,))
    x = distribute_tensor(np.arange(8.0).reshape(4, 2), mesh, [S0], requires_grad=True)
    calls = [lambda a: np.sum(a=a), lambda a: np.mean(a=a, axis=0),
             lambda a: np.transpose(a=a), lambda a: np.concatenate(arrays=[a, a]),
             lambda a: np.dot(a.T, b=a)]
    for call in calls:
        with pytest.raises(NotImplementedError, match=r"(a|arrays|b)=.*positionally"):
            call(x)
        with mt.no_grad():
            call(x)
        call(x.detach())
    np.sum(x).backward()
    np.testing.assert_array_equal(x.grad.full_tensor(), np.ones((4, 2)))


def test_a_one_rank_program_runs_on_the_local_mesh():
    # The single-process case: the same program on a mesh of this rank alone.
    mesh = local_mesh()
    x = distribute_tensor(np.arange(6.0).reshape(2, 3), mesh, [S0], requires_grad=True)
    (x * x).mean().backward()
    np.testing.assert_allclose(x.grad.to_local(), 2 * np.arange(6.0).reshape(2, 3) / 6)


# -- recording in the executor -------------------------------------------------------------------

def test_the_executor_records_without_python_entries():
    mesh = mesh_of((W,))
    a = distribute_tensor(np.ones((4, 4)), mesh, [S0])
    w = distribute_tensor(np.ones((4, 4)), mesh, [S0], requires_grad=True)
    a + a  # decided once
    np.exp(a)
    a.sum(axis=0)
    calls = _python_calls()
    a + a
    np.exp(a)
    a.sum(axis=0)
    assert _python_calls() == calls  # all three in the executor
    out = a + w
    assert out.grad_fn.name == "add" and out.grad_fn.inputs[1] is w
    assert _python_calls() == calls  # and it records there
    with mt.no_grad():
        out = a + w
    assert out.grad_fn is None and _python_calls() == calls


_RECORDED = {  # the operations the executor records, as users write them
    "add": lambda x, y: x + y,
    "subtract": lambda x, y: 2.0 - x,
    "multiply": lambda x, y: x * y,
    "divide": lambda x, y: x / (y * y + 1),
    "tanh": lambda x, y: np.tanh(x),
    "exp": lambda x, y: np.exp(x),
    "matmul": lambda x, y: x @ y,
    "sum": lambda x, y: x.sum(axis=0),
    "mean": lambda x, y: x.mean(1, keepdims=True),
    "max": lambda x, y: x.max(axis=1),
    "min": lambda x, y: x.min(),
    "var": lambda x, y: x.var(axis=0),
    "std": lambda x, y: x.std(),
}


@pytest.mark.parametrize("name", sorted(_RECORDED))
@pytest.mark.parametrize("pls", [((S0,), (S0,)), ((S0,), (R,)), ((S1,), (R,))])
def test_a_traced_call_records_the_node_an_untraced_one_records(name, pls):
    # A listening CommDebugMode only adds the executor's trace events: the node
    # names the same operation and inputs, holds the operands, and gives the same
    # gradients and gradient placements.
    mesh = mesh_of((W,))
    arrays = [np.random.default_rng(3).standard_normal((5, 5)) + 3 for _ in range(2)]
    op = _RECORDED[name]
    nodes, grads = [], []
    for traced in (False, True):
        x, y = leaves(arrays, mesh, pls)
        if traced:
            with CommDebugMode():
                out = op(x, y)
        else:
            out = op(x, y)
        node = out.grad_fn
        nodes.append((node.name, tuple(i is x or i is y for i in node.inputs),
                      node.saved is None))
        (out * out).sum().backward()
        grads.append([(g.placements, g.full_tensor()) for g in (x.grad, y.grad)
                      if g is not None])
    assert nodes[0] == nodes[1] and nodes[0][0] == name and not nodes[0][2]
    for (c_pl, c_g), (p_pl, p_g) in zip(*grads, strict=True):
        assert c_pl == p_pl
        np.testing.assert_allclose(c_g, p_g, rtol=1e-12)


def test_a_c_recorded_node_is_freed_by_backward_and_kept_by_retain_graph():
    mesh = mesh_of((W,))
    w = distribute_tensor(np.arange(1.0, 9.0).reshape(4, 2), mesh, [S0], requires_grad=True)
    h = np.tanh(w * 0.5)
    node = h.grad_fn
    assert repr(node) == "<tanh backward>" and node.saved[0] is h.grad_fn.inputs[0]
    assert node.inputs[0].grad_fn.name == "multiply" and node.aux is None
    loss = h.sum(axis=0).sum()
    assert loss.grad_fn.aux == (None, False) and h.sum(axis=0).grad_fn.aux == (0, False)
    loss.backward(retain_graph=True)
    assert node.backward_fn is not None and node.saved is not None
    first = w.grad.full_tensor()
    loss.backward()
    np.testing.assert_allclose(w.grad.full_tensor(), 2 * first)
    # Freed: the node no longer holds the operands (nor the forward's arrays).
    assert node.backward_fn is None and node.saved is None and node.inputs == ()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_a_c_recorded_result_without_gradients_gets_no_node():
    mesh = mesh_of((W,))
    w = distribute_tensor(np.arange(16.0).reshape(4, 4), mesh, [S0], requires_grad=True)
    (w > 0), w.max(axis=1)  # decided once
    python = _python_calls()
    # No rule and no gradient (bool, int): run as with grad mode off.
    mask, where = w > 0, w.argmax(axis=1)
    assert _python_calls() == python
    assert mask.grad_fn is None and not mask.requires_grad and where.grad_fn is None
    np.testing.assert_array_equal(where.full_tensor(), [3, 3, 3, 3])
    with pytest.raises(NotImplementedError, match="arctan"):
        np.arctan(w)  # no rule: the executor refuses to drop the gradient


def _python_calls():
    from mpitensor import _C
    return _trace.hook_stats()["entry"]


# -- local_map ------------------------------------------------------------------------------

def test_local_map_records_the_local_function():
    from mpitensor.experimental import local_map

    mesh = mesh_of((W,))
    mm = local_map(lambda p, q: np.exp(p) @ q, out_placements=[PS],
                   in_placements=([S1], [S0]))

    def prog(w, x):
        return weighted(mm(w, x).redistribute(mesh, [R]))
    check(prog, rng_arrays(90, (3, 2 * W), (2 * W, 4)), mesh, [(S1,), (S0,)])
    check(prog, rng_arrays(91, (3, W + 1), (W + 1, 2)), mesh, [(S1,), (S0,)])


def test_local_map_in_grad_placements_declare_partial_local_gradients():
    from mpitensor.experimental import local_map

    mesh = mesh_of((W,))
    scale = float(mesh.get_rank() + 1)
    # Each rank scales the replicated input by its own factor: the outputs are parts
    # of a sum, and so are the local gradients of the input.
    part = local_map(lambda v: v * scale, out_placements=[PS], in_placements=([R],),
                     in_grad_placements=([PS],))
    check(lambda v: weighted(part(v).redistribute(mesh, [R])), rng_arrays(92, (5,)),
          mesh, [(R,)])


def test_redistribute_backward_dtype_casts_before_the_collective():
    mesh = mesh_of((W,))
    x = distribute_tensor(np.ones((2 * W, 3)), mesh, [S0], requires_grad=True)
    y = x.redistribute(mesh, [R], backward_dtype=np.float32)
    loss = (y * 0.5).sum()
    with CommDebugMode() as mode:
        loss.backward()
    assert x.grad.dtype == np.float64 and x.grad.placements == (S0,)
    np.testing.assert_array_equal(x.grad.full_tensor(), np.full((2 * W, 3), 0.5))
    # A Partial gradient reduce-scattered as float32: half the bytes of float64.
    sent = []
    for dtype in (np.float32, None):
        p = make(np.ones((2 * W, 3)), mesh, [S0]).requires_grad_()
        z = p.redistribute(mesh, [R], backward_dtype=dtype)
        loss = (z * DTensor.from_local(np.ones((2 * W, 3)), mesh, [PS])).sum()
        with CommDebugMode() as mode:
            loss.backward()
        assert dict(mode.get_comm_counts()) == ({"reduce_scatter_tensor": 1} if W > 1 else {})
        sent.append(mode.get_comm_bytes()["reduce_scatter_tensor"])
        assert p.grad.dtype == np.float64
        np.testing.assert_array_equal(p.grad.full_tensor(), np.full((2 * W, 3), float(W)))
    assert 2 * sent[0] == sent[1]


# -- einsum, where, concatenate, stack ---------------------------------------------------

@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("sub,shapes", [
    ("ij,jk->ik", ((3, 4), (4, 5))),
    ("bij,bjk->bik", ((2, 3, 4), (2, 4, 3))),
    ("ij,ij->", ((3, 5), (3, 5))),
    ("ij,k->ik", ((3, 4), (5,))),          # j summed in one operand alone
    ("ijk->ki", ((2, 3, 4),)),
], ids=str)
def test_einsum_matches_finite_differences(mesh_shape, sub, shapes):
    mesh = mesh_of(mesh_shape)
    opts = [S0, R, PS, S1]
    for j in range(2):
        values = rng_arrays(100 + j, *shapes)
        pls = [tuple(opts[(j + i + m) % 4] if opts[(j + i + m) % 4] != S1 or len(s) > 1
                     else R for m in range(len(mesh_shape)))
               for i, s in enumerate(shapes)]
        check(lambda *xs: weighted(np.einsum(sub, *xs)), values, mesh, pls)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_where_concatenate_stack_match_finite_differences(mesh_shape):
    mesh = mesh_of(mesh_shape)
    for j, pls in enumerate(layouts(mesh_shape, 2)):
        a, b = rng_arrays(110 + j, (3, 5), (3, 5))
        check(lambda x, y: weighted(np.where(x > 0, x * y, y)), [a, b], mesh, pls)
        check(lambda x, y: weighted(np.concatenate([x, y * 2.0, x], axis=1)), [a, b],
              mesh, pls)
        check(lambda x, y: weighted(np.concatenate([y, x], axis=0)), [a, b], mesh, pls)
        check(lambda x, y: weighted(np.stack([x, y, x * y], axis=1)), [a, b], mesh, pls)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("key", [
    (slice(1, 3),), (slice(None), slice(2, None)), (1,), (Ellipsis, -1),
    (None, slice(0, 2), 3), (slice(None), None), (2, 4), (0, slice(1, 2)),
], ids=str)
def test_basic_indexing_matches_finite_differences(mesh_shape, key):
    mesh = mesh_of(mesh_shape)
    for j, (pl, _) in enumerate(layouts(mesh_shape, 2)):
        (a,) = rng_arrays(120 + j, (3, 5))
        check(lambda x: weighted(x[key] * 2.0), [a], mesh, (pl,))


def test_backward_frees_the_forward_tensors():
    import gc
    import weakref

    mesh = mesh_of((W,))
    w = distribute_tensor(np.ones((4, 4)), mesh, [S0], requires_grad=True)
    h = np.tanh(w * 2.0)
    alive = weakref.ref(h.detach().to_local())  # its array
    loss = (h * h).sum()
    del h
    gc.collect()
    assert alive() is not None  # the graph keeps it for backward
    loss.backward()
    gc.collect()
    assert alive() is None and loss.grad_fn is not None


@pytest.mark.skipif(W < 2, reason="needs a rank outside the mesh")
def test_a_rank_outside_the_mesh_runs_the_same_backward():
    from mpitensor import DeviceMesh

    mesh = DeviceMesh("cpu", list(range(W - 1)))
    a, b = rng_arrays(130, (5, 3), (3, 4))
    x = distribute_tensor(a, mesh, [S0], requires_grad=True)
    w = distribute_tensor(b, mesh, [R], requires_grad=True)
    np.tanh(x @ w).sum().backward()
    assert x.grad.placements == (S0,)
    gx, gw = x.grad.full_tensor(), w.grad.full_tensor()
    if mesh.get_coordinate() is None:
        assert gx.size == 0 and gw.size == 0
    else:
        d = 1 - np.tanh(a @ b) ** 2
        np.testing.assert_allclose(gx, d @ b.T, rtol=1e-12)
        np.testing.assert_allclose(gw, a.T @ d, rtol=1e-12)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("func", ["max", "min"])
@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_max_min_match_finite_differences(mesh_shape, func, axis, keepdims):
    mesh = mesh_of(mesh_shape)
    for j, (pl, _) in enumerate(layouts(mesh_shape, 2)):
        (a,) = rng_arrays(140 + j, (3, 5))

        def prog(x):
            y = getattr(x, func)(axis=axis, keepdims=keepdims)
            return weighted(y) if y.shape else y * 1.5
        check(prog, [a], mesh, (pl,))


def test_max_shares_the_gradient_between_ties_and_clip_masks_it():
    mesh = mesh_of((W,))
    x = distribute_tensor(np.array([1.0, 3.0, 3.0, 0.0]), mesh, [S0], requires_grad=True)
    np.max(x).backward()
    np.testing.assert_array_equal(x.grad.full_tensor(), [0.0, 0.5, 0.5, 0.0])
    y = distribute_tensor(np.array([-2.0, 0.5, 2.0, 1.0]), mesh, [S0], requires_grad=True)
    (np.clip(y, -1.0, 1.0) * 2.0).sum().backward()
    np.testing.assert_array_equal(y.grad.full_tensor(), [0.0, 2.0, 0.0, 2.0])
    z = distribute_tensor(np.array([-2.0, 0.5, 2.0]), mesh, [R], requires_grad=True)
    np.clip(z, None, 1.0).sum().backward()
    np.testing.assert_array_equal(z.grad.full_tensor(), [1.0, 1.0, 0.0])


def test_data_tools_see_the_data_of_tensors_that_require_grad():
    import shutil
    import tempfile

    from mpi4py import MPI

    from mpitensor import nn
    from mpitensor.parallel import ColwiseParallel, parallelize_module
    from mpitensor.testing import assert_close

    comm = MPI.COMM_WORLD
    mesh = mesh_of((W,))
    w = distribute_tensor(np.arange(8.0).reshape(4, 2), mesh, [S0], requires_grad=True)
    assert_close(w, distribute_tensor(np.arange(8.0).reshape(4, 2), mesh, [R]))
    path = comm.bcast(tempfile.mkdtemp(prefix="mt-autograd-") if comm.rank == 0 else None)
    mt.save({"w": w}, path + "/ckpt")
    back = mt.load(path + "/ckpt", mesh)
    np.testing.assert_array_equal(back["w"].full_tensor(), np.arange(8.0).reshape(4, 2))
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    lin = parallelize_module(nn.Linear(2, 3), mesh, ColwiseParallel())
    state = {k: np.ones(v.shape) for k, v in lin.state_dict().items()}
    lin.weight.requires_grad_()
    lin.load_state_dict(state)
    assert lin.weight.is_leaf and lin.weight.requires_grad
    np.testing.assert_array_equal(lin.weight.detach().full_tensor(), np.ones((3, 2)))


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("func", ["var", "std"])
@pytest.mark.parametrize("axis,ddof,keepdims", [(None, 0, False), (0, 1, True), (1, 0, False),
                                                 (-1, 1, False)])
def test_var_std_match_finite_differences(mesh_shape, func, axis, ddof, keepdims):
    mesh = mesh_of(mesh_shape)
    for j, (pl, _) in enumerate(layouts(mesh_shape, 2)):
        (a,) = rng_arrays(150 + j, (3, 5))

        def prog(x):
            y = getattr(np, func)(x, axis=axis, ddof=ddof, keepdims=keepdims)
            return weighted(y) if y.shape else y * 1.5
        check(prog, [a], mesh, (pl,))


def test_queue_callback_runs_once_after_the_graph():
    """torch's final callback: queued from a hook during backward (twice: it runs
    once), it runs after every node, still in backward; outside a backward it
    raises as torch's."""
    from mpitensor import _modes
    from mpitensor.autograd._engine import queue_callback

    mesh = mesh_of((W,))
    x = make(np.arange(4.0), mesh, [Replicate()]).requires_grad_()
    seen = []

    def final():
        seen.append(("final", x.grad is not None, _modes.state.backward))

    def hook(g):
        seen.append("hook")
        queue_callback(final)
        queue_callback(final)

    y = x * 2
    y.register_hook(hook)
    (y * y).sum().backward()
    assert seen == ["hook", ("final", True, True)]
    with pytest.raises(RuntimeError, match="only be installed during backward"):
        queue_callback(final)


def test_every_node_is_called_with_grad_node_and_output():
    # One calling convention: a closure recorded from Python gets what an
    # executor-made node's rule gets.
    mesh = mesh_of((W,))
    w = distribute_tensor(np.arange(1.0, 9.0).reshape(4, 2), mesh, [S0], requires_grad=True)
    seen = []

    def backward_fn(g, node, output):
        seen.append((node, output))
        return (g * 3,)

    y = mt.autograd._engine.record("triple", w * 1, (w,), backward_fn)
    y.sum().backward()
    assert len(seen) == 1 and seen[0][0] is y.grad_fn and seen[0][1] is y
    np.testing.assert_allclose(w.grad.full_tensor(), np.full((4, 2), 3.0))


def test_a_backward_is_registered_one_way():
    register = mt.autograd._engine.register_backward
    # What the executor does not run itself takes no operand backward ...
    with pytest.raises(ValueError, match="is not registered"):
        register(np.flipud, "flipud", lambda g, node, out: (g,), operands=True)
    # ... and an operand backward is one callable, for every call.
    with pytest.raises(TypeError, match="operand backward"):
        register(np.tanh, "tanh", None, operands=True)
    with pytest.raises(TypeError, match="callable, None or True"):
        register(np.flipud, "flipud", 3)
    assert mt._registry.backwards[np.flipud][0] == "flipud"


def test_every_node_is_made_by_the_one_constructor():
    # The graph is written on one side: mt_ext_record makes every node, Python
    # code records through _C.record and never builds a Node itself.
    import pathlib
    import re
    package = pathlib.Path(mt.__file__).parent
    makers = [str(p.relative_to(package)) for p in package.rglob("*.py")
              if re.search(r"\bNode\(", p.read_text())]
    assert makers == []
    with pytest.raises(TypeError):
        mt.autograd.Node("made", (), None)
