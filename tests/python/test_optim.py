"""mpitensor.optim: SGD, Adam, AdamW, RMSprop and Adagrad on DTensor parameters
against torch's update rules written in NumPy here, and against torch.optim when it
is installed, on the full tensors (float64 to rtol 1e-12, float32 to 1e-5) on even
and uneven shards at every world size; state DTensors in their parameter's
placements; steps that never communicate; param groups; state_dict in torch's
format, saved with mt.save and loaded onto another layout to continue the same
trajectory.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard, distribute_tensor
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import local_mesh
from mpitensor.nn import Parameter
from ops_helpers import W, mesh_of, mesh_shapes

COMM = MPI.COMM_WORLD
R, S0, S1 = Replicate(), Shard(0), Shard(1)

CONFIGS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.05)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.05, momentum=0.8, dampening=0.3, maximize=True)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, amsgrad=True)),
    ("Adam", dict(lr=0.02, maximize=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.2, amsgrad=True)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.1, momentum=0.8)),
    ("RMSprop", dict(lr=0.005, alpha=0.3, centered=True, momentum=0.5, maximize=True)),
    ("RMSprop", dict(lr=0.02, centered=True)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.1,
                     initial_accumulator_value=0.3, eps=1e-6)),
    ("Adagrad", dict(lr=0.05, maximize=True, foreach=True)),
]
# (5, 3) and (7,) shard unevenly over 2, 3 and 4 ranks; (4, 6) evenly over 2 and 4.
SHAPES = [(5, 3), (7,), (4, 6)]


def layouts(mesh_shape):
    """Placements for SHAPES on a mesh: Shard and Replicate mixed."""
    if len(mesh_shape) == 1:
        return [[S0], [S0], [S1]], [[R], [S0], [R]]
    return [[S0, S1], [R, S0], [S1, S0]], [[R, R], [S0, R], [R, S1]]


def arrays(seed, dtype):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES]


def tol(dtype):
    return dict(rtol=1e-12, atol=1e-14) if dtype == np.float64 else dict(rtol=1e-5,
                                                                         atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in
                                                      enumerate(CONFIGS)])
def test_matches_torch_for_several_steps(name, kwargs, dtype):
    torch = pytest.importorskip("torch")
    init, grads = arrays(0, dtype), [arrays(s + 1, dtype) for s in range(4)]
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        for pls in layouts(mesh_shape):
            ps = [distribute_tensor(a.copy(), mesh, p, requires_grad=True)
                  for a, p in zip(init, pls)]
            tps = [torch.tensor(a.copy(), requires_grad=True) for a in init]
            opt = getattr(mt.optim, name)(ps, **kwargs)
            topt = getattr(torch.optim, name)(tps, **kwargs)
            for step, gs in enumerate(grads):
                for i, (p, tp, g) in enumerate(zip(ps, tps, gs)):
                    # The second parameter has no gradient at step 1: skipped by both.
                    skip = step == 1 and i == 1
                    p.grad = None if skip else distribute_tensor(g, mesh, p.placements)
                    tp.grad = None if skip else torch.tensor(g)
                opt.step()
                topt.step()
                for i, (p, tp) in enumerate(zip(ps, tps)):
                    np.testing.assert_allclose(p.detach().full_tensor(),
                                               tp.detach().numpy(), **tol(dtype),
                                               err_msg=f"{mesh_shape} {pls} step {step} "
                                                       f"param {i}")
                    assert p.dtype == dtype and p.placements == tuple(pls[i])


# torch's documented defaults and update rules, on the full arrays.
DEFAULTS = {
    "SGD": dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    "Adam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False),
    "AdamW": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                  amsgrad=False),
    "RMSprop": dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                    centered=False),
    "Adagrad": dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0,
                    eps=1e-10),
}


def reference_step(name, h, p, g, s):
    """One step of torch's rule for ``name`` (hyperparameters ``h``, state ``s``
    a dict made empty); returns the new parameter."""
    g = -g if h.get("maximize") else g
    s["t"] = t = s.get("t", 0) + 1
    if name == "SGD":
        d = g + h["weight_decay"] * p
        if h["momentum"]:
            s["b"] = d if t == 1 else h["momentum"] * s["b"] + (1 - h["dampening"]) * d
            d = d + h["momentum"] * s["b"] if h["nesterov"] else s["b"]
        return p - h["lr"] * d
    if name in ("Adam", "AdamW"):
        b1, b2 = h["betas"]
        if name == "AdamW":
            p = p * (1 - h["lr"] * h["weight_decay"])
        else:
            g = g + h["weight_decay"] * p
        s["m"] = b1 * s.get("m", 0) + (1 - b1) * g
        s["v"] = b2 * s.get("v", 0) + (1 - b2) * g * g
        v = s["v"]
        if h["amsgrad"]:
            s["vmax"] = v = np.maximum(s.get("vmax", 0), s["v"])
        m_hat, v_hat = s["m"] / (1 - b1 ** t), v / (1 - b2 ** t)
        return p - h["lr"] * m_hat / (np.sqrt(v_hat) + h["eps"])
    if name == "RMSprop":
        a = h["alpha"]
        g = g + h["weight_decay"] * p
        s["v"] = a * s.get("v", 0) + (1 - a) * g * g
        v = s["v"]
        if h["centered"]:
            s["ga"] = a * s.get("ga", 0) + (1 - a) * g
            v = v - s["ga"] ** 2
        step = g / (np.sqrt(v) + h["eps"])
        if h["momentum"] > 0:
            s["b"] = h["momentum"] * s.get("b", 0) + step
            step = s["b"]
        return p - h["lr"] * step
    g = g + h["weight_decay"] * p  # Adagrad
    s["sum"] = s.get("sum", h["initial_accumulator_value"]) + g * g
    clr = h["lr"] / (1 + (t - 1) * h["lr_decay"])
    return p - clr * g / (np.sqrt(s["sum"]) + h["eps"])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in
                                                      enumerate(CONFIGS)])
def test_matches_torchs_rules_in_numpy(name, kwargs, dtype):
    # A few steps on sharded and replicated parameters at every world size; the
    # second parameter has no gradient at step 1 and is skipped, as torch skips it.
    h = {**DEFAULTS[name], **kwargs}
    init, grads = arrays(0, dtype), [arrays(s + 1, dtype) for s in range(4)]
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        for pls in layouts(mesh_shape):
            ps = [distribute_tensor(a.copy(), mesh, p, requires_grad=True)
                  for a, p in zip(init, pls)]
            expect = [a.astype(np.float64) for a in init]
            states = [{} for _ in init]
            opt = getattr(mt.optim, name)(ps, **kwargs)
            for step, gs in enumerate(grads):
                for i, (p, g) in enumerate(zip(ps, gs)):
                    if step == 1 and i == 1:
                        p.grad = None
                        continue
                    p.grad = distribute_tensor(g, mesh, p.placements)
                    expect[i] = reference_step(name, h, expect[i], g.astype(np.float64),
                                               states[i])
                opt.step()
                for i, p in enumerate(ps):
                    np.testing.assert_allclose(p.detach().full_tensor(), expect[i],
                                               **tol(dtype),
                                               err_msg=f"{mesh_shape} {pls} step {step} "
                                                       f"param {i}")
                    assert p.dtype == dtype and p.placements == tuple(pls[i])


@pytest.mark.parametrize("name,kwargs", [
    ("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01)), ("RMSprop", dict(lr=0.01, centered=True, momentum=0.5)),
    ("Adagrad", dict(lr=0.1, initial_accumulator_value=0.2))])
def test_complex_parameters_match_torch(name, kwargs):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    c = lambda *s: rng.standard_normal(s) + 1j * rng.standard_normal(s)  # noqa: E731
    init, grads = [c(5, 3), c()], [[c(5, 3), c()] for _ in range(3)]
    mesh = mesh_of((W,))
    ps = [distribute_tensor(init[0], mesh, [S0], requires_grad=True),
          distribute_tensor(init[1], mesh, [R], requires_grad=True)]
    tps = [torch.tensor(a, requires_grad=True) for a in init]
    opt = getattr(mt.optim, name)(ps, **kwargs)
    topt = getattr(torch.optim, name)(tps, **kwargs)
    for gs in grads:
        for p, tp, g in zip(ps, tps, gs):
            p.grad, tp.grad = distribute_tensor(g, mesh, p.placements), torch.tensor(g)
        opt.step()
        topt.step()
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.detach().full_tensor(), tp.detach().numpy(),
                                   rtol=1e-12)
    # A Fortran-order local array (from_local keeps it) is updated through a copy.
    a = init[0][:4].copy()
    p = mt.DTensor.from_local(np.asfortranarray(a), local_mesh(), [R]).requires_grad_()
    tp = torch.tensor(a, requires_grad=True)
    opt = getattr(mt.optim, name)([p], **kwargs)
    topt = getattr(torch.optim, name)([tp], **kwargs)
    for gs in grads:
        p.grad = mt.DTensor.from_local(gs[0][:4].copy(), local_mesh(), [R])
        tp.grad = torch.tensor(gs[0][:4])
        opt.step()
        topt.step()
    np.testing.assert_allclose(p.detach().to_local(), tp.detach().numpy(), rtol=1e-12)


def test_sgd_formula_without_torch():
    mesh = mesh_of((W,))
    w0, g = np.arange(5.0), np.linspace(-1, 1, 5)
    w = distribute_tensor(w0.copy(), mesh, [S0], requires_grad=True)
    opt = mt.optim.SGD([w], lr=0.5, momentum=0.9, weight_decay=0.1)
    buf = None
    expect = w0.copy()
    for _ in range(3):
        w.grad = distribute_tensor(g, mesh, [S0])
        opt.step()
        d = g + 0.1 * expect
        buf = d if buf is None else 0.9 * buf + d
        expect = expect - 0.5 * buf
        np.testing.assert_allclose(w.detach().full_tensor(), expect, rtol=1e-14)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name,kwargs", [c for c in CONFIGS if c[0].startswith("Adam")],
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(CONFIGS)
                              if n.startswith("Adam")])
def test_adam_in_c_is_the_numpy_update_bit_for_bit(name, kwargs, dtype, monkeypatch):
    # The one-pass C update against the NumPy statements it replaces (kernels off),
    # NaN and inf gradients included: the same bits after several steps.
    from mpitensor.nn import _ckernels, _kernels

    mesh = mesh_of((W,))
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal((9, 4)).astype(dtype)
    grads = [rng.standard_normal((9, 4)).astype(dtype) for _ in range(3)]
    grads[1][0, :3] = [np.nan, np.inf, -np.inf]
    calls = []
    real = _ckernels.adam_update
    monkeypatch.setattr(_ckernels, "adam_update", lambda *a: calls.append(1) or real(*a))
    result = {}
    for fused in (True, False):
        monkeypatch.setattr(_kernels, "enabled", fused)
        w = distribute_tensor(w0.copy(), mesh, [S0], requires_grad=True)
        opt = getattr(mt.optim, name)([w], **kwargs)
        for g in grads:
            w.grad = distribute_tensor(g, mesh, [S0])
            with np.errstate(invalid="ignore"):  # NumPy's warning for the NaN/inf
                opt.step()
        state = opt.state[w]
        result[fused] = [w.detach().to_local()] + [
            state[k].to_local() for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
            if k in state]
    assert calls, "the C update did not run"
    for a, b in zip(result[True], result[False]):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_step_never_communicates_and_state_keeps_placements(name):
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        for pls in layouts(mesh_shape):
            ps = [distribute_tensor(a, mesh, p, requires_grad=True)
                  for a, p in zip(arrays(0, np.float64), pls)]
            kwargs = {"SGD": dict(momentum=0.9), "Adagrad": {},
                      "RMSprop": dict(momentum=0.9, centered=True)}.get(
                          name, dict(amsgrad=True))
            opt = getattr(mt.optim, name)(ps, lr=0.1, **kwargs)
            for p, g in zip(ps, arrays(1, np.float64)):
                p.grad = distribute_tensor(g, mesh, p.placements)
            with CommDebugMode() as comm:
                opt.step()
                opt.step()
                opt.zero_grad()
            assert comm.get_total_counts() == 0, comm.get_comm_counts()
            for p in ps:
                assert p.grad is None
                state = opt.state[p]
                tensors = [v for v in state.values() if isinstance(v, mt.DTensor)]
                assert tensors, state
                for v in tensors:
                    assert v.device_mesh == mesh and v.placements == p.placements
                    assert v.shape == p.shape and v.dtype == p.dtype
                    assert not v.requires_grad


def test_parameters_of_a_module_and_parameter_objects():
    mesh = mesh_of((W,))

    class Two(mt.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Parameter(distribute_tensor(np.ones((5, 2)), mesh, [S0],
                                                 requires_grad=True))
            self.b = Parameter(distribute_tensor(np.ones(3), mesh, [R], requires_grad=True))

    model = Two()
    wrapped = Parameter(distribute_tensor(np.ones(4), mesh, [S0], requires_grad=True))
    opt = mt.optim.SGD([*model.parameters(), wrapped], lr=0.5)
    assert opt.param_groups[0]["params"][2] is wrapped.data
    for p in opt.param_groups[0]["params"]:
        p.grad = distribute_tensor(np.ones(p.shape), mesh, p.placements)
    opt.step()
    for p in [model.a, model.b, wrapped.data]:
        np.testing.assert_array_equal(p.detach().full_tensor(), np.full(p.shape, 0.5))


@pytest.mark.parametrize("name,kwargs", [
    ("RMSprop", dict(lr=0.01, centered=True, momentum=0.5, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1, initial_accumulator_value=0.2, lr_decay=0.1))])
def test_complex_parameters_are_pairs_of_reals(name, kwargs):
    # torch updates a complex parameter as its view of (real, imaginary) pairs.
    rng = np.random.default_rng(8)
    c = lambda *s: rng.standard_normal(s) + 1j * rng.standard_normal(s)  # noqa: E731
    mesh = mesh_of((W,))
    w0, grads = c(5, 3), [c(5, 3) for _ in range(3)]
    w = distribute_tensor(w0.copy(), mesh, [S0], requires_grad=True)
    opt = getattr(mt.optim, name)([w], **kwargs)
    h, state = {**DEFAULTS[name], **kwargs}, {}
    expect = w0.copy().view(np.float64)
    for g in grads:
        w.grad = distribute_tensor(g, mesh, [S0])
        opt.step()
        expect = reference_step(name, h, expect, g.copy().view(np.float64), state)
    np.testing.assert_allclose(w.detach().full_tensor(), expect.view(np.complex128),
                               rtol=1e-12)


def test_adagrad_state_exists_from_the_start_as_torchs():
    mesh = mesh_of((W,))
    a = distribute_tensor(np.ones((5, 2)), mesh, [S0], requires_grad=True)
    b = distribute_tensor(np.ones(3), mesh, [R], requires_grad=True)
    opt = mt.optim.Adagrad([a], initial_accumulator_value=0.25)
    opt.add_param_group({"params": [b], "initial_accumulator_value": 2.0})
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1]
    for i, (p, fill) in enumerate([(a, 0.25), (b, 2.0)]):
        assert sd["state"][i]["step"] == 0.0
        acc = sd["state"][i]["sum"]
        assert acc.placements == p.placements
        np.testing.assert_array_equal(acc.full_tensor(), np.full(p.shape, fill))


def test_foreach_fused_and_differentiable_as_torch():
    mesh = mesh_of((W,))
    w = distribute_tensor(np.ones(4), mesh, [S0], requires_grad=True)
    for name in ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad"):
        cls = getattr(mt.optim, name)
        for foreach, fused in [(None, None), (True, None), (False, True), (None, False)]:
            opt = cls([w], lr=0.1, foreach=foreach, fused=fused)
            assert opt.param_groups[0]["foreach"] is foreach
            assert opt.param_groups[0]["fused"] is fused
        with pytest.raises(RuntimeError, match="cannot be `True` together"):
            cls([w], lr=0.1, foreach=True, fused=True)
        with pytest.raises(NotImplementedError, match="differentiable"):
            cls([w], lr=0.1, differentiable=True)
    # The same update whatever they say.
    outs = []
    for fused in (None, True):
        p = distribute_tensor(np.arange(4.0), mesh, [S0], requires_grad=True)
        opt = mt.optim.Adam([p], lr=0.1, fused=fused)
        p.grad = distribute_tensor(np.linspace(-1, 1, 4), mesh, [S0])
        opt.step()
        outs.append(p.detach().full_tensor())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_what_cannot_be_optimized_raises():
    mesh = mesh_of((W,))
    with pytest.raises(TypeError, match="ndarray parameter has no gradient"):
        mt.optim.SGD([np.ones(3)], lr=0.1)
    partial = mt.DTensor.from_local(np.ones(3), mesh, [Partial()])
    with pytest.raises(ValueError, match="Partial"):
        mt.optim.Adam([partial])
    with pytest.raises(ValueError, match="empty parameter list"):
        mt.optim.AdamW([])
    w = distribute_tensor(np.ones(4), mesh, [S0], requires_grad=True)
    with pytest.raises(ValueError, match="more than one parameter group"):
        mt.optim.SGD([{"params": [w]}, {"params": [w]}], lr=0.1)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        mt.optim.Adam([w], lr=-1.0)
    with pytest.raises(ValueError, match="Nesterov"):
        mt.optim.SGD([w], lr=0.1, nesterov=True)
    # A gradient in another layout is moved to the parameter's, as torch's
    # in-place update moves it; p.grad itself stays as it was.
    opt = mt.optim.SGD([w], lr=0.1)
    w.grad = distribute_tensor(np.ones(4), mesh, [R])
    opt.step()
    np.testing.assert_allclose(w.detach().full_tensor(), np.full(4, 0.9))
    assert w.grad.placements == (R,)


def test_param_groups_and_zero_grad_in_place():
    mesh = mesh_of((W,))
    a = distribute_tensor(np.zeros(5), mesh, [S0], requires_grad=True)
    b = distribute_tensor(np.zeros(5), mesh, [R], requires_grad=True)
    opt = mt.optim.SGD([{"params": a}, {"params": [b], "lr": 0.01}], lr=1.0)
    assert [g["lr"] for g in opt.param_groups] == [1.0, 0.01]
    assert opt.param_groups[1]["momentum"] == 0.0
    for p in (a, b):
        p.grad = distribute_tensor(np.ones(5), mesh, p.placements)
    opt.step()
    np.testing.assert_array_equal(a.detach().full_tensor(), -np.ones(5))
    np.testing.assert_array_equal(b.detach().full_tensor(), -0.01 * np.ones(5))
    grad = a.grad
    opt.zero_grad(set_to_none=False)
    assert a.grad is grad
    np.testing.assert_array_equal(grad.full_tensor(), np.zeros(5))
    c = distribute_tensor(np.zeros(2), mesh, [R], requires_grad=True)
    opt.add_param_group({"params": [c], "lr": 3.0})
    assert opt.param_groups[2]["lr"] == 3.0 and opt.param_groups[2]["momentum"] == 0.0


def test_state_dict_has_torchs_format():
    torch = pytest.importorskip("torch")
    mesh = mesh_of((W,))
    init = arrays(0, np.float64)
    ps = [distribute_tensor(x, mesh, [S0], requires_grad=True) for x in init]
    tps = [torch.tensor(x, requires_grad=True) for x in init]
    opt = mt.optim.Adam([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.5}], amsgrad=True)
    topt = torch.optim.Adam([{"params": tps[:2]}, {"params": tps[2:], "lr": 0.5}],
                            amsgrad=True)
    ps[1].grad = distribute_tensor(init[1], mesh, [S0])
    tps[1].grad = torch.tensor(init[1])
    opt.step()
    topt.step()
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert list(sd) == ["state", "param_groups"]
    assert list(sd["state"]) == list(tsd["state"]) == [1]
    assert set(sd["state"][1]) == set(tsd["state"][1])
    assert float(sd["state"][1]["step"]) == float(tsd["state"][1]["step"])
    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        np.testing.assert_allclose(sd["state"][1][key].full_tensor(),
                                   tsd["state"][1][key].numpy(), rtol=1e-12)
    for g, tg in zip(sd["param_groups"], tsd["param_groups"]):
        assert g["params"] == tg["params"]
        for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
            assert g[key] == tg[key], key



def other_layouts():
    """(mesh, placements for SHAPES) to load into, unlike the saving layout."""
    out = [(mesh_of((W,)), [[S1], [R], [S0]])]
    if W == 4:
        out.append((mesh_of((2, 2)), [[S0, S1], [S0, R], [R, S1]]))
    return out


@pytest.mark.parametrize("name", ["SGD", "AdamW", "RMSprop", "Adagrad"])
def test_saved_state_continues_on_another_layout(tmp, name):
    mesh = mesh_of((W,))
    init = arrays(0, np.float64)
    grads = [arrays(s + 1, np.float64) for s in range(4)]
    kwargs = {"SGD": dict(lr=0.1, momentum=0.9), "AdamW": dict(lr=0.01, amsgrad=True),
              "RMSprop": dict(lr=0.01, momentum=0.5, centered=True),
              "Adagrad": dict(lr=0.1, lr_decay=0.1, initial_accumulator_value=0.5)}[name]

    def run(ps, opt, steps):
        for gs in steps:
            for p, g in zip(ps, gs):
                p.grad = distribute_tensor(g, p.device_mesh, p.placements)
            opt.step()

    ps = [distribute_tensor(a, mesh, [S0], requires_grad=True) for a in init]
    opt = getattr(mt.optim, name)(ps, **kwargs)
    run(ps, opt, grads[:2])
    path = os.path.join(tmp, f"ckpt-{name}")
    mt.save({"params": {str(i): p for i, p in enumerate(ps)}, "optim": opt.state_dict()},
            path)
    run(ps, opt, grads[2:])
    expect = [p.detach().full_tensor() for p in ps]

    for mesh2, pls in other_layouts():
        loaded = mt.load(path, mesh2)
        assert set(loaded) == {"params", "optim"}
        assert sorted(loaded["optim"]["state"]) == [0, 1, 2]
        qs = [distribute_tensor(np.zeros(s), mesh2, p, requires_grad=True)
              for s, p in zip(SHAPES, pls)]
        with mt.no_grad():
            for i, q in enumerate(qs):
                q.to_local()[...] = loaded["params"][str(i)].redistribute(
                    mesh2, q.placements).to_local()
        opt2 = getattr(mt.optim, name)(qs, lr=123.0)
        opt2.load_state_dict(loaded["optim"])
        assert opt2.param_groups[0]["lr"] == kwargs["lr"]
        for q in qs:
            for v in opt2.state[q].values():
                if isinstance(v, mt.DTensor):
                    assert v.placements == q.placements and v.device_mesh == mesh2
        run(qs, opt2, grads[2:])
        for i, q in enumerate(qs):
            np.testing.assert_allclose(q.detach().full_tensor(), expect[i], rtol=1e-12,
                                       atol=1e-15, err_msg=f"{mesh2} param {i}")


def test_load_state_dict_refuses_other_groups():
    mesh = mesh_of((W,))
    a = distribute_tensor(np.zeros(5), mesh, [S0], requires_grad=True)
    b = distribute_tensor(np.zeros(5), mesh, [S0], requires_grad=True)
    sd = mt.optim.SGD([a, b], lr=0.1).state_dict()
    with pytest.raises(ValueError, match="doesn't match the size"):
        mt.optim.SGD([a], lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match="number of parameter groups"):
        mt.optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1).load_state_dict(sd)
