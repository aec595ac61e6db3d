"""Backward rules of stepped slices, ``np.tensordot``/``np.inner``/``np.outer`` and
``np.prod``: each gradient against a reference computed with NumPy on the full
arrays (the scattered weights, central differences, the product of the others), in
float64, on sharded, replicated and Partial inputs, even and uneven, at every world
size; and against torch DTensor on gloo when torch is installed (skipped otherwise),
where torch has the operation: slices of positive step, and the layouts its
tensordot and prod do not refuse as uneven. ``np.clip`` with DTensor bounds and an
integer array among slices (``x[:, [1, 0, 1]]``) against torch's gradients on the
full tensors."""

from __future__ import annotations

import numpy as np
import pytest

from mpitensor import Shard, distribute_tensor
from mpitensor.debug import CommDebugMode
from grad_helpers import PS, R, layouts, numeric, plain, rng_arrays, run, torch_grads
from ops_helpers import W, make, mesh_of, mesh_shapes, mesh_shapes_1d_2d

MESHES = mesh_shapes()


# -- stepped slices ----------------------------------------------------------------------

STEPPED = [
    np.s_[::2], np.s_[1:7:3, ::-1], np.s_[::-1], np.s_[::-2, 1], np.s_[5:0:-2, 1:4:2],
    np.s_[None, -1::-3, ..., ::3], np.s_[2, ::-1], np.s_[1:6:2, None, 2:],
    np.s_[..., ::-4],
]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", [(7, 5), (8, 4)], ids=str)
@pytest.mark.parametrize("key", STEPPED, ids=str)
def test_stepped_slices_scatter_the_gradient(mesh_shape, shape, key):
    mesh = mesh_of(mesh_shape)
    for j, (pl,) in enumerate(layouts(mesh_shape, [2])):
        (a,) = rng_arrays(j, shape)
        (got,), c = run(lambda x: x[key] * 2.0, [a], mesh, [pl])
        expect = np.zeros_like(a)
        expect[key] = 2.0 * c
        np.testing.assert_allclose(got, expect, rtol=1e-14, atol=0, err_msg=str(pl))


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("key", [np.s_[::2], np.s_[1:7:3, ::-1], np.s_[::-2, 1:]], ids=str)
def test_a_sharded_or_partial_gradient_is_scattered_too(mesh_shape, key):
    # The gradient reaching the slice is sharded (the sliced result redistributed) or
    # Partial (the slice taken of a Partial input and never reduced).
    mesh = mesh_of(mesh_shape)
    (a,) = rng_arrays(3, (7, 5))
    for pl in [(Shard(0),) * len(mesh_shape), (Shard(1),) * len(mesh_shape),
               (R,) * len(mesh_shape)]:
        def prog(x, pl=pl):
            return x[key].redistribute(mesh, pl)
        for src in [(R,) * len(mesh_shape), (PS,) * len(mesh_shape),
                    (Shard(0),) * len(mesh_shape)]:
            (got,), c = run(prog, [a], mesh, [src])
            expect = np.zeros_like(a)
            expect[key] = c
            np.testing.assert_allclose(got, expect, rtol=1e-14, atol=0)
    (got,), c = run(lambda x: x[key] * 3.0, [a], mesh, [(PS,) * len(mesh_shape)])
    expect = np.zeros_like(a)
    expect[key] = 3.0 * c
    np.testing.assert_allclose(got, expect, rtol=1e-14, atol=0)


def test_a_stepped_slice_of_a_shard_has_a_backward_without_communication():
    # The forward gathers the picked rows into a Replicate result; its gradient is
    # written by each rank into its own rows, and the leaf keeps Shard(0).
    mesh = mesh_of((W,))
    x = distribute_tensor(np.arange(24.0).reshape(8, 3), mesh, [Shard(0)],
                          requires_grad=True)
    loss = (x[1::3, ::-1] * 2.0).sum()
    with CommDebugMode() as mode:
        loss.backward()
    assert mode.get_total_counts() == 0
    expect = np.zeros((8, 3))
    expect[1::3] = 2.0
    assert x.grad.placements == (Shard(0),)
    np.testing.assert_array_equal(x.grad.full_tensor(), expect)


