"""Backward rules of ``np.tensordot``/``np.inner``/``np.outer`` and ``np.prod``: each gradient against a
reference computed with NumPy on the full arrays (central differences, the product of the others), in float64, on sharded,
replicated and Partial inputs, even and uneven, at every world size."""

from __future__ import annotations

import numpy as np
import pytest

from mpitensor import Partial, Replicate, Shard, distribute_tensor
from ops_helpers import W, make, mesh_of, mesh_shapes

R, PS = Replicate(), Partial("sum")
MESHES = mesh_shapes()


def plain(pls):
    return tuple(R if p.is_partial() else p for p in pls)


def options(ndim):
    """The placements one mesh dim may give an operand of ``ndim`` dims."""
    return [R, PS] + [Shard(d) for d in range(ndim)]


def layouts(mesh_shape, ndims):
    """Placement tuples for operands of ``ndims`` dims, one placement per mesh dim,
    that together give each operand every option on each mesh dim."""
    count = max(len(options(n)) for n in ndims)
    out = []
    for j in range(count):
        out.append(tuple(tuple(options(n)[(j + i + m) % len(options(n))]
                               for m in range(len(mesh_shape)))
                         for i, n in enumerate(ndims)))
    return out


def weights(shape, seed=7):
    return np.random.default_rng(seed).uniform(0.5, 1.5, size=shape)


def run(prog, arrays, mesh, pls, seed=7):
    """The leaves' gradients of ``sum(c * prog(*leaves))`` for fixed weights ``c``,
    each checked to have its leaf's placements (a Partial's: Replicate) and dtype;
    returns them gathered, with ``c``."""
    xs = [make(a, mesh, p).requires_grad_() for a, p in zip(arrays, pls)]
    y = prog(*xs)
    c = weights(y.shape, seed)
    (y * distribute_tensor(c, mesh, [R] * mesh.ndim, src_data_rank=None)).sum().backward()
    grads = []
    for i, (x, p) in enumerate(zip(xs, pls)):
        assert x.grad is not None, f"input {i} got no gradient"
        assert x.grad.placements == plain(p), (i, x.grad.placements, p)
        assert x.grad.dtype == x.dtype
        grads.append(x.grad.full_tensor())
    return grads, c


def numeric(f, arrays, c, eps=1e-6):
    """Central differences of ``sum(c * f(*arrays))`` in each array, on the full
    NumPy arrays."""
    out = []
    for i, a in enumerate(arrays):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            vals = []
            for step in (eps, -eps):
                moved = [b.copy() for b in arrays]
                moved[i][idx] += step
                vals.append(float(np.sum(c * f(*moved))))
            g[idx] = (vals[0] - vals[1]) / (2 * eps)
        out.append(g)
    return out


