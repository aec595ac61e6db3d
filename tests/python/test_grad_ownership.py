"""Who owns a gradient's memory: the engine stores a gradient as ``.grad`` without a
copy, and accumulates in place, only when that memory is its own, which it knows
without counting references (mpitensor.autograd._engine: it allocated it, the
executor made it for this gradient during the backward, or a node that allocated
it says so; a ``.grad`` read through the property is handed out). Each test either shows the copy gone
(the stored array is the one the backward made; accumulation keeps the array) or
builds a gradient that something else shares (add's ``(g, g)``, a transpose's
view, identity backwards, a user's ``gradient=``, a retained intermediate, a
Function's kept result) and checks that no ``.grad`` shares its memory and that
in-place updates of one (accumulation, clip_grad_norm_, clip_grad_value_, an
optimizer step) change nothing else. At every world size, on uneven shards.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Replicate, Shard, distribute_tensor
from mpitensor.autograd import Function
from mpitensor.fsdp import fully_shard
from mpitensor.nn.utils import clip_grad_norm_, clip_grad_value_
from ops_helpers import W, mesh_of
from tp_models import MLP

R, S0, S1 = Replicate(), Shard(0), Shard(1)
N = 2 * W + 1  # uneven over every world size


def leaf(a, pls=(S0,)):
    return distribute_tensor(np.asarray(a, dtype=np.float64), mesh_of((W,)),
                             list(pls)).requires_grad_()


def local(t) -> np.ndarray:
    return t._data()


def ptr(t) -> int:
    """The address of ``t``'s local data (an int: holding it keeps nothing alive)."""
    return local(t).__array_interface__["data"][0]


def everywhere(ok) -> bool:
    """``ok`` on every rank: a rank that failed alone must not leave the others
    waiting in the test's next collective."""
    return MPI.COMM_WORLD.allreduce(bool(ok), op=MPI.LAND)


def shares(a, b) -> bool:
    return np.shares_memory(local(a), local(b))


def full(t) -> np.ndarray:
    with mt.no_grad():
        return np.array(t.detach().full_tensor())


