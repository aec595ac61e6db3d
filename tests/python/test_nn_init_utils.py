"""mpitensor.nn.init and mpitensor.nn.utils: an in-place init of a sharded DTensor
equals the same call on the whole array (the mesh-invariant stream) at every world
size, on even and uneven shapes, in float64 and float32, keeping placements and
requires_grad; torch's fan and gain rules; clip_grad_norm_ and clip_grad_value_
against torch on the full gradients with one all-reduce per mesh dim.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard, distribute_tensor
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import local_mesh
from mpitensor.nn import init
from mpitensor.nn.utils import clip_grad_norm_, clip_grad_value_
from ops_helpers import W, mesh_of, mesh_shapes

R, S0, S1 = Replicate(), Shard(0), Shard(1)

INITS = [
    ("uniform_", dict(a=-0.3, b=0.7)),
    ("normal_", dict(mean=0.5, std=0.2)),
    ("trunc_normal_", dict(mean=0.1, std=0.5, a=-0.4, b=0.9)),
    ("xavier_uniform_", dict(gain=2.0)),
    ("xavier_normal_", dict()),
    ("kaiming_uniform_", dict(a=math.sqrt(5))),
    ("kaiming_normal_", dict(mode="fan_out", nonlinearity="relu")),
    ("constant_", dict(val=0.25)),
    ("zeros_", dict()),
    ("ones_", dict()),
]


def layouts(mesh_shape):
    if len(mesh_shape) == 1:
        return [[S0], [S1], [R]]
    return [[S0, S1], [R, S0], [S1, S1]]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,kwargs", INITS, ids=[n for n, _ in INITS])
def test_sharded_init_equals_the_whole_draw(name, kwargs, dtype):
    fn = getattr(init, name)
    for shape in [(7, 5), (8, 6), (3, 5, 2)]:
        mt.manual_seed(11)
        whole = np.full(shape, np.nan, dtype)
        assert fn(whole, **kwargs) is whole
        assert np.all(np.isfinite(whole))
        for mesh_shape in mesh_shapes():
            mesh = mesh_of(mesh_shape)
            for pls in layouts(mesh_shape):
                mt.manual_seed(11)
                dt = mt.full(shape, np.nan, dtype=dtype, device_mesh=mesh, placements=pls,
                             requires_grad=True)
                local = dt.detach().to_local()
                out = fn(dt, **kwargs)
                assert out is dt and dt.placements == tuple(pls) and dt.requires_grad
                assert dt.is_leaf and dt.dtype == dtype
                assert dt.detach().to_local() is local  # in place
                np.testing.assert_array_equal(dt.detach().full_tensor(), whole,
                                              err_msg=f"{shape} {mesh_shape} {pls}")


def test_a_parameter_object_and_the_local_mesh():
    mt.manual_seed(5)
    p = mt.nn.Parameter(mt.zeros(6, 4, device_mesh=local_mesh()))
    assert init.normal_(p) is p.data
    mt.manual_seed(5)
    np.testing.assert_array_equal(init.normal_(np.zeros((6, 4))), p.data.to_local())


def test_draws_take_fresh_streams_and_follow_the_seed():
    mt.manual_seed(3)
    a, b = init.normal_(np.empty(100)), init.normal_(np.empty(100))
    assert not np.array_equal(a, b)
    mt.manual_seed(3)
    np.testing.assert_array_equal(init.normal_(np.empty(100)), a)


def test_distributions():
    mt.manual_seed(0)
    n = 200_000
    t = init.trunc_normal_(np.empty(n), mean=0.1, std=0.5, a=-0.4, b=0.9)
    assert t.min() >= -0.4 and t.max() <= 0.9
    # Mean of N(0.1, 0.5^2) truncated to [-0.4, 0.9]: mu + sigma (phi(al) - phi(be)) / Z.
    pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda x: (1 + math.erf(x / math.sqrt(2))) / 2  # noqa: E731
    al, be = (-0.4 - 0.1) / 0.5, (0.9 - 0.1) / 0.5
    mean = 0.1 + 0.5 * (pdf(al) - pdf(be)) / (cdf(be) - cdf(al))
    assert abs(t.mean() - mean) < 0.005
    z = init.trunc_normal_(np.empty(n), std=1.0, a=-50.0, b=50.0)  # untruncated
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs(np.mean(np.abs(z) > 3) - 2 * (1 - cdf(3))) < 0.001  # the tails too
    w = init.kaiming_uniform_(np.empty((64, 32, 3)), a=0, nonlinearity="relu")
    bound = math.sqrt(2.0) * math.sqrt(3.0 / (32 * 3))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    x = init.xavier_normal_(np.empty((300, 500)))
    assert abs(x.std() - math.sqrt(2.0 / 800)) < 0.001


def test_fans_and_gains_match_torch():
    torch = pytest.importorskip("torch")
    for shape in [(4, 3), (8, 2, 3, 3), (5, 7, 2)]:
        assert init._fans(np.empty(shape)) == \
            torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    for nl, p in [("relu", None), ("tanh", None), ("leaky_relu", 0.2), ("selu", None),
                  ("linear", None), ("leaky_relu", None)]:
        assert init.calculate_gain(nl, p) == torch.nn.init.calculate_gain(nl, p)
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(np.empty(4))


def test_init_refuses_what_it_cannot_fill():
    mesh = mesh_of((W,))
    partial = mt.DTensor.from_local(np.ones(3), mesh, [Partial()])
    with pytest.raises(ValueError, match="Partial"):
        init.normal_(partial)
    with pytest.raises(TypeError, match="floating point"):
        init.uniform_(np.zeros(3, np.int64))
    with pytest.raises(TypeError, match="DTensor or an ndarray"):
        init.zeros_([0.0, 1.0])


# -- clipping ---------------------------------------------------------------------

SHAPES = [(5, 3), (7,), (4, 6)]


def grads_on(mesh, pls, dtype, scale=1.0):
    rng = np.random.default_rng(1)
    arrays = [(scale * rng.standard_normal(s)).astype(dtype) for s in SHAPES]
    ps = []
    for a, p in zip(arrays, pls):
        param = distribute_tensor(np.zeros(a.shape, dtype), mesh, p, requires_grad=True)
        param.grad = distribute_tensor(a, mesh, p)
        ps.append(param)
    return ps, arrays


def clip_layouts(mesh_shape):
    if len(mesh_shape) == 1:
        return [[[S0], [R], [S1]], [[R], [R], [R]], [[S1], [S0], [S0]]]
    return [[[S0, S1], [R, S0], [R, R]], [[S0, S0], [S0, R], [S1, S0]],
            [[R, S0], [R, R], [R, S1]]]


def reductions(mesh_shape, norm_type) -> dict:
    """The all-reduces clip_grad_norm_ makes: one per mesh dim of more than one
    rank, of the partial norm and the agreement on the call (torch reduces over
    the dims that shard some gradient only, and checks nothing), and for the
    inf-norm a second one, of the maximum."""
    n = sum(1 for size in mesh_shape if size > 1) * (2 if math.isinf(norm_type) else 1)
    return {"all_reduce": n} if n else {}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
def test_clip_grad_norm_matches_torch(norm_type, dtype):
    torch = pytest.importorskip("torch")
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        for pls in clip_layouts(mesh_shape):
            for max_norm in (0.5, 1e6):  # clipping, and not
                ps, arrays = grads_on(mesh, pls, dtype)
                tps = [torch.zeros(a.shape, dtype=getattr(torch, np.dtype(dtype).name))
                       for a in arrays]
                for tp, a in zip(tps, arrays):
                    tp.grad = torch.tensor(a)
                with CommDebugMode() as comm:
                    norm = clip_grad_norm_(ps, max_norm, norm_type=norm_type)
                tnorm = torch.nn.utils.clip_grad_norm_(tps, max_norm, norm_type=norm_type)
                expect = reductions(mesh_shape, norm_type)
                assert comm.get_comm_counts() == expect
                # ten float64 at most (the norm and the agreement), each counted
                # twice at most (a ring all-reduce's bytes)
                assert comm.get_comm_bytes().get("all_reduce", 0) <= 160 * expect.get(
                    "all_reduce", 0)
                assert isinstance(norm, mt.DTensor) and norm.shape == ()
                assert norm.placements == (R,) * len(mesh_shape) and norm.dtype == dtype
                np.testing.assert_allclose(float(norm), float(tnorm), rtol=rtol)
                for p, tp in zip(ps, tps):
                    assert p.grad.placements == p.placements
                    np.testing.assert_allclose(p.grad.full_tensor(), tp.grad.numpy(),
                                               rtol=rtol, atol=1e-7 * rtol)


@pytest.mark.parametrize("norm_type", [2.0, math.inf])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_clip_grad_norm_of_partial_gradients_matches_torch(norm_type, op):
    """A Partial gradient (fully_shard's ignored parameters keep one) counts with
    its reduction, as torch's norm reduces it, and stays Partial once scaled."""
    torch = pytest.importorskip("torch")
    mesh = mesh_of((W,))
    ps, arrays = grads_on(mesh, [[S0], [R], [R]], np.float64)
    rank = mesh.get_coordinate()[0]
    share = (rank + 1) * 2 / (W * (W + 1)) * (W if op == "avg" else 1)
    for p in ps[1:]:  # this rank's addend of the whole gradient
        p.grad = mt.DTensor.from_local(p.grad.to_local() * share, mesh, [Partial(op)],
                                       run_check=False)
    tps = [torch.zeros(a.shape, dtype=torch.float64) for a in arrays]
    for tp, a in zip(tps, arrays):
        tp.grad = torch.tensor(a)
    with CommDebugMode() as comm:
        norm = clip_grad_norm_(ps, 0.5, norm_type=norm_type)
    tnorm = torch.nn.utils.clip_grad_norm_(tps, 0.5, norm_type=norm_type)
    np.testing.assert_allclose(float(norm), float(tnorm), rtol=1e-12)
    if W > 1:  # the agreement, the two sums, the norm (and the inf-norm's maximum)
        want = 4 + (1 if math.isinf(norm_type) else 0)
        assert comm.get_comm_counts() == {"all_reduce": want}
    for p, tp in zip(ps, tps):
        assert p.grad.placements == ((S0,) if p is ps[0] else (Partial(op),))
        np.testing.assert_allclose(p.grad.full_tensor(), tp.grad.numpy(), rtol=1e-12)


def test_clip_grad_norm_without_torch():
    mesh = mesh_of((W,))
    ps, arrays = grads_on(mesh, [[S0], [R], [S1]], np.float64)
    total = math.sqrt(sum(float(np.sum(a * a)) for a in arrays))
    norm = clip_grad_norm_(ps + [distribute_tensor(np.ones(2), mesh, [R])], 1.0)
    assert float(norm) == pytest.approx(total, rel=1e-13)
    clipped = math.sqrt(sum(float(np.sum(p.grad.full_tensor() ** 2)) for p in ps))
    assert clipped == pytest.approx(1.0, rel=1e-5)


def test_clip_grad_norm_nonfinite_and_several_meshes():
    mesh = mesh_of((W,))
    ps, _ = grads_on(mesh, [[S0], [R], [S1]], np.float64)
    with mt.no_grad():
        if mesh.get_coordinate() == [W - 1]:  # one rank's shard only
            ps[0].grad.to_local()[...] = np.inf if ps[0].grad.to_local().size else 0
        ps[2].grad.to_local()[...] = np.nan
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(ps, 1.0, error_if_nonfinite=True)
    assert math.isnan(float(clip_grad_norm_(ps, 1.0)))
    # The same ranks in another mesh shape: one reduction on each mesh.
    if W == 4:
        qs, arrays = grads_on(mesh, [[S0], [R], [S1]], np.float64)
        rs, _ = grads_on(mesh_of((2, 2)), [[S0, S1], [R, R], [S1, R]], np.float64)
        with CommDebugMode() as comm:
            norm = clip_grad_norm_(qs + rs, 1e9)
        assert comm.get_comm_counts() == {"all_reduce": 3}  # (4,), then (2, 2)
        total = math.sqrt(2 * sum(float(np.sum(a * a)) for a in arrays))
        assert float(norm) == pytest.approx(total, rel=1e-13)
        tp = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"]
        ts, _ = grads_on(tp, [[S0], [R], [S1]], np.float64)
        with pytest.raises(ValueError, match="meshes of different ranks"):
            clip_grad_norm_(qs + ts, 1.0)


def test_clip_grad_value():
    torch = pytest.importorskip("torch")
    for mesh_shape in mesh_shapes():
        for pls in clip_layouts(mesh_shape):
            ps, arrays = grads_on(mesh_of(mesh_shape), pls, np.float64)
            tps = [torch.zeros(a.shape, dtype=torch.float64) for a in arrays]
            for tp, a in zip(tps, arrays):
                tp.grad = torch.tensor(a)
            with CommDebugMode() as comm:
                clip_grad_value_(ps, 0.3)
            torch.nn.utils.clip_grad_value_(tps, 0.3)
            assert comm.get_total_counts() == 0
            for p, tp in zip(ps, tps):
                np.testing.assert_array_equal(p.grad.full_tensor(), tp.grad.numpy())