def test_a_stepped_slice_used_twice_accumulates():
    mesh = mesh_of((W,))
    (a,) = rng_arrays(4, (7, 3))
    (got,), c = run(lambda x: x[::2] + x[::-2] * x[::2], [a], mesh, [(Shard(0),)])
    expect = np.zeros_like(a)
    expect[::2] += c * (1 + a[::-2])
    expect[::-2] += c * a[::2]
    np.testing.assert_allclose(got, expect, rtol=1e-13)


# -- advanced indexing ---------------------------------------------------------------------

TAKES = [[0, 2], [3, 0, 3, 3], [-1, 1, 0, 5, 6, 2, 4], np.array([], np.int64), np.array([4, 4, 1])]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", [(7, 3), (8, 2)], ids=str)
@pytest.mark.parametrize("key", range(len(TAKES)))
def test_an_integer_array_adds_the_gradient_rows_in(mesh_shape, shape, key):
    idx = TAKES[key]
    mesh = mesh_of(mesh_shape)
    for j, pls in enumerate(layouts(mesh_shape, [len(shape)])):
        arrays = rng_arrays(50 + j, shape)
        (got,), c = run(lambda x: x[idx], arrays, mesh, pls)
        expect = np.zeros(shape)
        np.add.at(expect, np.asarray(idx, np.int64), c)
        np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12, err_msg=str(pls))


def masks(shape):
    rng = np.random.default_rng(sum(shape))
    return [rng.random(shape[:1]) > 0.4, rng.random(shape) > 0.5,
            np.zeros(shape[:1], bool), np.ones(shape, bool)]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", [(7, 3), (8, 2)], ids=str)
@pytest.mark.parametrize("which", range(4))
@pytest.mark.parametrize("as_dtensor", [False, True], ids=["ndarray", "dtensor"])
def test_a_boolean_mask_writes_the_gradient_where_it_picked(mesh_shape, shape, which,
                                                            as_dtensor):
    mask = masks(shape)[which]
    mesh = mesh_of(mesh_shape)
    for j, pls in enumerate(layouts(mesh_shape, [len(shape)])):
        key = (distribute_tensor(mask, mesh, [R] * mesh.ndim, src_data_rank=None)
               if as_dtensor else mask)
        arrays = rng_arrays(70 + j, shape)
        (got,), c = run(lambda x: x[key], arrays, mesh, pls)
        expect = np.zeros(shape)
        expect[mask] = c
        np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12, err_msg=str(pls))


def test_the_backward_of_an_integer_array_reverses_the_forwards_exchange():
    """Shard(0) rows picked by an index list: the forward sends each picked row to
    its output shard and the backward sends each gradient row back, one exchange
    of variable parts each way (the counts, then the rows), never the whole array."""
    mesh = mesh_of((W,))
    w = distribute_tensor(np.arange(16.0).reshape(8, 2), mesh, [Shard(0)],
                          requires_grad=True)
    with CommDebugMode() as comm:
        y = w[[7, 0, 7, 3]]
    forward = comm.get_total_counts()
    with CommDebugMode() as comm:
        y.sum().backward()
    assert comm.get_total_counts() == forward
    assert w.grad.placements == (Shard(0),)
    expect = np.zeros((8, 2))
    expect[[0, 3]] = 1.0
    expect[7] = 2.0
    np.testing.assert_array_equal(w.grad.full_tensor(), expect)


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


