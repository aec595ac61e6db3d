"""cross_entropy's label_smoothing, torch's definition: (1 - ε) nll + ε/C Σ_c -w_c
log p_c, "mean" dividing both by the weight sum of the non-ignored targets. Plain
arrays against a NumPy reference and torch (when installed); DTensors, gathered
and inside loss_parallel (vocabulary-sharded logits), against central
differences in float64 and torch's gradients; loss_parallel keeps its two
all-reduces in the forward and none in the backward."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.parallel as mp
from mpitensor import Replicate, Shard, distribute_tensor
from mpitensor.debug import CommDebugMode
from mpitensor.nn import functional as F
from ops_helpers import W, mesh_of, mesh_shapes

CASES = [("mean", False, -100), ("sum", False, 1), ("none", True, -100), ("mean", True, 2),
         ("sum", True, 0), ("none", False, 3)]


def reference(x, t, w, ignore, reduction, eps):
    """torch's cross_entropy_loss_label_smoothing written out in NumPy."""
    cd = 0 if x.ndim == 1 else 1
    c = x.shape[cd]
    logp = x - np.max(x, axis=cd, keepdims=True)
    logp = logp - np.log(np.sum(np.exp(logp), axis=cd, keepdims=True))
    wc = np.ones(c) if w is None else w
    shape = [1] * x.ndim
    shape[cd] = c
    keep = t != ignore
    safe = np.where(keep, t, 0)
    nll = -np.squeeze(np.take_along_axis(logp, np.expand_dims(safe, cd), cd), cd)
    wt = np.where(keep, wc[safe], 0.0)
    smooth = np.where(keep, -np.sum(logp * wc.reshape(shape), axis=cd), 0.0)
    nll = nll * wt
    if reduction == "none":
        return (1 - eps) * nll + eps / c * smooth
    if reduction == "sum":
        return (1 - eps) * nll.sum() + eps / c * smooth.sum()
    return ((1 - eps) * nll.sum() + eps / c * smooth.sum()) / wt.sum()


def problem(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2
    cd = 0 if len(shape) == 1 else 1
    c = shape[cd]
    t_shape = shape[:cd] + shape[cd + 1:]
    t = rng.integers(0, c, size=t_shape)
    return x, t, np.linspace(0.5, 2.0, c)


@pytest.mark.parametrize("shape", [(6, 5), (4, 5, 3), (7,)], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("eps", [0.1, 0.7, 1.0])
def test_plain_arrays_match_the_reference(shape, case, eps):
    reduction, weighted, ignore = case
    x, t, w = problem(shape)
    w = w if weighted else None
    got = F.cross_entropy(x, t, w, ignore_index=ignore, reduction=reduction,
                          label_smoothing=eps)
    np.testing.assert_allclose(got, reference(x, t, w, ignore, reduction, eps),
                               rtol=1e-12, atol=1e-14)
    # ε = 0 is the plain loss.
    np.testing.assert_allclose(
        F.cross_entropy(x, t, w, ignore_index=ignore, reduction=reduction, label_smoothing=0.0),
        reference(x, t, w, ignore, reduction, 0.0), rtol=1e-12, atol=1e-14)


def test_label_smoothing_out_of_range_is_refused():
    x, t, _ = problem((3, 4))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="label_smoothing"):
            F.cross_entropy(x, t, label_smoothing=bad)


def _grad_check(loss, a, mesh, pl, eps=1e-6):
    """loss(DTensor) differentiated by backward equals central differences along
    two random directions; the gradient keeps the input's placements."""
    x = distribute_tensor(a, mesh, pl, requires_grad=True)
    out = loss(x)
    out.backward()
    assert x.grad.placements == tuple(pl)
    g = x.grad.full_tensor()
    directions = np.random.default_rng(99)
    with mt.no_grad():
        for _ in range(2):
            d = directions.uniform(-1, 1, a.shape)
            vals = [float(loss(distribute_tensor(a + s * d, mesh, pl)).full_tensor())
                    for s in (eps, -eps)]
            np.testing.assert_allclose(np.sum(g * d), (vals[0] - vals[1]) / (2 * eps),
                                       rtol=1e-6, atol=1e-8)
    return g


def _scalar(out):
    if out.ndim == 0:
        return out
    c = np.random.default_rng(7).uniform(0.5, 1.5, size=out.shape)
    mesh = out.device_mesh
    return (out * distribute_tensor(c, mesh, [Replicate()] * mesh.ndim)).sum()


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
@pytest.mark.parametrize("classes", [4, 5])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradients_by_central_differences(mesh_shape, classes, case):
    mesh = mesh_of(mesh_shape)
    reduction, weighted, ignore = case
    a, t, w = problem((4, classes), seed=classes)
    w = w if weighted else None

    def loss(x):
        return _scalar(F.cross_entropy(x, t, w, ignore_index=ignore, reduction=reduction,
                                       label_smoothing=0.3))

    def sharded(x):
        with mp.loss_parallel():
            return loss(x)

    fill = (Replicate(),) * (mesh.ndim - 1)
    grads = [_grad_check(loss, a, mesh, (p,) + fill)
             for p in (Replicate(), Shard(0), Shard(1))]
    grads.append(_grad_check(sharded, a, mesh, (Shard(1),) + fill))
    for g in grads[1:]:
        np.testing.assert_allclose(g, grads[0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_loss_parallel_communication_does_not_grow(smoothing):
    mesh = mesh_of((W,))
    a, t, w = problem((4, 6), seed=3)
    x = distribute_tensor(a, mesh, [Shard(1)], requires_grad=True)
    with mp.loss_parallel(), CommDebugMode() as fwd:
        loss = F.cross_entropy(x, t, w, label_smoothing=smoothing)
    with CommDebugMode() as bwd:
        loss.backward()
    assert fwd.get_comm_counts()["all_reduce"] == (2 if W > 1 else 0)
    assert fwd.get_total_counts() == (2 if W > 1 else 0)
    assert bwd.get_total_counts() == 0
    assert x.grad.placements == (Shard(1),)


@pytest.mark.parametrize("shape", [(6, 5), (4, 5, 3)], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_against_torch(shape, case):
    torch = pytest.importorskip("torch")
    reduction, weighted, ignore = case
    x, t, w = problem(shape, seed=11)
    w = w if weighted else None
    tx = torch.tensor(x, requires_grad=True)
    tw = None if w is None else torch.tensor(w)
    want = torch.nn.functional.cross_entropy(tx, torch.tensor(t), tw, ignore_index=ignore,
                                             reduction=reduction, label_smoothing=0.25)
    want.backward(torch.ones_like(want))
    mesh = mesh_of((W,))
    for pl, parallel in ((Replicate(), False), (Shard(1), False), (Shard(1), True)):
        d = distribute_tensor(x, mesh, [pl], requires_grad=True)
        if parallel:
            with mp.loss_parallel():
                out = F.cross_entropy(d, t, w, ignore_index=ignore, reduction=reduction,
                                      label_smoothing=0.25)
        else:
            out = F.cross_entropy(d, t, w, ignore_index=ignore, reduction=reduction,
                                  label_smoothing=0.25)
        np.testing.assert_allclose(out.detach().full_tensor(), want.detach().numpy(),
                                   rtol=1e-10)
        out.backward(distribute_tensor(np.ones(out.shape), mesh, [Replicate()]))
        np.testing.assert_allclose(d.grad.full_tensor(), tx.grad.numpy(), rtol=1e-10,
                                   atol=1e-14)
