"""The training calls that read arguments every rank must pass alike agree on them:
clip_grad_norm_'s gradients, max_norm, norm_type and
error_if_nonfinite, in the all-reduce it makes anyway; an optimizer's parameter
groups, hyperparameters, gradients present and zero_grad calls, in one agreement
per step; the hyperparameters and steps a state dict loads, in the load's
agreement. When one rank passes something else, every rank raises the same
ValueError before anything changes, and the job goes on. Before, each passed
without an error and gave a wrong norm or copies of a Replicate parameter that
diverged."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor
from mpitensor.debug import CommDebugMode
from mpitensor.nn.utils import clip_grad_norm_
from mpi_helpers import outcome, same_everywhere

COMM = MPI.COMM_WORLD
W, RANK = COMM.Get_size(), COMM.Get_rank()

pytestmark = pytest.mark.skipif(W < 2, reason="a rank that differs needs two of them")
WHO = {"first": 0, "last": W - 1, "middle": W // 2}


@pytest.fixture(params=sorted(WHO))
def bad(request):
    return WHO[request.param]


def meshes():
    """The 1-D mesh, and at 4 ranks a (2, 2) one whose gradients are sharded on
    its second dim only (ranks along the first hold the same shards)."""
    out = [mt.init_device_mesh("cpu", (W,))]
    if W == 4:
        out.append(mt.init_device_mesh("cpu", (2, 2)))
    return out


def params_with_grads(mesh):
    """Three parameters with gradients: sharded, replicated and sharded on the
    other dim (the last mesh dim shards; the others replicate)."""
    rep = [Replicate()] * (mesh.ndim - 1)
    rng = np.random.default_rng(7)
    out = []
    for pl in ([Shard(0)], [Replicate()], [Shard(1)]):
        p = distribute_tensor(rng.standard_normal((4, 6)), mesh, rep + pl,
                              requires_grad=True)
        p.grad = distribute_tensor(rng.standard_normal((4, 6)), mesh, rep + pl)
        out.append(p)
    return out


def still_in_step(mesh):
    x = distribute_tensor(np.arange(4.0 * W), mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
    assert np.array_equal(x.full_tensor(), np.arange(4.0 * W))


def full(x) -> np.ndarray:
    """The global array (a parameter requires grad: outside grad mode)."""
    with mt.no_grad():
        return np.array(x.full_tensor())


def grads_of(ps):
    return [full(p.grad) for p in ps]


# -- clip_grad_norm_ ---------------------------------------------------------------

@pytest.mark.parametrize("case", ["fewer_params", "other_order", "max_norm", "norm_type",
                                  "inf_norm", "nonfinite_flag", "grad_missing",
                                  "no_grads"])
def test_clip_grad_norm_with_other_arguments_on_one_rank_raises_everywhere(bad, case):
    for mesh in meshes():
        ps = params_with_grads(mesh)
        before, kept = grads_of(ps), [p.grad for p in ps]
        args = dict(parameters=ps, max_norm=0.5, norm_type=2.0, error_if_nonfinite=False)
        if RANK == bad:
            if case == "fewer_params":
                args["parameters"] = ps[:-1]
            elif case == "other_order":
                args["parameters"] = [ps[0], ps[2], ps[1]]
            elif case == "max_norm":
                args["max_norm"] = 0.25
            elif case == "norm_type":
                args["norm_type"] = 3.0
            elif case == "inf_norm":
                args["norm_type"] = math.inf
            elif case == "nonfinite_flag":
                args["error_if_nonfinite"] = True
            elif case == "grad_missing":
                ps[1].grad = None
            else:
                for p in ps:
                    p.grad = None
        got = same_everywhere(outcome(lambda: clip_grad_norm_(**args)))
        assert got is not None and got[0] == "ValueError", got
        assert "the ranks passed different gradients" in got[1], got
        for p, g in zip(ps, kept):
            p.grad = g
        for p, b in zip(ps, before):
            assert np.array_equal(full(p.grad), b)  # nothing was scaled
        still_in_step(mesh)


def test_clip_grad_norm_problem_on_one_rank_raises_its_error_everywhere(bad):
    """A Partial(max) gradient on one rank only: that rank's error, on every rank."""
    mesh = meshes()[0]
    ps = params_with_grads(mesh)
    if RANK == bad:
        ps[1].grad = mt.DTensor.from_local(np.ones((4, 6)), mesh, [mt.Partial("max")],
                                           run_check=False)
    got = same_everywhere(outcome(lambda: clip_grad_norm_(ps, 1.0)))
    assert got == ("ValueError", "cannot clip a Partial gradient ((Partial(max),)); "
                                 "redistribute it first"), got
    still_in_step(mesh)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm_agrees_in_the_all_reduce_it_makes(norm_type, monkeypatch):
    """One all-reduce of a few numbers per mesh dim (the inf-norm: and one of
    the maximum), also for replicated gradients; no separate agreement."""
    calls = []
    real = mt._comm.agree
    monkeypatch.setattr(mt._comm, "agree", lambda *a: calls.append(a) or real(*a))
    for mesh in meshes():
        for replicated in (False, True):
            ps = params_with_grads(mesh)
            if replicated:
                for p in ps:
                    p.grad = p.grad.redistribute(mesh, [Replicate()] * mesh.ndim)
            want = np.concatenate([g.ravel() for g in grads_of(ps)])
            expect = (float(np.max(np.abs(want))) if math.isinf(norm_type)
                      else float(np.sum(np.abs(want) ** norm_type) ** (1 / norm_type)))
            with CommDebugMode() as comm:
                norm = clip_grad_norm_(ps, 1e9, norm_type=norm_type)
            n = mesh.ndim * (2 if math.isinf(norm_type) else 1)
            assert comm.get_comm_counts() == {"all_reduce": n}, comm.get_comm_counts()
            assert float(norm) == pytest.approx(expect, rel=1e-12)
    assert calls == []