def test_prod_over_a_sharded_axis_reduces_the_product_and_the_count_once_each():
    # The lane's zero count and product of nonzeros are all the backward moves; with
    # the forward's all-reduce that makes as many collectives as torch DTensor's
    # prod, which gathers the whole input for its backward.
    mesh = mesh_of((W,))
    a = with_zeros((2 * W, 3), 71, [(1, 1)])
    x = distribute_tensor(a, mesh, [Shard(0)], requires_grad=True)
    loss = x.prod() * 2.0
    with CommDebugMode() as mode:
        loss.backward()
    assert dict(mode.get_comm_counts()) == ({"all_reduce": 2} if W > 1 else {})
    np.testing.assert_allclose(x.grad.full_tensor(), 2.0 * prod_reference(a, None, False),
                               rtol=1e-13)


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


@pytest.mark.parametrize("pls", [[Shard(0)], [R], [PS]], ids=str)
def test_numpy_astype_has_the_method_s_backward(pls):
    mesh = mesh_of((W,))
    a = np.arange(12.0).reshape(4, 3)
    seen = []
    for cast in (lambda x: x.astype(np.float32), lambda x: np.astype(x, np.float32)):
        x = make(a, mesh, pls).requires_grad_()
        y = cast(x)
        assert y.dtype == np.float32
        (y * y).sum().backward()
        assert x.grad.dtype == np.float64
        np.testing.assert_array_equal(x.grad.full_tensor(), 2 * a)
        seen.append((y.placements, x.grad.placements))
    assert seen[0] == seen[1]


# -- against torch (skipped without it) --------------------------------------------------

@pytest.fixture(scope="module")
def tmesh():
    pytest.importorskip("torch")
    from torch.distributed.device_mesh import init_device_mesh
    from torch_helpers import init_gloo

    init_gloo()
    return init_device_mesh("cpu", (W,))


# torch's slices step forward only.
TORCH_STEPPED = [np.s_[::2], np.s_[1:7:3, ::2], np.s_[1::3, 1], np.s_[None, 2::2, ..., 1::3],
                 np.s_[3, ::4]]


@pytest.mark.parametrize("shape", [(7, 5), (8, 4)], ids=str)
@pytest.mark.parametrize("key", TORCH_STEPPED, ids=str)
def test_stepped_slices_equal_torch(tmesh, shape, key):
    mesh = mesh_of((W,))
    for j, pl in enumerate([(Shard(0),), (Shard(1),), (R,)]):
        (a,) = rng_arrays(80 + j, shape)
        (got,), c = run(lambda x: x[key] * 2.0, [a], mesh, [pl])
        (theirs,) = torch_grads(lambda x: x[key] * 2.0, [a], tmesh, [pl], c)
        np.testing.assert_allclose(got, theirs, rtol=1e-12, atol=1e-12, err_msg=str(pl))


@pytest.mark.parametrize("case", ["tensordot1", "tensordot2", "tensordot0", "inner",
                                  "inner_nd", "outer"])
def test_tensordot_inner_outer_equal_torch(tmesh, case):
    import torch

    shapes, ours, theirs = {
        "tensordot1": (((3, 5), (5, 4)), lambda x, y: np.tensordot(x, y, 1),
                       lambda x, y: torch.tensordot(x, y, dims=1)),
        "tensordot2": (((3, 4, 5), (4, 5, 2)), lambda x, y: np.tensordot(x, y, axes=2),
                       lambda x, y: torch.tensordot(x, y, dims=2)),
        "tensordot0": (((4, 3), (5,)), lambda x, y: np.tensordot(x, y, 0),
                       lambda x, y: torch.tensordot(x, y, dims=0)),
        "inner": (((7,), (7,)), np.inner, torch.inner),
        "inner_nd": (((3, 5), (2, 4, 5)), np.inner, torch.inner),
        "outer": (((5,), (7,)), np.outer, torch.outer),
    }[case]
    mesh = mesh_of((W,))
    compared = 0
    for j, pls in enumerate(layouts((W,), [len(s) for s in shapes])):
        pls = [plain(p) for p in pls]  # torch's leaves are not Partial
        arrays = rng_arrays(90 + j, *shapes)
        got, c = run(ours, arrays, mesh, pls)
        expect = torch_grads(theirs, arrays, tmesh, pls, c)
        compared += expect is not None
        for i, (g, t) in enumerate(zip(got, expect or ())):
            np.testing.assert_allclose(g, t, rtol=1e-12, atol=1e-12, err_msg=f"{pls} {i}")
    assert compared


