"""Hooks, with torch 2.13's semantics: ``DTensor.register_hook`` (leaf or not; a
replacement gradient; the order and the removal), post-accumulate-grad hooks, and
nn.Module's forward (pre-)hooks and full backward (pre-)hooks, their order over
submodules, and what the engine does with a gradient a hook kept (never writes into
it). A hook that raises on one rank, or returns other placements on one rank,
raises the same error on every rank and the job goes on. The last tests run the
same programs under torch DTensor (gloo) when torch is installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Replicate, Shard, distribute_tensor
from mpitensor.nn import Module, Parameter
from ops_helpers import W, mesh_of

R, S0 = Replicate(), Shard(0)
N = 2 * W + 1  # uneven over every world size
RANK = MPI.COMM_WORLD.Get_rank()


def leaf(a, pls=(S0,)):
    return distribute_tensor(np.asarray(a, dtype=np.float64), mesh_of((W,)),
                             list(pls)).requires_grad_()


def full(t) -> np.ndarray:
    with mt.no_grad():
        return np.array(t.detach().full_tensor())


def values(n=N, seed=0):
    return np.random.default_rng(seed).standard_normal(n)


# -- register_hook -------------------------------------------------------------------


def test_a_leaf_hook_sees_the_gradient_and_its_result_is_accumulated():
    a = values()
    w = leaf(a)
    seen = []

    def hook(g):
        seen.append(full(g))
        return g * 3.0
    w.register_hook(hook)
    (w * w).sum().backward()
    np.testing.assert_allclose(seen[0], 2 * a)
    np.testing.assert_allclose(full(w.grad), 6 * a)
    assert w.grad.placements == (S0,)


def test_hooks_run_in_order_each_given_the_previous_result_and_remove():
    a = values()
    w = leaf(a)
    calls = []
    h1 = w.register_hook(lambda g: calls.append("first") or g + 1.0)
    w.register_hook(lambda g: calls.append(("second", full(g)[0])))
    w.sum().backward()
    assert calls == ["first", ("second", 2.0)]
    np.testing.assert_allclose(full(w.grad), np.full(N, 2.0))
    h1.remove()
    h1.remove()  # twice is harmless
    calls.clear()
    w.grad = None
    w.sum().backward()
    assert calls == [("second", 1.0)]
    np.testing.assert_allclose(full(w.grad), np.ones(N))


def test_a_non_leaf_hook_fires_once_with_the_summed_gradient_and_replaces_it():
    a = values()
    w = leaf(a)
    h = w * 2.0
    seen = []
    h.register_hook(lambda g: seen.append(full(g)) or g * 0.0 + 1.0)
    (h * h + h).sum().backward()  # h reaches the loss twice
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 2 * (2 * a) + 1)
    np.testing.assert_allclose(full(w.grad), np.full(N, 2.0))


def test_a_hook_on_a_retained_tensor_comes_before_its_grad():
    w = leaf(values())
    h = w * 1.0
    h.retain_grad()
    h.register_hook(lambda g: g * 5.0)
    h.sum().backward()
    np.testing.assert_allclose(full(h.grad), np.full(N, 5.0))
    np.testing.assert_allclose(full(w.grad), np.full(N, 5.0))


def test_a_hook_on_the_root_sees_the_seed_and_placements_may_change():
    w = leaf(values(), (S0,))
    loss = (w * w).sum()
    loss.register_hook(lambda g: g * 2.0)
    y = w * 1.0
    y.register_hook(lambda g: g.redistribute(mesh_of((W,)), [R]))
    (y.sum() + loss).backward()
    np.testing.assert_allclose(full(w.grad), 1 + 4 * values())
    assert w.grad.placements == (S0,)


def test_hooks_fire_in_grad_only_on_the_path_to_the_inputs():
    a, b = leaf(values(seed=1)), leaf(values(seed=2))
    fired = []
    a.register_hook(lambda g: fired.append("a") or g * 2.0)
    b.register_hook(lambda g: fired.append("b"))
    (ga,) = mt.autograd.grad((a * b).sum(), [a])
    assert fired == ["a"]
    np.testing.assert_allclose(full(ga), 2 * values(seed=2))
    assert a.grad is None and b.grad is None


def test_registering_is_refused_as_torch_refuses_it():
    plain = distribute_tensor(np.ones(N), mesh_of((W,)), [S0])
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that "
                                           "doesn't require gradient"):
        plain.register_hook(lambda g: None)
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that "
                                           "doesn't require gradient"):
        plain.register_post_accumulate_grad_hook(lambda t: None)
    w = leaf(values())
    with pytest.raises(RuntimeError, match="post accumulate grad hooks cannot be "
                                           "registered on non-leaf tensors"):
        (w * 2.0).register_post_accumulate_grad_hook(lambda t: None)


def test_a_replacement_of_another_shape_or_type_is_refused_everywhere():
    w = leaf(values())

    def bad_shape(g):
        return distribute_tensor(np.ones(N + 1), mesh_of((W,)), [S0])
    h = w.register_hook(bad_shape)
    with pytest.raises(RuntimeError, match="hook 'bad_shape' has changed the size of value"):
        w.sum().backward()
    h.remove()
    h = w.register_hook(lambda g: g.astype(np.float32))
    with pytest.raises(RuntimeError, match="has changed the type of value"):
        w.sum().backward()
    h.remove()
    h = w.register_hook(lambda g: np.ones(N))
    with pytest.raises(TypeError, match="expected DTensor, but hook returned 'ndarray'"):
        w.sum().backward()
    h.remove()
    w.grad = None
    w.sum().backward()  # the job goes on
    np.testing.assert_allclose(full(w.grad), np.ones(N))


# -- ownership: a gradient a hook keeps never changes ------------------------------


def test_a_kept_gradient_and_a_kept_replacement_never_change():
    a = values()
    w = leaf(a)
    kept = []

    def keep(g):
        kept.append((g, full(g)))
        new = g * 1.0
        kept.append((new, full(new)))
        return new
    w.register_hook(keep)
    for _ in range(3):  # accumulation would write into a stored gradient
        (w * w).sum().backward()
    for g, value in kept:
        np.testing.assert_allclose(full(g), value)
    np.testing.assert_allclose(full(w.grad), 6 * a)


def test_a_kept_gradient_shared_with_another_leaf_never_changes():
    # add's backward hands one DTensor to both operands: one leaf may store it as
    # its .grad without a copy before the other's hook is given the same object.
    x, y = leaf(np.ones(N)), leaf(np.ones(N))
    kept = []
    y.register_hook(lambda g: kept.append((g, full(g))))
    x.register_hook(lambda g: kept.append((g, full(g))))
    for _ in range(3):
        (x + y).backward(distribute_tensor(np.full(N, 2.0), mesh_of((W,)), [S0]))
        (x * 3.0 + y * 3.0).sum().backward()
    for g, value in kept:
        np.testing.assert_allclose(full(g), value)
    np.testing.assert_allclose(full(x.grad), np.full(N, 15.0))
    np.testing.assert_allclose(full(y.grad), np.full(N, 15.0))


def test_gradients_a_module_hook_kept_never_change():
    # add's backward hands one DTensor to the module's output and to the leaf y.
    m = Scale("m", np.ones(N), [])
    y, x = leaf(np.ones(N)), leaf(np.ones(N))
    kept = []
    m.register_full_backward_pre_hook(lambda mod, go: kept.append((go[0], full(go[0]))))

    def double(mod, gi, go):
        new = gi[0] * 2.0
        kept.append((new, full(new)))
        return (new,)
    m.register_full_backward_hook(double)
    for _ in range(3):
        (m(x) + y).backward(distribute_tensor(np.full(N, 2.0), mesh_of((W,)), [S0]))
    for g, value in kept:
        np.testing.assert_allclose(full(g), value)
    np.testing.assert_allclose(full(y.grad), np.full(N, 6.0))
    np.testing.assert_allclose(full(x.grad), np.full(N, 12.0))


# -- post-accumulate-grad hooks ----------------------------------------------------


def test_a_post_accumulate_hook_sees_the_accumulated_grad():
    a = values()
    w = leaf(a)
    seen = []
    h = w.register_post_accumulate_grad_hook(lambda t: seen.append((t is w, full(t.grad))))
    w.register_hook(lambda g: g * 2.0)
    (w * w).sum().backward()
    (w * w).sum().backward()
    assert [s[0] for s in seen] == [True, True]
    np.testing.assert_allclose(seen[0][1], 4 * a)
    np.testing.assert_allclose(seen[1][1], 8 * a)
    mt.autograd.grad((w * w).sum(), [w])  # no accumulation: no post-accumulate hook
    assert len(seen) == 2
    h.remove()
    (w * w).sum().backward()
    assert len(seen) == 2


def test_a_post_accumulate_hook_can_step_the_parameter():
    a = values()
    w = leaf(a)

    def step(p):
        with mt.no_grad():
            p._local_tensor -= 0.5 * p.grad._local_tensor
        p.grad = None
    w.register_post_accumulate_grad_hook(step)
    (w * w).sum().backward()
    np.testing.assert_allclose(full(w), a - 0.5 * 2 * a)
    assert w.grad is None


def test_a_post_accumulate_hook_must_return_none_as_torchs():
    w = leaf(values())
    h = w.register_post_accumulate_grad_hook(lambda t: t)  # torch lets this through
    w.sum().backward()
    h.remove()
    h = w.register_post_accumulate_grad_hook(lambda t: t.grad)
    with pytest.raises(RuntimeError, match="should return None"):
        w.sum().backward()
    h.remove()
    w.register_post_accumulate_grad_hook(lambda t: 1)
    with pytest.raises(TypeError, match="expected DTensor, but hook returned 'int'"):
        w.sum().backward()


# -- module hooks --------------------------------------------------------------------


class Scale(Module):
    def __init__(self, name, a, log):
        super().__init__()
        self.name, self.log = name, log
        self.w = Parameter(distribute_tensor(a, mesh_of((W,)), [S0]))

    def forward(self, x):
        self.log.append(("forward", self.name))
        return x * self.w


class Outer(Module):
    def __init__(self, log):
        super().__init__()
        self.log = log
        self.inner = Scale("inner", values(seed=3), log)
        self.w = Parameter(distribute_tensor(values(seed=4), mesh_of((W,)), [S0]))

    def forward(self, x):
        self.log.append(("forward", "outer"))
        return self.inner(x * self.w) * 2.0


def instrument(m, name, log):
    m.register_forward_pre_hook(lambda mod, args: log.append(("pre", name)))
    m.register_forward_hook(lambda mod, args, out: log.append(("post", name)))
    m.register_full_backward_pre_hook(lambda mod, go: log.append(("bw_pre", name)))
    m.register_full_backward_hook(lambda mod, gi, go: log.append(("bw", name)))


def test_module_hooks_fire_in_torchs_order_over_submodules():
    log = []
    m = Outer(log)
    instrument(m, "outer", log)
    instrument(m.inner, "inner", log)
    x = leaf(values(seed=5))
    y = m(x)
    y.sum().backward()
    assert log == [("pre", "outer"), ("forward", "outer"), ("pre", "inner"),
                   ("forward", "inner"), ("post", "inner"), ("post", "outer"),
                   ("bw_pre", "outer"), ("bw_pre", "inner"), ("bw", "inner"),
                   ("bw", "outer")]


def test_full_backward_hooks_see_and_replace_the_gradients():
    log = []
    a, xv = values(seed=3), values(seed=5)
    m = Scale("m", a, log)
    x = leaf(xv)
    got = {}

    def pre(mod, grad_output):
        got["go"] = full(grad_output[0])
        return (grad_output[0] * 2.0,)

    def hook(mod, grad_input, grad_output):
        got["gi"] = full(grad_input[0])
        got["go2"] = full(grad_output[0])
        return (grad_input[0] * 10.0,)
    m.register_full_backward_pre_hook(pre)
    m.register_full_backward_hook(hook)
    (m(x) * 3.0).sum().backward()
    np.testing.assert_allclose(got["go"], np.full(N, 3.0))
    np.testing.assert_allclose(got["go2"], np.full(N, 6.0))
    np.testing.assert_allclose(got["gi"], 6.0 * a)
    np.testing.assert_allclose(full(x.grad), 60.0 * a)
    np.testing.assert_allclose(full(m.w.grad), 6.0 * xv)  # the parameter's: not hooked


def test_a_full_backward_hook_with_no_input_requiring_grad_fires_at_the_outputs():
    log = []
    m = Scale("m", values(seed=3), log)
    x = distribute_tensor(values(seed=5), mesh_of((W,)), [S0])
    got = []
    m.register_full_backward_hook(lambda mod, gi, go: got.append((gi, full(go[0]))))
    with pytest.warns(UserWarning, match="since no inputs require gradients"):
        m(x).sum().backward()
    assert got[0][0] == (None,)
    np.testing.assert_allclose(got[0][1], np.ones(N))
    m.register_full_backward_hook(lambda mod, gi, go: (go[0],))
    with pytest.raises(RuntimeError, match="no input requires gradient should always "
                                           "return None"), pytest.warns(UserWarning):
        m(x).sum().backward()


def test_global_backward_hooks_fire_before_each_modules_own():
    log = []
    m = Outer(log)
    instrument(m, "outer", log)
    pre = mt.nn.register_module_full_backward_pre_hook(
        lambda mod, go: log.append(("global_pre", type(mod).__name__)))
    full_hook = mt.nn.register_module_full_backward_hook(
        lambda mod, gi, go: log.append(("global", type(mod).__name__)))
    try:
        x = leaf(values(seed=5))
        y = m(x)
    finally:
        pre.remove()
        full_hook.remove()
    log.clear()
    y.sum().backward()
    assert log == [("global_pre", "Outer"), ("bw_pre", "outer"), ("global_pre", "Scale"),
                   ("global", "Scale"), ("global", "Outer"), ("bw", "outer")]


def test_module_backward_hooks_remove_and_prepend():
    log = []
    m = Scale("m", values(seed=3), log)
    order = []
    h1 = m.register_full_backward_hook(lambda mod, gi, go: order.append(1))
    m.register_full_backward_hook(lambda mod, gi, go: order.append(0), prepend=True)
    h3 = m.register_full_backward_pre_hook(lambda mod, go: order.append("pre"))
    x = leaf(values(seed=5))
    m(x).sum().backward()
    assert order == ["pre", 0, 1]
    h1.remove()
    h3.remove()
    order.clear()
    m(x).sum().backward()
    assert order == [0]


def test_a_tuple_output_gives_one_grad_output_per_item():
    class Two(Module):
        def forward(self, x):
            return x * 2.0, x * 3.0, 7

    m = Two()
    got = []
    m.register_full_backward_pre_hook(lambda mod, go: got.append(go))
    x = leaf(values())
    a, b, c = m(x)
    (a.sum() * 1.0).backward()
    go = got[0]
    assert len(go) == 3 and go[1] is None and go[2] is None
    np.testing.assert_allclose(full(go[0]), np.ones(N))
    np.testing.assert_allclose(full(x.grad), np.full(N, 2.0))


def test_forward_hooks_with_kwargs_and_prepend():
    log = []
    m = Scale("m", values(seed=3), log)
    seen = []
    m.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(("kw", kwargs)) or
                                ((args[0] * 2.0,), kwargs), with_kwargs=True)
    m.register_forward_pre_hook(lambda mod, args: seen.append("first"), prepend=True)
    m.register_forward_hook(lambda mod, args, kwargs, out: out + 1.0, with_kwargs=True)
    x = distribute_tensor(np.ones(N), mesh_of((W,)), [S0])
    out = m(x)
    assert seen == ["first", ("kw", {})]
    np.testing.assert_allclose(full(out), 2.0 * values(seed=3) + 1.0)


def test_hooks_on_fully_sharded_parameters_and_modules():
    # FSDP2's uses: a gradient hook and an optimizer step per parameter in the
    # backward (post-accumulate), beside fully_shard's own hooks and nodes.
    from mpitensor.fsdp import fully_shard
    from tp_models import MLP

    mesh = mesh_of((W,))
    rng = np.random.default_rng(0)
    x = distribute_tensor(rng.standard_normal((12, 5)), mesh, [S0])
    t = distribute_tensor(rng.standard_normal((12, 3)), mesh, [S0])

    def model():
        m = MLP()
        fully_shard(m.w1, mesh=mesh)
        fully_shard(m.w2, mesh=mesh)
        return fully_shard(m, mesh=mesh)
    plain, hooked = model(), model()
    ((plain(x) - t) ** 2).mean().backward()
    seen, fired = {}, []
    for name, p in hooked.named_parameters():
        p.register_hook(lambda g: g * 2.0)
        p.register_post_accumulate_grad_hook(
            lambda q, name=name: seen.__setitem__(name, (q.grad.placements, full(q.grad))))
    hooked.w1.register_full_backward_hook(lambda mod, gi, go: fired.append(len(gi)))
    with pytest.warns(UserWarning, match="no inputs require gradients"):  # x does not
        ((hooked(x) - t) ** 2).mean().backward()
    assert fired == [1]
    for name, p in plain.named_parameters():
        assert seen[name][0] == (S0,), name
        np.testing.assert_allclose(seen[name][1], 2.0 * full(p.grad), rtol=1e-12,
                                   atol=1e-15, err_msg=name)


def test_an_always_called_forward_hook_runs_when_forward_raises():
    class Fails(Module):
        def forward(self, x):
            raise ValueError("forward failed")

    m = Fails()
    seen = []
    m.register_forward_hook(lambda mod, args, out: seen.append("plain"))
    m.register_forward_hook(lambda mod, args, out: seen.append(("always", out)),
                            always_call=True)

    def noisy(mod, args, kwargs, out):
        raise KeyError("silenced")
    m.register_forward_hook(noisy, with_kwargs=True, always_call=True)
    with pytest.raises(ValueError, match="forward failed"), \
            pytest.warns(UserWarning, match="silenced"):
        m(1.0)
    assert seen == [("always", None)]


# -- SPMD: a hook that raises or differs on one rank ---------------------------------


def one_rank_raises(g=None):
    if RANK == 1:
        raise ZeroDivisionError("rank 1 failed on purpose")


@pytest.mark.skipif(W < 2, reason="needs another rank")
@pytest.mark.parametrize("where", ["leaf", "non_leaf", "post_accumulate",
                                   "module_pre", "module_full"])
def test_a_hook_raising_on_one_rank_raises_on_every_rank(where):
    w = leaf(values())
    if where == "leaf":
        w.register_hook(one_rank_raises)
        loss = (w * w).sum()
    elif where == "non_leaf":
        h = w * 2.0
        h.register_hook(one_rank_raises)
        # After the hook, the backward redistributes (a collective the raising
        # rank would never enter).
        loss = (h.redistribute(mesh_of((W,)), [R]) * 1.0).sum()
    elif where == "post_accumulate":
        w.register_post_accumulate_grad_hook(one_rank_raises)
        loss = (w * w).sum()
    else:
        m = Scale("m", values(seed=3), [])
        if where == "module_pre":
            m.register_full_backward_pre_hook(lambda mod, go: one_rank_raises())
        else:
            m.register_full_backward_hook(lambda mod, gi, go: one_rank_raises())
        loss = m(w).redistribute(mesh_of((W,)), [R]).sum()
    with pytest.raises(RuntimeError, match="ZeroDivisionError: rank 1 failed on purpose"):
        loss.backward()
    # the job goes on: a collective on every rank
    assert full(distribute_tensor(np.arange(N, dtype=float), mesh_of((W,)), [S0]))[-1] == N - 1


@pytest.mark.skipif(W < 2, reason="needs another rank")
def test_a_hook_returning_other_placements_on_one_rank_raises_everywhere():
    w = leaf(values(), (R,))
    mesh = mesh_of((W,))
    # Only rank 1's gradient changes placements, cut from its own copy: a
    # redistribute, collective by contract, would wait for the others.
    def cut(g):
        (size,), (start,) = mt.compute_local_shape_and_global_offset(g.shape, mesh, [S0])
        return DTensor.from_local(g.to_local()[start:start + size].copy(), mesh, [S0],
                                  shape=g.shape, stride=(1,))

    w.register_hook(lambda g: cut(g) if RANK == 1 else None)
    with pytest.raises(ValueError, match="other placements on other ranks"):
        (w * w).sum().backward()
    assert full(w * 1.0).shape == (N,)


# -- against torch DTensor (gloo) -------------------------------------------------------


@pytest.fixture(scope="module")
def torch_meshes():
    pytest.importorskip("torch")
    from torch.distributed.device_mesh import init_device_mesh
    from torch_helpers import init_gloo

    init_gloo()
    return mesh_of((W,)), init_device_mesh("cpu", (W,))


def test_tensor_hooks_agree_with_torch(torch_meshes):
    import torch
    from torch.distributed import tensor as td

    mesh, tmesh = torch_meshes
    av, bv = values(4 * W, seed=7), values(4 * W, seed=8)

    def value(t):
        # A copy: on one rank full_tensor() may be the local array itself, which
        # torch's in-place accumulation changes later.
        v = t.full_tensor()
        return v.clone() if isinstance(v, torch.Tensor) else np.array(v)

    def program(a, b, log):
        a.register_hook(lambda g: log.append(("a", value(g))) or g * 2.0)
        h = a * b
        h.register_hook(lambda g: log.append(("h", value(g))) or g + 1.0)
        b.register_post_accumulate_grad_hook(lambda t: log.append(("b", value(t.grad))))
        ((h * h).sum() + (a * 3.0).sum()).backward()
        ((a * b) * a).sum().backward()
        return a.grad.full_tensor(), b.grad.full_tensor()

    ours, theirs = [], []
    oa = distribute_tensor(av, mesh, [S0]).requires_grad_()
    ob = distribute_tensor(bv, mesh, [R]).requires_grad_()
    ta = td.distribute_tensor(torch.tensor(av), tmesh, [td.Shard(0)]).requires_grad_()
    tb = td.distribute_tensor(torch.tensor(bv), tmesh, [td.Replicate()]).requires_grad_()
    og, tg = program(oa, ob, ours), program(ta, tb, theirs)
    # Hooks of tensors that do not depend on each other may fire in another order
    # (torch's engine runs the newest node first): compare each tensor's calls.
    for key in "ahb":
        o = [v for k, v in ours if k == key]
        t = [v for k, v in theirs if k == key]
        assert len(o) == len(t) > 0, key
        for x, y in zip(o, t):
            np.testing.assert_allclose(np.asarray(x), y.detach().numpy(), rtol=1e-12)
    for x, y in zip(og, tg):
        np.testing.assert_allclose(np.asarray(x), y.detach().numpy(), rtol=1e-12)


def test_module_hooks_agree_with_torch(torch_meshes):
    import torch
    from torch.distributed import tensor as td

    mesh, tmesh = torch_meshes
    wv, vv, xv = values(4 * W, seed=9), values(4 * W, seed=10), values(4 * W, seed=11)

    class TScale(torch.nn.Module):
        def __init__(self, w):
            super().__init__()
            self.w = torch.nn.Parameter(w)

        def forward(self, x):
            return x * self.w

    class TOuter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = TScale(td.distribute_tensor(torch.tensor(wv), tmesh, [td.Shard(0)]))
            self.v = torch.nn.Parameter(td.distribute_tensor(torch.tensor(vv), tmesh,
                                                             [td.Replicate()]))

        def forward(self, x):
            return torch.tanh(self.inner(x * self.v)), x * 2.0

    class OScale(Module):
        def __init__(self):
            super().__init__()
            self.w = Parameter(distribute_tensor(wv, mesh, [S0]))

        def forward(self, x):
            return x * self.w

    class OOuter(Module):
        def __init__(self):
            super().__init__()
            self.inner = OScale()
            self.v = Parameter(distribute_tensor(vv, mesh, [R]))

        def forward(self, x):
            return np.tanh(self.inner(x * self.v)), x * 2.0

    def run(m, x, log):
        for name, mod in (("outer", m), ("inner", m.inner)):
            mod.register_full_backward_pre_hook(
                lambda mod, go, name=name: log.append(
                    ("pre", name, [None if g is None else g.full_tensor() for g in go]))
                or tuple(None if g is None else g * 0.5 for g in go))
            mod.register_full_backward_hook(
                lambda mod, gi, go, name=name: log.append(
                    ("full", name, [None if g is None else g.full_tensor() for g in gi]))
                or tuple(None if g is None else g * 3.0 for g in gi))
        y, z = m(x)
        (y * z).sum().backward()
        return [m.inner.w.grad.full_tensor(), m.v.grad.full_tensor(), x.grad.full_tensor()]

    ours, theirs = [], []
    ox = distribute_tensor(xv, mesh, [S0]).requires_grad_()
    tx = td.distribute_tensor(torch.tensor(xv), tmesh, [td.Shard(0)]).requires_grad_()
    og = run(OOuter(), ox, ours)
    tg = run(TOuter(), tx, theirs)
    assert [e[:2] for e in ours] == [e[:2] for e in theirs] == [
        ("pre", "outer"), ("pre", "inner"), ("full", "inner"), ("full", "outer")]
    for o, t in zip(ours, theirs):
        assert len(o[2]) == len(t[2])
        for a, b in zip(o[2], t[2]):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_allclose(np.asarray(a), b.detach().numpy(), rtol=1e-12)
    for o, t in zip(og, tg):
        np.testing.assert_allclose(np.asarray(o), t.detach().numpy(), rtol=1e-12)
