"""Backward rules of ``np.flip``, ``np.roll``, ``np.cumsum``, ``np.diff``,
``np.atleast_1d/2d/3d`` and ``np.linalg.norm`` (composed of operations that record
themselves): each gradient against central differences on the full NumPy arrays,
in float64, on sharded, replicated and Partial inputs, even and uneven, at every
world size; and against torch DTensor on gloo when torch is installed (skipped
otherwise) for the operations torch has."""

from __future__ import annotations

import numpy as np
import pytest

from grad_helpers import R, layouts, numeric, rng_arrays, run, torch_grads
from mpitensor import Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, make, mesh_of, mesh_shapes

MESHES = mesh_shapes()
SHAPES = [(7, 5), (8, 4)]

CASES = {
    "flip0": lambda x: np.flip(x, 0),
    "flip": lambda x: np.flip(x),
    "flip_axes": lambda x: np.flip(x, axis=(0, 1)),
    "roll0": lambda x: np.roll(x, 2, axis=0),
    "roll_flat": lambda x: np.roll(x, -3),
    "roll_pair": lambda x: np.roll(x, (1, -2), axis=(0, 1)),
    "cumsum0": lambda x: np.cumsum(x, axis=0),
    "cumsum1": lambda x: np.cumsum(x, 1),
    "cumsum_flat": lambda x: np.cumsum(x),
    "diff1": lambda x: np.diff(x, axis=1),
    "diff0_n2": lambda x: np.diff(x, 2, 0),
    "diff_pre_app": lambda x: np.diff(x, axis=0, prepend=1.5, append=-2.0),
    "norm": lambda x: np.linalg.norm(x),
    "norm_axis": lambda x: np.linalg.norm(x, axis=1),
    "norm_l1": lambda x: np.linalg.norm(x, 1, axis=0),
    "norm_fro_keep": lambda x: np.linalg.norm(x, "fro", keepdims=True),
    "atleast_3d": lambda x: np.atleast_3d(x),
}


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_matches_finite_differences(mesh_shape, shape, case):
    mesh = mesh_of(mesh_shape)
    f = CASES[case]
    for j, pls in enumerate(layouts(mesh_shape, [len(shape)])):
        arrays = rng_arrays(30 + j, shape)
        (got,), c = run(f, arrays, mesh, pls)
        (expect,) = numeric(f, arrays, c)
        np.testing.assert_allclose(got, expect, rtol=1e-7, atol=1e-8, err_msg=str(pls))


def test_atleast_of_several_arrays_gives_each_its_gradient():
    mesh = mesh_of((W,))
    a, b = rng_arrays(5, (6,), ())
    x = make(a, mesh, [Shard(0)]).requires_grad_()
    s = make(b, mesh, [R]).requires_grad_()
    y, z = np.atleast_2d(x, s)
    (2.0 * y.sum() + 3.0 * z.sum()).backward()
    np.testing.assert_array_equal(x.grad.full_tensor(), np.full((6,), 2.0))
    np.testing.assert_array_equal(s.grad.full_tensor(), np.array(3.0))


def test_flip_and_roll_of_a_shard_along_another_dim_communicate_nothing():
    mesh = mesh_of((W,))
    (a,) = rng_arrays(3, (8, 6))
    x = make(a, mesh, [Shard(0)]).requires_grad_()
    with CommDebugMode() as comm:
        y = np.roll(np.flip(x, 1), 2, axis=1)
        y.sum().backward()
    assert comm.get_total_counts() == 0


def test_norm_is_differentiable_where_the_function_without_a_rule_is_refused():
    mesh = mesh_of((W,))
    (a,) = rng_arrays(4, (5,))
    x = make(a, mesh, [R]).requires_grad_()
    np.linalg.norm(x).backward()
    np.testing.assert_allclose(x.grad.full_tensor(), a / np.linalg.norm(a), rtol=1e-12)
    with pytest.raises(NotImplementedError, match="no backward rule"):
        np.unique(x)


# -- against torch (skipped without it) --------------------------------------------------

TORCH = {
    "flip0": (lambda x: np.flip(x, 0), lambda x: x.flip(0)),
    "roll0": (lambda x: np.roll(x, 2, axis=0), lambda x: x.roll(2, 0)),
    "cumsum0": (lambda x: np.cumsum(x, axis=0), lambda x: x.cumsum(0)),
    "cumsum1": (lambda x: np.cumsum(x, axis=1), lambda x: x.cumsum(1)),
    "norm": (lambda x: np.linalg.norm(x), lambda x: x.norm()),
}


@pytest.fixture(scope="module")
def tmesh():
    pytest.importorskip("torch")
    from torch.distributed.device_mesh import init_device_mesh
    from torch_helpers import init_gloo

    init_gloo()
    return init_device_mesh("cpu", (W,))


@pytest.mark.parametrize("case", sorted(TORCH))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradient_equals_torch(tmesh, case, shape):
    mesh = mesh_of((W,))
    ours, theirs = TORCH[case]
    for j, pl in enumerate([(Shard(0),), (Shard(1),), (R,)]):
        (a,) = rng_arrays(60 + j, shape)
        (got,), c = run(ours, [a], mesh, [pl])
        (expect,) = torch_grads(theirs, [a], tmesh, [pl], c)
        np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12, err_msg=str(pl))

