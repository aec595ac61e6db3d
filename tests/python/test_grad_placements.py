"""A leaf's gradient stays where backward made it, as torch's (no torch needed: the
placements and collective counts torch 2.13 gives are written here as literals,
and test_grad_placements_torch.py holds them against torch itself).

- each program of grad_placement_cases leaves torch's placements in ``.grad``,
  with the values of the same program on Replicate leaves;
- gradient accumulation over micro-steps adds in the placements the first
  backward gave: 4 micro-steps of a data-parallel loss make the 4 all-reduces of
  the losses and none for the gradient, which stays Partial; the optimizer's step
  reduces it once;
- a later gradient placed otherwise is added in the earlier one's placements,
  as torch's in-place add (Partial + Replicate stays Partial without a
  collective, Replicate + Partial all-reduces);
- the optimizers, clip_grad_norm_, zero_grad and autograd.grad take a Partial
  gradient as torch's do, and a rank whose gradient is placed otherwise is a
  ValueError on every rank before anything moves.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode

from grad_placement_cases import CASES, loss, mesh_shape, shape_of

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
LR = 0.1

# torch 2.13's CommDebugMode over 4 micro-steps of ``((x @ w) ** 2).mean()``,
# backward, ``loss.full_tensor()``, x Shard(0) and w Replicate: the losses'
# all-reduces, none for the gradient.
ACCUMULATION_COUNTS = {"all_reduce": 4} if W > 1 else {}
# torch 2.13's collectives in the step after them: SGD reduces the Partial
# gradient once, Adam in each of its three in-place operations that read it.
# mpitensor reduces it once in either.
STEP_COUNTS = {"SGD": 1, "Adam": 3}
# The placements of two backward passes' gradients (x Shard(0): Partial, x
# Replicate: Replicate) in both orders.
MIXED = [("S0", "R"), ("R", "S0")]


def text(pls) -> tuple:
    """mpitensor's placements as the cases' text ('S0', 'R', 'Psum')."""
    return tuple(f"S{p.dim}" if p.is_shard() else f"P{p.reduce_op}" if p.is_partial()
                 else "R" for p in pls)


def parse(t):
    return Replicate() if t == "R" else Shard(int(t[1:])) if t[0] == "S" else Partial(t[1:])


_MESHES: dict = {}


def mesh_of(shape):
    if shape not in _MESHES:
        _MESHES[shape] = mt.init_device_mesh("cpu", shape)
    return _MESHES[shape]


def _grads(case, mesh, values, placed: bool) -> list:
    leaves = []
    for i, (v, pls) in enumerate(zip(values, case[3])):
        pls = [parse(t) for t in pls] if placed else [Replicate()] * mesh.ndim
        leaves.append(mt.distribute_tensor(v, mesh, pls, requires_grad=i in case[4]))
    y = case[5](*leaves)
    loss(case, y).backward()
    return [leaves[i].grad for i in case[4]]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradients_stay_where_backward_made_them(case):
    shape = mesh_shape(case, W)
    if shape is None:
        pytest.skip(f"the case's mesh does not fit {W} ranks")
    mesh = mesh_of(shape)
    rng = np.random.default_rng(3)
    values = [rng.standard_normal(shape_of(s, W)) for s in case[2]]
    got = _grads(case, mesh, values, True)
    want = _grads(case, mesh, values, False)
    for g, w, pls in zip(got, want, case[6]):
        if W > 1:
            assert text(g.placements) == pls
        np.testing.assert_allclose(g.full_tensor(), w.full_tensor(), rtol=1e-12, atol=1e-12)


def _optimizer(name, params):
    if name == "SGD":
        return mt.optim.SGD(params, lr=LR, momentum=0.9)
    return mt.optim.Adam(params, lr=LR)


def accumulate(mesh, x_np, w_np, steps: int, name: str):
    """``steps`` micro-steps of a data-parallel loss (x Shard(0), w Replicate),
    each logging its loss, then one step of optimizer ``name``: the collective
    counts of the micro-steps and of the step, the gradient's placements before
    the step and the weight after it."""
    x = mt.distribute_tensor(x_np, mesh, [Shard(0)])
    w = mt.distribute_tensor(w_np, mesh, [Replicate()], requires_grad=True)
    opt = _optimizer(name, [w])
    with CommDebugMode() as micro:
        for _ in range(steps):
            loss = ((x @ w) ** 2).mean()
            loss.backward()
            loss.full_tensor()
    placements = text(w.grad.placements)
    with CommDebugMode() as step:
        opt.step()
    return (dict(micro.get_comm_counts()), dict(step.get_comm_counts()), placements,
            w.detach().full_tensor())


def _expected_weight(x, w, steps, name):
    g = steps * 2 * x.T @ (x @ w) / (x.shape[0] * w.shape[1])
    if name == "SGD":
        return w - LR * g
    return w - LR * g / (np.abs(g) + 1e-8)  # Adam's first step: m^ = g, v^ = g**2


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_accumulation_communicates_as_torch(name):
    mesh = mesh_of((W,))
    rng = np.random.default_rng(7)
    x_np, w_np = rng.standard_normal((4 * W, 3)), rng.standard_normal((3, 2))
    micro, step, pl, w = accumulate(mesh, x_np, w_np, 4, name)
    assert micro == ACCUMULATION_COUNTS
    assert step == ({"all_reduce": 1} if W > 1 else {})
    if W > 1:
        assert pl == ("Psum",)
    np.testing.assert_allclose(w, _expected_weight(x_np, w_np, 4, name), rtol=1e-10)


def _data_parallel(x_pl):
    mesh = mesh_of((W,))
    rng = np.random.default_rng(9)
    x_np, w_np = rng.standard_normal((2 * W, 3)), rng.standard_normal((3, 2))
    x = mt.distribute_tensor(x_np, mesh, [parse(x_pl)])
    return x, x_np, w_np, mesh


@pytest.mark.parametrize("first,second", MIXED)
def test_a_later_gradient_is_added_in_the_earlier_ones_placements(first, second):
    if W == 1:
        pytest.skip("one rank: nothing is Partial")
    mesh = mesh_of((W,))
    rng = np.random.default_rng(9)
    x_np, w_np = rng.standard_normal((2 * W, 3)), rng.standard_normal((3, 2))
    w = mt.distribute_tensor(w_np, mesh, [Replicate()], requires_grad=True)
    for i, pl in enumerate((first, second)):
        x = mt.distribute_tensor(x_np, mesh, [parse(pl)])
        with CommDebugMode() as comm:
            (x @ w).sum().backward()
        if i == 0:
            made = text(w.grad.placements)
    assert text(w.grad.placements) == made == (("Psum",) if first == "S0" else ("R",))
    # Partial + Replicate: each rank adds its share; Replicate + Partial: all-reduce
    assert comm.get_total_counts() == (0 if first == "S0" else 1)
    want = 2 * x_np.T @ np.ones((x_np.shape[0], w_np.shape[1]))
    np.testing.assert_allclose(w.grad.full_tensor(), want, rtol=1e-12)


def test_a_held_gradient_is_not_written_and_the_sum_keeps_its_placements():
    if W == 1:
        pytest.skip("one rank: nothing is Partial")
    mesh = mesh_of((W,))
    x_np = np.arange(6.0 * W).reshape(2 * W, 3)
    x = mt.distribute_tensor(x_np, mesh, [Shard(0)])
    w = mt.distribute_tensor(np.ones((3, 2)), mesh, [Replicate()], requires_grad=True)
    (x @ w).sum().backward()
    held = w.grad
    before = held.to_local().copy()
    x2 = mt.distribute_tensor(x_np, mesh, [Replicate()])
    (x2 @ w).sum().backward()
    assert w.grad is not held and np.array_equal(held.to_local(), before)
    assert w.grad.placements == (Partial(),)
    want = 2 * x_np.T @ np.ones((2 * W, 2))
    np.testing.assert_allclose(w.grad.full_tensor(), want, rtol=1e-12)


def test_zero_grad_keeps_the_placements_and_the_next_backward_adds_locally():
    if W == 1:
        pytest.skip("one rank: nothing is Partial")
    x, x_np, w_np, mesh = _data_parallel("S0")
    w = mt.distribute_tensor(w_np, mesh, [Replicate()], requires_grad=True)
    opt = mt.optim.SGD([w], lr=LR)
    (x @ w).sum().backward()
    opt.zero_grad(set_to_none=False)
    assert w.grad.placements == (Partial(),)
    with CommDebugMode() as comm:
        (x @ w).sum().backward()
    assert comm.get_total_counts() == 0 and w.grad.placements == (Partial(),)
    np.testing.assert_allclose(w.grad.full_tensor(),
                               x_np.T @ np.ones((2 * W, 2)), rtol=1e-12)


def test_autograd_grad_returns_the_gradient_where_backward_made_it():
    x, x_np, w_np, mesh = _data_parallel("S0")
    w = mt.distribute_tensor(w_np, mesh, [Replicate()], requires_grad=True)
    with CommDebugMode() as comm:
        (gw,) = mt.autograd.grad((x @ w).sum(), [w])
    assert comm.get_total_counts() == 0 and w.grad is None
    if W > 1:
        assert gw.placements == (Partial(),)
    np.testing.assert_allclose(gw.full_tensor(), x_np.T @ np.ones((2 * W, 2)), rtol=1e-12)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_keeps_a_partial_gradient_partial(norm_type):
    x, x_np, w_np, mesh = _data_parallel("S0")
    w = mt.distribute_tensor(w_np, mesh, [Replicate()], requires_grad=True)
    b = mt.distribute_tensor(np.ones(2), mesh, [Replicate()], requires_grad=True)
    (x @ w + b).sum().backward()
    placements = w.grad.placements, b.grad.placements
    full_w, full_b = x_np.T @ np.ones((2 * W, 2)), np.full(2, 2.0 * W)
    flat = np.concatenate([full_w.ravel(), full_b])
    want = np.linalg.norm(flat, norm_type)
    with CommDebugMode() as comm:
        norm = mt.nn.utils.clip_grad_norm_([w, b], 1.0, norm_type=norm_type)
    # the agreement, then both Partial gradients summed side by side: torch's
    # norm reduces each gradient apart (one all-reduce each)
    assert comm.get_total_counts() == (2 if W > 1 else 0)
    assert (w.grad.placements, b.grad.placements) == placements
    np.testing.assert_allclose(float(norm.full_tensor()), want, rtol=1e-12)
    coef = 1.0 / (want + 1e-6)
    np.testing.assert_allclose(w.grad.full_tensor(), full_w * coef, rtol=1e-12)
    np.testing.assert_allclose(b.grad.full_tensor(), full_b * coef, rtol=1e-12)


def test_a_step_refuses_a_gradient_placed_otherwise_on_one_rank_alike():
    if W == 1:
        pytest.skip("one rank: every rank agrees")
    x, x_np, w_np, mesh = _data_parallel("S0")
    w = mt.distribute_tensor(w_np, mesh, [Replicate()], requires_grad=True)
    (x @ w).sum().backward()
    if COMM.rank == 0:  # this rank's gradient is laid out as w; the others' Partial
        w.grad = DTensor(np.zeros(w_np.shape), w._spec)
    opt = mt.optim.SGD([w], lr=LR)
    with pytest.raises(ValueError, match="optimizers differ"):
        opt.step()
    np.testing.assert_array_equal(w.detach().to_local(), w_np)