@pytest.mark.parametrize("zeros", range(len(ZEROS)))
def test_prod_of_everything_equals_torch(tmesh, zeros):
    mesh = mesh_of((W,))
    a = with_zeros((4, 5), zeros, [z for z in ZEROS[zeros] if z[0] < 4])
    compared = 0
    for pl in [(Shard(0),), (Shard(1),), (R,)]:
        (got,), c = run(lambda x: x.prod(), [a], mesh, [pl])
        expect = torch_grads(lambda x: x.prod(), [a], tmesh, [pl], c)
        compared += expect is not None
        for theirs in expect or ():
            np.testing.assert_allclose(got, theirs, rtol=1e-12, atol=1e-12, err_msg=str(pl))
    assert compared


@pytest.mark.parametrize("axis", [0, 1, -1], ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("zeros", range(len(ZEROS)))
def test_prod_over_an_axis_equals_torch_on_the_full_tensor(tmesh, axis, keepdims, zeros):
    # torch DTensor's prod(dim) backward fails (its safe-zeros path concatenates a
    # plain tensor with a DTensor): the reference is torch's backward on the full
    # tensor.
    import torch

    mesh = mesh_of((W,))
    a = with_zeros((5, 5), zeros, ZEROS[zeros])
    for j, (pl,) in enumerate(layouts((W,), [2])):
        (got,), c = run(lambda x: np.prod(x, axis=axis, keepdims=keepdims), [a], mesh, [pl])
        t = torch.tensor(a, requires_grad=True)
        (t.prod(dim=axis, keepdim=keepdims) * torch.tensor(c)).sum().backward()
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, atol=1e-12,
                                   err_msg=str(pl))


# torch 2.13 refuses a boolean mask on a DTensor (its output shape is data-dependent).
@pytest.mark.parametrize("shape", [(7, 3), (8, 2)], ids=str)
def test_an_integer_array_equals_torch(tmesh, shape):
    import torch
    from torch.distributed import tensor as td

    mesh = mesh_of((W,))
    key = [3, 0, 3, 6]
    tkey = td.distribute_tensor(torch.tensor(key), tmesh, [td.Replicate()])
    for j, pl in enumerate([(Shard(0),), (Shard(1),), (R,)]):
        (a,) = rng_arrays(90 + j, shape)
        (got,), c = run(lambda x: x[key], [a], mesh, [pl])
        (theirs,) = torch_grads(lambda x: x[tkey], [a], tmesh, [pl], c)
        np.testing.assert_allclose(got, theirs, rtol=1e-12, atol=1e-12, err_msg=str(pl))


@pytest.mark.skipif(W == 1, reason="needs a sharded array")
def test_the_backward_of_a_mask_does_not_gather_the_input_again():
    """A mask over a sharded dim 1 gathers the input in the forward; the backward
    needs only where it was gathered to: the gradient is written there and cut back
    to Shard(1) locally, so nothing moves."""
    mesh = mesh_of((W,))
    full = np.arange(8.0 * W).reshape(4, 2 * W)
    w = distribute_tensor(full, mesh, [Shard(1)], requires_grad=True)
    mask = full % 3 == 0
    y = w[mask]
    with CommDebugMode() as comm:
        y.sum().backward()
    assert comm.get_total_counts() == 0
    assert w.grad.placements == (Shard(1),)
    np.testing.assert_array_equal(w.grad.full_tensor(), mask.astype(float))