# -- Optimizer.load_state_dict --------------------------------------------------------

def sgd_state(mesh, ps):
    """An SGD's state dict after one step (momentum buffers, as DTensors)."""
    opt = mt.optim.SGD(ps, lr=0.1, momentum=0.9)
    opt.step()
    return opt.state_dict()


@pytest.mark.parametrize("case", ["lr", "momentum", "step", "adam_step"])
def test_optimizer_load_state_dict_with_other_values_on_one_rank_raises_everywhere(bad, case):
    mesh = meshes()[0]
    ps = params_with_grads(mesh)
    if case == "adam_step":
        opt = mt.optim.Adam(ps, lr=0.1)
        opt.step()
        sd = opt.state_dict()
        fresh = mt.optim.Adam(ps, lr=0.1)
    else:
        sd = sgd_state(mesh, ps)
        fresh = mt.optim.SGD(ps, lr=0.5, momentum=0.9)
    sd = {"state": {k: dict(v) for k, v in sd["state"].items()},
          "param_groups": [dict(g) for g in sd["param_groups"]]}
    if RANK == bad:
        if case in ("lr", "momentum"):
            sd["param_groups"][0][case] = 0.2
        else:
            sd["state"][0]["step"] = 7.0
    got = same_everywhere(outcome(lambda: fresh.load_state_dict(sd)))
    assert got is not None and got[0] == "ValueError", got
    assert "the loaded state dict differs across the ranks" in got[1], got
    assert not fresh.state and fresh.param_groups[0]["lr"] in (0.1, 0.5)  # nothing loaded
    assert case == "adam_step" or fresh.param_groups[0]["lr"] == 0.5
    still_in_step(mesh)


def test_optimizer_load_state_dict_of_the_same_values_loads():
    mesh = meshes()[0]
    ps = params_with_grads(mesh)
    sd = sgd_state(mesh, ps)
    fresh = mt.optim.SGD(ps, lr=0.5, momentum=0.9)
    fresh.load_state_dict(sd)
    assert fresh.param_groups[0]["lr"] == 0.1 and len(fresh.state) == 3


# -- Optimizer.step and zero_grad ---------------------------------------------------

@pytest.mark.parametrize("case", ["fewer_params", "other_lr", "other_group_split",
                                  "grad_missing", "no_zero_grad", "zero_to_zeros"])
def test_step_on_other_parameters_or_hyperparameters_raises_everywhere(bad, case):
    for mesh in meshes():
        ps = params_with_grads(mesh)
        mine = ps[:-1] if RANK == bad and case == "fewer_params" else ps
        if RANK == bad and case == "other_group_split":
            groups = [{"params": mine[:1]}, {"params": mine[1:]}]
        else:
            groups = [{"params": mine}]
        opt = mt.optim.SGD(groups, lr=0.1, momentum=0.9)
        if RANK == bad and case == "other_lr":
            opt.param_groups[0]["lr"] = 0.2
        saved = [p.grad for p in ps]
        if RANK == bad and case == "grad_missing":
            ps[1].grad = None
        if case in ("no_zero_grad", "zero_to_zeros"):
            if RANK != bad:
                opt.zero_grad()
            elif case == "zero_to_zeros":
                opt.zero_grad(set_to_none=False)
            for p, g in zip(ps, saved):  # a backward would give these again
                p.grad = g
        before = [full(p) for p in ps]
        got = same_everywhere(outcome(opt.step))
        assert got is not None and got[0] == "ValueError", got
        assert "the ranks' optimizers differ" in got[1], got
        for p, b in zip(ps, before):
            assert np.array_equal(full(p), b)  # nothing was updated
        still_in_step(mesh)
        # The record of zero_grad calls starts afresh: alike steps go on.
        for p, g in zip(ps, saved):
            p.grad = g
        if case not in ("fewer_params", "other_lr", "other_group_split"):
            opt.step()


def test_alike_steps_agree_once_per_step_and_mesh(monkeypatch):
    mesh = meshes()[-1]
    ps = params_with_grads(mesh)
    opt = mt.optim.AdamW(ps, lr=0.1)
    calls = []
    real = mt._comm.agree
    monkeypatch.setattr(mt._comm, "agree", lambda *a: calls.append(a[0]) or real(*a))
    for i in range(3):
        with CommDebugMode() as comm:
            opt.step()
        assert comm.get_total_counts() == 0  # no data moves
        opt.param_groups[0]["lr"] = 0.1 / (i + 2)  # a schedule, alike on every rank
        grads = [p.grad for p in ps]
        opt.zero_grad()
        for p, g in zip(ps, grads):
            p.grad = g
    assert calls == [mesh] * 3
    for p in ps:
        whole = full(p)
        assert np.array_equal(COMM.bcast(whole, root=0), whole)  # copies still alike
        assert np.isfinite(whole).all()