def rng_arrays(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


# -- tensordot, inner, outer -------------------------------------------------------------

TENSORDOT = [
    ((3, 5), (5, 4), 1),
    ((3, 4, 5), (4, 5, 2), 2),
    ((3, 4, 5), (5, 2, 3), ((0, 2), (2, 0))),
    ((5, 3), (3, 5), ([1, 0], [0, 1])),
    ((4, 3), (2,), 0),
    ((3, 5), (3, 5), 2),
    ((7,), (7,), ((-1,), (-1,))),
]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("sa,sb,axes", TENSORDOT, ids=str)
def test_tensordot_matches_finite_differences(mesh_shape, sa, sb, axes):
    mesh = mesh_of(mesh_shape)
    for j, pls in enumerate(layouts(mesh_shape, [len(sa), len(sb)])):
        arrays = rng_arrays(10 + j, sa, sb)
        for call in (lambda x, y: np.tensordot(x, y, axes),
                     lambda x, y: np.tensordot(x, y, axes=axes)):
            grads, c = run(call, arrays, mesh, pls)
            expect = numeric(lambda p, q: np.tensordot(p, q, axes), arrays, c)
            for got, e in zip(grads, expect):
                np.testing.assert_allclose(got, e, rtol=1e-7, atol=1e-8, err_msg=str(pls))


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("sa,sb", [((5,), (5,)), ((3, 5), (4, 5)), ((2, 3, 4), (4,)),
                                   ((7,), (2, 7))], ids=str)
def test_inner_matches_finite_differences(mesh_shape, sa, sb):
    mesh = mesh_of(mesh_shape)
    for j, pls in enumerate(layouts(mesh_shape, [len(sa), len(sb)])):
        arrays = rng_arrays(20 + j, sa, sb)
        grads, c = run(np.inner, arrays, mesh, pls)
        for got, e in zip(grads, numeric(np.inner, arrays, c)):
            np.testing.assert_allclose(got, e, rtol=1e-7, atol=1e-8, err_msg=str(pls))


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("sa,sb", [((5,), (3,)), ((7,), (7,)), ((1,), (6,))], ids=str)
def test_outer_matches_finite_differences(mesh_shape, sa, sb):
    mesh = mesh_of(mesh_shape)
    for j, pls in enumerate(layouts(mesh_shape, [1, 1])):
        arrays = rng_arrays(30 + j, sa, sb)
        grads, c = run(np.outer, arrays, mesh, pls)
        for got, e in zip(grads, numeric(np.outer, arrays, c)):
            np.testing.assert_allclose(got, e, rtol=1e-7, atol=1e-8, err_msg=str(pls))


def test_the_same_operand_twice_gets_both_gradients():
    mesh = mesh_of((W,))
    (a,) = rng_arrays(40, (5, 3))
    # Each program runs on DTensors and, for the reference, on the full ndarray.
    for prog in (lambda x: np.tensordot(x, x, ([0], [0])), lambda x: np.inner(x, x),
                 lambda x: np.outer(x[:, 0], x[:, 0])):
        (got,), c = run(prog, [a], mesh, [(Shard(0),)])
        (expect,) = numeric(prog, [a], c)
        np.testing.assert_allclose(got, expect, rtol=1e-7, atol=1e-8)


# -- prod --------------------------------------------------------------------------------

def prod_reference(a, axis, keepdims):
    """d prod / d a: for each element, the product of the other elements of its lane
    (the element set to 1), exact with zeros."""
    g = np.empty_like(a)
    axes = tuple(range(a.ndim)) if axis is None else (axis if isinstance(axis, tuple)
                                                     else (axis,))
    axes = tuple(d % a.ndim for d in axes)
    for idx in np.ndindex(a.shape):
        lane = tuple(slice(None) if d in axes else i for d, i in enumerate(idx))
        b = a.copy()
        b[idx] = 1.0
        g[idx] = np.prod(b[lane])
    return g


def with_zeros(shape, seed, where):
    a = np.random.default_rng(seed).uniform(0.5, 1.5, size=shape)
    for idx in where:
        a[idx] = 0.0
    return a


# No zero; a single zero in a lane; two zeros in one lane and one in another; a lane
# of zeros.
ZEROS = [(), ((1, 2),), ((0, 1), (3, 1), (2, 4)), ((2, 0), (2, 1), (2, 2), (2, 3), (2, 4),
                                                    (0, 0), (1, 0), (3, 0), (4, 0))]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1)], ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("zeros", range(len(ZEROS)))
def test_prod_gradient_is_the_product_of_the_others(mesh_shape, axis, keepdims, zeros):
    mesh = mesh_of(mesh_shape)
    a = with_zeros((5, 5), zeros, ZEROS[zeros])
    expect = prod_reference(a, axis, keepdims)
    for j, (pl,) in enumerate(layouts(mesh_shape, [2])):
        for f in (lambda x: np.prod(x, axis=axis, keepdims=keepdims),
                  lambda x: x.prod(axis=axis, keepdims=keepdims),
                  lambda x: np.prod(x, axis, None, None, keepdims)):
            (got,), c = run(f, [a], mesh, [pl])
            c = np.broadcast_to(c.reshape(np.prod(a, axis=axis, keepdims=True).shape),
                                a.shape)
            np.testing.assert_allclose(got, c * expect, rtol=1e-13, atol=0,
                                       err_msg=str(pl))


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
def test_prod_in_a_chain_and_over_uneven_shards(mesh_shape):
    mesh = mesh_of(mesh_shape)
    for j, (pl,) in enumerate(layouts(mesh_shape, [3])):
        a = with_zeros((3, 7, 2), 60 + j, [(1, 3, 0), (1, 5, 0), (2, 6, 1)])

        def f(x):
            return np.tanh(x * 0.5).prod(axis=1) * 2.0
        grads, c = run(f, [a], mesh, [pl])
        (expect,) = numeric(f, [a], c)
        np.testing.assert_allclose(grads[0], expect, rtol=1e-6, atol=1e-8, err_msg=str(pl))


def test_prod_of_a_float32_input_with_a_float64_result_gets_a_float32_gradient():
    mesh = mesh_of((W,))
    a = with_zeros((4, 3), 70, [(2, 1)]).astype(np.float32)
    x = distribute_tensor(a, mesh, [Shard(0)], requires_grad=True)
    y = np.prod(x, axis=0, dtype=np.float64)
    assert y.dtype == np.float64
    y.sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.full_tensor(), prod_reference(a.astype(np.float64),
                                                                     0, False), rtol=1e-6)