# Ints beside one integer array are advanced indices too: adjacent to it (the dim
# stays in place) or apart from it (NumPy puts the dim first).
INTS_WITH_ARRAY = {
    2: [np.s_[0, [1, 0, 1]], np.s_[[2, 0, 2], 1], np.s_[-1, np.array([3, -1])],
        np.s_[[0], -2], np.s_[None, 1, [4, 4]]],
    3: [np.s_[1, [0, 2], 1:3], np.s_[0, :, [1, 1]], np.s_[:, [1, 0], -1],
        np.s_[-1, ..., [0, 2]], np.s_[[3, 0], None, 0], np.s_[2, None, [1], ::2],
        np.s_[0, 1, [2, 0]]],
}


@pytest.mark.parametrize("mesh_shape", mesh_shapes_1d_2d(), ids=str)
@pytest.mark.parametrize("shape, key", [(sh, k) for sh in [(6, 5), (4, 5, 3)]
                                        for k in range(len(INTS_WITH_ARRAY[len(sh)]))], ids=str)
@pytest.mark.usefixtures("strict_numpy")
def test_ints_beside_an_integer_array_run_distributed_with_numpys_gradient(mesh_shape, shape,
                                                                          key):
    """``x[key]`` with ints and one integer array runs distributed (strict: no
    gather) with NumPy's value and shape, and its gradient adds the output's
    gradient into the picked positions (np.add.at), in every layout."""
    key = INTS_WITH_ARRAY[len(shape)][key]
    mesh = mesh_of(mesh_shape)
    for j, pls in enumerate(layouts(mesh_shape, [len(shape)])):
        (a,) = rng_arrays(130 + j, shape)
        np.testing.assert_array_equal(make(a, mesh, plain(pls[0]))[key].full_tensor(),
                                      a[key])
        (got,), c = run(lambda x: x[key] * 2.0, [a], mesh, pls)
        want = np.zeros_like(a)
        np.add.at(want, key, 2.0 * c)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{pls}")


# -- np.clip with DTensor bounds, against torch.clamp ------------------------------------

def clamp_cases():
    """name -> (shapes of the leaves, np.clip on DTensors, torch.clamp on tensors): a
    scalar bound is a tensor without grad to torch, whose clamp takes no mix."""
    import torch

    half = torch.tensor(0.5, dtype=torch.float64)
    return {
        "both": (((5, 4), (4,), (5, 1)), np.clip, torch.clamp),
        "lower": (((5, 4), (5, 4)), lambda x, lo: np.clip(x, lo, None),
                  lambda x, lo: torch.clamp(x, min=lo)),
        "upper": (((5, 4), (1, 4)), lambda x, hi: np.clip(x, None, hi),
                  lambda x, hi: torch.clamp(x, max=hi)),
        "a_broadcast": (((4,), (5, 4), (5, 1)), np.clip, torch.clamp),
        "scalar_upper": (((5, 4), (4,)), lambda x, lo: np.clip(x, lo, 0.5),
                         lambda x, lo: torch.clamp(x, lo, half)),
        "scalar_lower": (((5, 4), (5, 1)), lambda x, hi: np.clip(x, -0.5, hi),
                         lambda x, hi: torch.clamp(x, -half, hi)),
        # torch's backward fails on a 0-d input there: it gets the broadcast zeros
        "bounds_only": (((4,), (5, 1)), lambda lo, hi: np.clip(0.0, lo, hi),
                        lambda lo, hi: torch.clamp(torch.zeros((5, 4), dtype=torch.float64),
                                                   lo, hi)),
    }


@pytest.mark.parametrize("mesh_shape", mesh_shapes_1d_2d(), ids=str)
@pytest.mark.parametrize("case", ["both", "lower", "upper", "a_broadcast", "scalar_upper",
                                  "scalar_lower", "bounds_only"])