def weights(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def no_two_share(tensors):
    assert everywhere(not any(shares(a, b) for a, b in itertools.combinations(tensors, 2)))


class Fresh(Function):
    """The identity, whose backward makes a new array, notes where it lives and
    keeps nothing it returns (as mpitensor's own Functions say)."""
    made: list = []
    _gives_up_results = True

    @staticmethod
    def forward(ctx, x):
        ctx.placements = x.placements
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        out = (g * 2.0).redistribute(g.device_mesh, ctx.placements)
        Fresh.made.append(ptr(out))
        return out


class Kept(Function):
    """The identity, whose backward returns a DTensor it keeps (a user's Function
    may: the engine never owns what one returns)."""
    kept: list = []

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        out = g * 2.0
        Kept.kept.append(out)
        return out


@pytest.mark.parametrize("pls", [(S0,), (R,)], ids=str)
def test_a_gradient_only_the_engine_holds_is_stored_without_a_copy(pls):
    w = leaf(np.arange(N), pls)
    Fresh.made.clear()
    Fresh.apply(w).sum().backward()
    assert everywhere(ptr(w.grad) == Fresh.made[-1])
    np.testing.assert_array_equal(full(w.grad), np.full(N, 2.0))


def test_accumulation_is_in_place_unless_someone_holds_the_grad():
    w = leaf(np.arange(N))
    (w * 3.0).sum().backward()
    before = ptr(w._grad)  # unread (through .grad): still the engine's own
    (w * 2.0).sum().backward()
    assert everywhere(ptr(w._grad) == before)  # torch's in-place accumulation
    np.testing.assert_array_equal(full(w.grad), np.full(N, 5.0))
    kept = w.grad
    (w * 1.0).sum().backward()
    np.testing.assert_array_equal(full(kept), np.full(N, 5.0))  # left alone
    np.testing.assert_array_equal(full(w.grad), np.full(N, 6.0))
    view = w.grad._data()[:1]  # a view of the memory holds it too
    del kept
    (w * 1.0).sum().backward()
    assert everywhere(not np.shares_memory(view, local(w.grad)))
    np.testing.assert_array_equal(full(w.grad), np.full(N, 7.0))


def test_a_gradient_someone_else_keeps_is_copied():
    w = leaf(np.arange(N))
    Kept.kept.clear()
    Kept.apply(w).sum().backward()
    kept = Kept.kept[-1]
    assert everywhere(not shares(w.grad, kept))
    clip_grad_value_([w], 0.5)
    np.testing.assert_array_equal(full(kept), np.full(N, 2.0))
    np.testing.assert_array_equal(full(w.grad), np.full(N, 0.5))


def test_add_of_two_leaves_and_of_one_leaf_twice():
    x, y = leaf(np.arange(N)), leaf(np.ones(N))
    np.add(x, y).sum().backward()  # add's backward hands (g, g) to both
    no_two_share([x.grad, y.grad])
    clip_grad_value_([x], 0.25)
    np.testing.assert_array_equal(full(y.grad), np.ones(N))
    (x + y).sum().backward()  # accumulating into one leaves the other alone
    np.testing.assert_array_equal(full(x.grad), np.full(N, 1.25))
    np.testing.assert_array_equal(full(y.grad), np.full(N, 2.0))
    z = leaf(np.arange(N))
    (z + z).sum().backward()
    np.testing.assert_array_equal(full(z.grad), np.full(N, 2.0))


@pytest.mark.parametrize("pls", [(S0,), (S1,), (R,)], ids=str)
def test_x_plus_its_transpose(pls):
    c = weights((N, N), 1)
    x = leaf(weights((N, N), 2), pls)
    cd = distribute_tensor(c, mesh_of((W,)), list(pls))
    ((x + x.T) * cd).sum().backward()
    np.testing.assert_allclose(full(x.grad), c + c.T, rtol=1e-15)
    (x.T * cd).sum().backward()
    np.testing.assert_allclose(full(x.grad), c + 2 * c.T, rtol=1e-15)


def test_retained_intermediates_of_identity_backwards_do_not_share_with_the_leaf():
    mesh = mesh_of((W,))
    w = leaf(weights((N, 3)))
    c = weights((N, 3), 3)
    cd = distribute_tensor(c, mesh, [S0])
    outs = [w.reshape(N, 3),                       # a view of the gradient back
            w.redistribute(mesh, [S0]),            # no move: the same array back
            DTensor.from_local(w.to_local(), mesh, [S0], shape=w.shape,
                               stride=w.stride())]  # a local round trip
    for h in outs:
        h.retain_grad()
    loss = (outs[0] * cd).sum() + (outs[1] * cd).sum() + (outs[2] * cd).sum()
    loss.backward(retain_graph=True)
    no_two_share([w.grad] + [h.grad for h in outs])
    for h in outs:
        np.testing.assert_array_equal(full(h.grad), c)
    np.testing.assert_allclose(full(w.grad), 3 * c, rtol=1e-15)
    clip_grad_value_([w], 0.1)  # in place on the leaf's gradient only
    for h in outs:
        np.testing.assert_array_equal(full(h.grad), c)
    loss.backward()  # both accumulate, each into its own
    for h in outs:
        np.testing.assert_array_equal(full(h.grad), 2 * c)
    np.testing.assert_allclose(full(w.grad), np.clip(3 * c, -0.1, 0.1) + 3 * c,
                               rtol=1e-15)


def test_a_users_gradient_is_never_written():
    w = leaf(weights((N, 2)))
    g = distribute_tensor(weights((N, 2), 4), mesh_of((W,)), [S0])
    original = full(g)
    w.reshape(N, 2).backward(gradient=g)  # an identity backward hands g to the leaf
    w.backward(gradient=g)  # and a leaf's own backward
    no_two_share([w.grad, g])
    np.testing.assert_array_equal(full(w.grad), 2 * original)
    clip_grad_norm_([w], 1e-3)
    np.testing.assert_array_equal(full(g), original)
    h = w.reshape(N, 2)
    h.retain_grad()
    h.backward(gradient=g)
    no_two_share([h.grad, g])
    clip_grad_value_([h], 0.0)
    np.testing.assert_array_equal(full(g), original)


def test_autograd_grad_returns_memory_of_its_own():
    w = leaf(np.arange(N))
    g = distribute_tensor(np.ones(N), mesh_of((W,)), [S0])
    (gw,) = mt.autograd.grad(w.reshape(N), [w], grad_outputs=[g])
    no_two_share([gw, g])
    assert w.grad is None
    np.testing.assert_array_equal(full(gw), np.ones(N))


def test_an_optimizer_step_after_shared_gradients():
    """SGD with momentum keeps a buffer from the first gradient: updates of one
    parameter never reach another's gradient or buffer."""
    x, y = leaf(np.arange(N)), leaf(np.ones(N))
    opt = mt.optim.SGD([x, y], lr=0.5, momentum=0.9)
    for _ in range(2):
        opt.zero_grad()
        np.add(x, y).sum().backward()
        no_two_share([x.grad, y.grad])
        opt.step()
    np.testing.assert_allclose(full(x), np.arange(N) - 0.5 - 0.5 * 1.9, rtol=1e-15)
    np.testing.assert_allclose(full(y), 1 - 0.5 - 0.5 * 1.9, rtol=1e-15)


@pytest.mark.parametrize("dims", [(5, 12, 24), (5, 7, 3)], ids=["even", "uneven"])
def test_fully_shard_gradients_are_disjoint_parts_of_one_buffer(dims):
    """Reduce-scattered once into one buffer, each parameter's gradient a part of
    it, not a copy; where dims are uneven a rank's parts leave padding between
    them, and that rank copies them rather than keep the padding alive."""
    mesh = mt.init_device_mesh("cpu", (W,), mesh_dim_names=("dp",))
    m = fully_shard(MLP(dims, seed=5), mesh=mesh)
    x = distribute_tensor(weights((12, dims[0])), mesh, [S0])
    ((m(x) ** 2).mean()).backward()
    grads = [p.grad for p in m.parameters()]
    bases = {id(local(g).base) for g in grads if local(g).base is not None}
    if dims[1] % W == 0 and dims[2] % W == 0:
        assert everywhere(len(bases) == 1 and len(grads) == 4)
    no_two_share(grads)
    unclipped = [full(g) for g in grads]
    clip_grad_norm_(m.parameters(), 1e-2)  # scales each part once
    total = np.sqrt(sum(float((u ** 2).sum()) for u in unclipped))
    for g, u in zip(grads, unclipped):
        np.testing.assert_allclose(full(g), u * (1e-2 / (total + 1e-6)), rtol=1e-12)
    clipped = [full(g) for g in grads]
    ((m(x) ** 2).mean()).backward()  # the kept parts are left alone
    for g, p, c, u in zip(grads, m.parameters(), clipped, unclipped):
        np.testing.assert_array_equal(full(g), c)
        np.testing.assert_allclose(full(p.grad), c + u, rtol=1e-12)