def test_clip_with_dtensor_bounds_has_torch_clamps_gradients(mesh_shape, case):
    """Values on a grid of halves, so that ``a`` ties its bounds, the bounds tie each
    other and the lower bound lies above the upper in places: each leaf's gradient
    is torch.clamp's (ties go to ``a``, a crossed pair to the upper bound), up to
    the order of the sums over broadcast dims."""
    torch = pytest.importorskip("torch")
    shapes, ours, theirs = clamp_cases()[case]
    mesh = mesh_of(mesh_shape)
    for j, pls in enumerate(layouts(mesh_shape, [len(s) for s in shapes])):
        rng = np.random.default_rng(60 + j)
        arrays = [rng.integers(-3, 4, size=s) / 2 for s in shapes]
        got, c = run(ours, arrays, mesh, pls)
        leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
        (theirs(*leaves) * torch.tensor(c)).sum().backward()
        for i, (g, t) in enumerate(zip(got, leaves)):
            np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12, atol=1e-12,
                                       err_msg=f"{pls} {i}")


def test_a_bound_by_keyword_that_requires_grad_is_refused_everywhere():
    """Only np.clip's positional arguments are inputs of its node: a DTensor that
    requires grad given by keyword would lose its gradient, so the call raises."""
    mesh = mesh_of((W,))
    x = distribute_tensor(np.arange(6.0), mesh, [Shard(0)], requires_grad=True)
    lo = distribute_tensor(np.full(6, 2.0), mesh, [Shard(0)], requires_grad=True)
    for call in (lambda: np.clip(x, min=lo), lambda: np.clip(x, max=lo),
                 lambda: np.clip(a=x, a_min=0.0, a_max=1.0)):
        with pytest.raises(NotImplementedError, match="positionally"):
            call()
    np.clip(x, min=lo.detach(), max=4.0).sum().backward()  # a plain bound by keyword
    np.testing.assert_array_equal(x.grad.full_tensor(), [0, 0, 1, 1, 1, 0])


# -- an integer array among slices, against torch's index backward ------------------------

# Repeated and negative indices, an empty array, slices before and after, None and ...
ARRAY_AMONG_SLICES = [
    np.s_[:, [1, 0, 1]], np.s_[..., [2, 0, 2, 2]], np.s_[1:, [2, 0, 2], None],
    np.s_[None, ::2, np.array([-1, 3, -1])], np.s_[[3, 3, 0], 1:4], np.s_[-3:, [0]],
    np.s_[:, np.array([], np.int64)], np.s_[..., [2, 0, 2], ::2],
]


@pytest.mark.parametrize("mesh_shape", mesh_shapes_1d_2d(), ids=str)
@pytest.mark.parametrize("shape", [(7, 5), (6, 6), (4, 5, 3)], ids=str)
@pytest.mark.parametrize("key", range(len(ARRAY_AMONG_SLICES)))
@pytest.mark.usefixtures("strict_numpy")
def test_an_integer_array_among_slices_has_torchs_gradient(mesh_shape, shape, key):
    """``x[key]`` runs distributed (strict: no gather) with NumPy's value, and its
    gradient adds the output's gradient into the picked positions, a repeated
    index adding up, as torch's index backward, in every layout (Partial too)."""
    torch = pytest.importorskip("torch")
    key = ARRAY_AMONG_SLICES[key]
    mesh = mesh_of(mesh_shape)
    tkey = tuple(torch.tensor(k) if isinstance(k, (list, np.ndarray)) else k for k in key)
    for j, pls in enumerate(layouts(mesh_shape, [len(shape)])):
        (a,) = rng_arrays(110 + j, shape)
        # (a Partial's parts do not sum to ``a`` exactly: its value is checked below)
        np.testing.assert_array_equal(make(a, mesh, plain(pls[0]))[key].full_tensor(),
                                      a[key])
        (got,), c = run(lambda x: x[key] * 2.0, [a], mesh, pls)
        t = torch.tensor(a, requires_grad=True)
        (t[tkey] * 2.0 * torch.tensor(c)).sum().backward()
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, atol=1e-12,
                                   err_msg=f"{pls}")
