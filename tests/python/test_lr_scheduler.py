"""mpitensor.optim.lr_scheduler: each scheduler's learning rates over 100 steps
equal those of torch's algorithm, written out here on its own (torch's chainable
recurrence to rtol 1e-12, and its closed form to 1e-12 of the base rate), also
after a resume from ``state_dict`` (through mt.save and mt.load); the optimizer
steps with them; torch's warnings and refusals. With torch installed, the same
runs against torch.optim.lr_scheduler itself.
"""

from __future__ import annotations

import math
import os
import warnings
from bisect import bisect_right
from collections import Counter

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard, distribute_tensor
from mpitensor.optim import lr_scheduler as ls
from ops_helpers import W, mesh_of

COMM = MPI.COMM_WORLD
STEPS = 100
BASE = [0.1, 0.03]  # two parameter groups


def optimizer(name="SGD", lr_scale=1.0, **kwargs):
    mesh = mesh_of((W,))
    a = distribute_tensor(np.zeros(6), mesh, [Shard(0)], requires_grad=True)
    b = distribute_tensor(np.zeros(3), mesh, [Shard(0)], requires_grad=True)
    groups = [{"params": [a], "lr": BASE[0] * lr_scale},
              {"params": [b], "lr": BASE[1] * lr_scale}]
    return getattr(mt.optim, name)(groups, **kwargs)


def grads_step(opt):
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = distribute_tensor(np.ones(p.shape), p.device_mesh, p.placements)
    opt.step()


# -- torch's algorithms, written out: lrs[e] for e = 0..STEPS, per base rate ----

def chain(base, first, rule):
    """lr_0 = first(base), lr_e = rule(e, lr_{e-1}, base): a chainable form."""
    out = [first(base)]
    for e in range(1, STEPS + 1):
        out.append(rule(e, out[-1], base))
    return out


def cosine_rule(T, lo):
    def rule(e, lr, base):
        if (e - 1 - T) % (2 * T) == 0:
            return lr + (base - lo) * (1 - math.cos(math.pi / T)) / 2
        return (1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T)) \
            * (lr - lo) + lo
    return rule


def linear_rule(sf, ef, T):
    def rule(e, lr, base):
        if e > T:
            return lr
        return lr * (1.0 + (ef - sf) / (T * sf + (e - 1) * (ef - sf)))
    return rule


def one_cycle(base_unused, max_lr, total, pct, strategy, three, div, fdiv):
    initial, low = max_lr / div, max_lr / div / fdiv
    if three:
        phases = [(pct * total - 1, initial, max_lr),
                  (2 * pct * total - 2, max_lr, initial), (total - 1, initial, low)]
    else:
        phases = [(pct * total - 1, initial, max_lr), (total - 1, max_lr, low)]

    def anneal(a, b, t):
        if strategy == "cos":
            return b + (a - b) / 2 * (math.cos(math.pi * t) + 1)
        return (b - a) * t + a

    out = []
    for s in range(STEPS + 1):
        start = 0.0
        for i, (end, a, b) in enumerate(phases):
            if s <= end or i == len(phases) - 1:
                out.append(anneal(a, b, (s - start) / (end - start)))
                break
            start = end
    return out


def warm_restarts(base, e, T0, mult, lo):
    """SGDR as torch steps it: the position in the period counted one by one."""
    cur, Ti = 0, T0
    for _ in range(e):
        cur += 1
        if cur >= Ti:
            cur, Ti = cur % Ti, Ti * mult
    return lo + (base - lo) * (1 + math.cos(math.pi * cur / Ti)) / 2


def sgdr(base, e, T0, mult, lo):
    """SGDR's closed form: periods T0, T0 * mult, ... from epoch 0."""
    start, Ti = 0, T0
    while e >= start + Ti:
        start, Ti = start + Ti, Ti * mult
    return lo + (base - lo) * (1 + math.cos(math.pi * (e - start) / Ti)) / 2


def cyclic(top, e, up, down, scale):
    """A triangle wave from top / 10 up to top in ``up`` steps and down in
    ``down``, its height times scale(cycle from 1, step)."""
    low, p, c = top * 0.1, e % (up + down), e // (up + down) + 1
    f = p / up if p <= up else (up + down - p) / down
    return low + (top - low) * f * scale(c, e)


def f_lambda(e):
    return 0.5 ** (e // 7) * (1 + e % 3)


def f_mult(e):
    return 0.97 if e % 2 else 1.01


# (name, constructor, recurrence reference, closed-form reference or None)
CASES = [
    ("LambdaLR", lambda o: ls.LambdaLR(o, f_lambda),
     lambda b: [b * f_lambda(e) for e in range(STEPS + 1)], None),
    ("MultiplicativeLR", lambda o: ls.MultiplicativeLR(o, f_mult),
     lambda b: chain(b, lambda b: b, lambda e, lr, b: lr * f_mult(e)), None),
    ("StepLR", lambda o: ls.StepLR(o, step_size=7, gamma=0.5),
     lambda b: chain(b, lambda b: b, lambda e, lr, b: lr * 0.5 if e % 7 == 0 else lr),
     lambda b, e: b * 0.5 ** (e // 7)),
    ("MultiStepLR", lambda o: ls.MultiStepLR(o, milestones=[10, 30, 30, 75], gamma=0.3),
     lambda b: chain(b, lambda b: b,
                     lambda e, lr, b: lr * 0.3 ** [10, 30, 30, 75].count(e)),
     lambda b, e: b * 0.3 ** bisect_right([10, 30, 30, 75], e)),
    ("ConstantLR", lambda o: ls.ConstantLR(o, factor=0.25, total_iters=12),
     lambda b: chain(b, lambda b: b * 0.25,
                     lambda e, lr, b: lr * (1 / 0.25) if e == 12 else lr),
     lambda b, e: b * (0.25 if e < 12 else 1.0)),
    ("LinearLR", lambda o: ls.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=40),
     lambda b: chain(b, lambda b: b * 0.1, linear_rule(0.1, 0.9, 40)),
     lambda b, e: b * (0.1 + 0.8 * min(40, e) / 40)),
    ("ExponentialLR", lambda o: ls.ExponentialLR(o, gamma=0.97),
     lambda b: chain(b, lambda b: b, lambda e, lr, b: lr * 0.97),
     lambda b, e: b * 0.97 ** e),
    ("PolynomialLR", lambda o: ls.PolynomialLR(o, total_iters=60, power=1.7),
     lambda b: chain(b, lambda b: b, lambda e, lr, b: lr if e > 60 else
                     lr * ((1 - e / 60) / (1 - (e - 1) / 60)) ** 1.7),
     lambda b, e: b * (1 - min(60, e) / 60) ** 1.7),
    ("CosineAnnealingLR", lambda o: ls.CosineAnnealingLR(o, T_max=30, eta_min=1e-3),
     lambda b: chain(b, lambda b: b, cosine_rule(30, 1e-3)),
     lambda b, e: 1e-3 + (b - 1e-3) * (1 + math.cos(math.pi * e / 30)) / 2),
    ("SequentialLR", lambda o: ls.SequentialLR(
        o, [ls.LinearLR(o, start_factor=0.01, total_iters=10),
            ls.CosineAnnealingLR(o, T_max=90)], milestones=[10]),
     lambda b: (chain(b, lambda b: b * 0.01, linear_rule(0.01, 1.0, 10))[:10]
                + chain(b, lambda b: b, cosine_rule(90, 0.0))[:STEPS - 9]),
     lambda b, e: (b * (0.01 + 0.99 * e / 10) if e < 10
                   else b * (1 + math.cos(math.pi * (e - 10) / 90)) / 2)),
    ("ChainedScheduler", lambda o: ls.ChainedScheduler(
        [ls.ConstantLR(o, factor=0.5, total_iters=20), ls.ExponentialLR(o, gamma=0.98)]),
     lambda b: chain(b, lambda b: b * 0.5,
                     lambda e, lr, b: lr * 0.98 * (2.0 if e == 20 else 1.0)),
     lambda b, e: b * (0.5 if e < 20 else 1.0) * 0.98 ** e),
    ("CosineAnnealingWarmRestarts", lambda o: ls.CosineAnnealingWarmRestarts(
        o, T_0=10, T_mult=2, eta_min=1e-3),
     lambda b: [warm_restarts(b, e, 10, 2, 1e-3) for e in range(STEPS + 1)],
     lambda b, e: sgdr(b, e, 10, 2, 1e-3)),
    ("CyclicLR-triangular2", lambda o: ls.CyclicLR(
        o, base_lr=[b * 0.1 for b in BASE], max_lr=BASE, step_size_up=7,
        step_size_down=13, mode="triangular2"),
     lambda b: [cyclic(b, e, 7, 13, lambda c, e: 1 / 2.0 ** (c - 1))
                for e in range(STEPS + 1)], None),
    ("CyclicLR-exp_range", lambda o: ls.CyclicLR(
        o, base_lr=[b * 0.1 for b in BASE], max_lr=BASE, step_size_up=5, mode="exp_range",
        gamma=0.98),
     lambda b: [cyclic(b, e, 5, 5, lambda c, e: 0.98 ** e) for e in range(STEPS + 1)],
     None),
    ("OneCycleLR", lambda o: ls.OneCycleLR(o, max_lr=[1.0, 0.4], total_steps=STEPS),
     None, lambda b, e: None),
    ("OneCycleLR-3-linear", lambda o: ls.OneCycleLR(
        o, max_lr=0.5, total_steps=STEPS, pct_start=0.25, anneal_strategy="linear",
        three_phase=True, div_factor=10.0, final_div_factor=100.0),
     None, lambda b, e: None),
]
ONE_CYCLE = {"OneCycleLR": [dict(max_lr=m, total=STEPS, pct=0.3, strategy="cos",
                                 three=False, div=25.0, fdiv=1e4) for m in (1.0, 0.4)],
             "OneCycleLR-3-linear": [dict(max_lr=0.5, total=STEPS, pct=0.25,
                                          strategy="linear", three=True, div=10.0,
                                          fdiv=100.0)] * 2}


def expected(name, recurrence, closed):
    """(per group: the recurrence's lrs or None, per group: the closed form's)."""
    if name in ONE_CYCLE:
        lrs = [one_cycle(None, **kw) for kw in ONE_CYCLE[name]]
        return lrs, lrs
    rec = [recurrence(b) for b in BASE]
    cl = None if closed is None else [[closed(b, e) for e in range(STEPS + 1)]
                                      for b in BASE]
    return rec, cl


def check(got, rec, closed, upto, what):
    """got[e] = [lr per group] for e < upto."""
    got = np.array(got[:upto]).T
    for g in range(len(BASE)):
        if rec is not None:
            np.testing.assert_allclose(got[g], rec[g][:upto], rtol=1e-12, atol=0,
                                       err_msg=f"{what} group {g} (recurrence)")
        if closed is not None:
            scale = max(abs(x) for x in closed[g][:upto])
            np.testing.assert_allclose(got[g], closed[g][:upto], rtol=0, atol=1e-12 * scale,
                                       err_msg=f"{what} group {g} (closed form)")



@pytest.mark.parametrize("name,make,recurrence,closed", CASES, ids=[c[0] for c in CASES])
def test_learning_rates_are_torchs_over_100_steps_and_after_a_resume(
        tmp, name, make, recurrence, closed):
    rec, cl = expected(name, recurrence, closed)
    opt = optimizer()
    sched = make(opt)
    got = [sched.get_last_lr()]
    assert sched.get_last_lr() == [g["lr"] for g in opt.param_groups]
    saved_at = 37
    for e in range(1, STEPS + 1):
        grads_step(opt)
        sched.step()
        got.append(list(sched.get_last_lr()))
        assert got[-1] == [g["lr"] for g in opt.param_groups]
        if e == saved_at:
            path = os.path.join(tmp, f"ckpt-{name}")
            mt.save({"optim": opt.state_dict(), "sched": sched.state_dict()}, path)
    check(got, rec, cl, STEPS + 1, name)
    last = getattr(sched, "last_epoch", None)
    if last is not None:
        assert last == STEPS

    # A new run: its optimizer and scheduler made afresh (another lr), then loaded.
    loaded = mt.load(path, mesh_of((W,)))
    opt2 = optimizer(lr_scale=7.0)
    sched2 = make(opt2)
    opt2.load_state_dict(loaded["optim"])
    sched2.load_state_dict(loaded["sched"])
    assert sched2.get_last_lr() == got[saved_at]
    if name == "MultiStepLR":  # a Counter again, for the closed form's elements()
        assert type(sched2.milestones) is Counter
    resumed = got[:saved_at + 1]
    for _ in range(saved_at + 1, STEPS + 1):
        grads_step(opt2)
        sched2.step()
        resumed.append(list(sched2.get_last_lr()))
    check(resumed, rec, cl, STEPS + 1, f"{name} resumed")
    assert resumed == got  # the same arithmetic: the same bits


def test_the_optimizer_steps_with_the_scheduled_rate():
    opt = optimizer()
    sched = ls.StepLR(opt, step_size=2, gamma=0.5)
    a = opt.param_groups[0]["params"][0]
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        grads_step(opt)
        sched.step()
    np.testing.assert_allclose(a.detach().full_tensor(), -sum(lrs) * np.ones(6), rtol=1e-15)
    assert lrs == [0.1, 0.1, 0.05, 0.05, 0.025]


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_one_cycle_cycles_the_momentum(name):
    opt = optimizer(name, momentum=0.9) if name == "SGD" else optimizer(name)
    sched = ls.OneCycleLR(opt, max_lr=1.0, total_steps=STEPS, base_momentum=0.8,
                          max_momentum=0.9)

    def momentum():
        g = opt.param_groups[0]
        return g["betas"][0] if name == "Adam" else g["momentum"]

    seen = [momentum()]
    for _ in range(STEPS):
        grads_step(opt)
        sched.step()
        seen.append(momentum())
    up = 0.3 * STEPS - 1
    for s, m in enumerate(seen):
        if s <= up:
            t = s / up
            want = 0.8 + (0.9 - 0.8) / 2 * (math.cos(math.pi * t) + 1)
        else:
            t = (s - up) / (STEPS - 1 - up)
            want = 0.9 + (0.8 - 0.9) / 2 * (math.cos(math.pi * t) + 1)
        assert abs(m - want) < 1e-14, (s, m, want)
    if name == "Adam":
        assert opt.param_groups[0]["betas"][1] == 0.999
    with pytest.raises(ValueError, match="Tried to step 101 times"):
        grads_step(opt)
        sched.step()


def plateau_reference(metrics, mode, factor, patience, threshold, threshold_mode,
                      cooldown, min_lr, eps, lr):
    """torch's documented rule, step by step."""
    best = math.inf if mode == "min" else -math.inf
    bad = cool = 0
    out = []
    for x in metrics:
        if mode == "min":
            better = x < (best * (1 - threshold) if threshold_mode == "rel"
                          else best - threshold)
        else:
            better = x > (best * (1 + threshold) if threshold_mode == "rel"
                          else best + threshold)
        if better:
            best, bad = x, 0
        else:
            bad += 1
        if cool > 0:
            cool -= 1
            bad = 0
        if bad > patience:
            lr = [old if old - max(old * factor, m) <= eps else max(old * factor, m)
                  for old, m in zip(lr, min_lr)]
            cool, bad = cooldown, 0
        out.append(list(lr))
    return out


@pytest.mark.parametrize("kwargs", [
    dict(mode="min", factor=0.5, patience=2, threshold=1e-2, threshold_mode="rel",
         cooldown=1, min_lr=[0.0, 0.01], eps=1e-8),
    dict(mode="max", factor=0.3, patience=0, threshold=0.05, threshold_mode="abs",
         cooldown=3, min_lr=[1e-3, 1e-3], eps=1e-8),
])
def test_reduce_on_plateau_is_torchs_rule(tmp, kwargs):
    rng = np.random.default_rng(4)
    metrics = list(np.cumsum(rng.standard_normal(STEPS)) * 0.1 + 1.0)
    expect = plateau_reference(metrics, lr=list(BASE), **kwargs)
    opt = optimizer()
    args = dict(kwargs)
    if args["min_lr"][0] == args["min_lr"][1]:
        args["min_lr"] = args["min_lr"][0]  # one value for every group
    sched = ls.ReduceLROnPlateau(opt, **args)
    got = []
    for e, x in enumerate(metrics):
        grads_step(opt)
        # A 0-d DTensor metric, as a loss is: float() of it on every rank.
        sched.step(distribute_tensor(np.array(x), mesh_of((W,)), [mt.Replicate()])
                   if e % 2 else x)
        got.append(list(sched.get_last_lr()))
        if e == 49:
            path = os.path.join(tmp, f"plateau-{kwargs['mode']}")
            mt.save({"optim": opt.state_dict(), "sched": sched.state_dict()}, path)
    assert len({tuple(g) for g in got}) > 2, "the metrics never made it reduce"
    np.testing.assert_allclose(got, expect, rtol=1e-15)
    loaded = mt.load(path, mesh_of((W,)))
    opt2 = optimizer()
    sched2 = ls.ReduceLROnPlateau(opt2, **args)
    opt2.load_state_dict(loaded["optim"])
    sched2.load_state_dict(loaded["sched"])
    resumed = got[:50]
    for x in metrics[50:]:
        grads_step(opt2)
        sched2.step(x)
        resumed.append(list(sched2.get_last_lr()))
    assert resumed == got


def test_warnings_and_refusals_as_torch():
    opt = optimizer()
    sched = ls.ExponentialLR(opt, gamma=0.5)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        sched.step()
    with pytest.warns(UserWarning, match="get_last_lr"):
        sched.get_lr()
    opt = optimizer()
    sched = ls.ExponentialLR(opt, gamma=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grads_step(opt)
        sched.step()
    with pytest.warns(UserWarning, match="epoch parameter"):
        sched.step(4)  # the closed form
    assert sched.get_last_lr() == [BASE[0] * 0.5 ** 4, BASE[1] * 0.5 ** 4]
    with pytest.raises(TypeError, match="is not an Optimizer"):
        ls.StepLR([1, 2], step_size=3)
    with pytest.raises(KeyError, match="initial_lr"):
        ls.StepLR(optimizer(), step_size=3, last_epoch=5)
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas"):
        ls.LambdaLR(opt, [f_lambda])
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        ls.SequentialLR(opt, [ls.StepLR(opt, 3), ls.ReduceLROnPlateau(opt)], [5])
    with pytest.raises(ValueError, match="number of milestones"):
        ls.SequentialLR(opt, [ls.StepLR(opt, 3), ls.StepLR(opt, 4)], [5, 6])
    with pytest.raises(ValueError, match="same optimizer"):
        ls.SequentialLR(opt, [ls.StepLR(opt, 3), ls.StepLR(optimizer(), 4)], [5])
    with pytest.raises(ValueError, match="momentum or beta1"):
        ls.OneCycleLR(optimizer("Adagrad"), max_lr=0.1, total_steps=10)
    with pytest.raises(ValueError, match="total_steps OR"):
        ls.OneCycleLR(opt, max_lr=0.1)
    with pytest.raises(ValueError, match="Factor should be"):
        ls.ReduceLROnPlateau(opt, factor=1.0)


def test_warm_restarts_at_a_fractional_or_later_epoch():
    opt = optimizer()
    sched = ls.CosineAnnealingWarmRestarts(opt, T_0=10, T_mult=2, eta_min=1e-3)
    for epoch, cur, Ti in [(3.25, 3.25, 10), (25.5, 15.5, 20), (70.0, 0.0, 40),
                           (12, 2, 20)]:
        sched.step(epoch)
        want = [1e-3 + (b - 1e-3) * (1 + math.cos(math.pi * cur / Ti)) / 2 for b in BASE]
        np.testing.assert_allclose(sched.get_last_lr(), want, rtol=1e-13, err_msg=epoch)
        assert sched.last_epoch == math.floor(epoch)
    sched.step()  # epoch 13 of the period from 10 on
    np.testing.assert_allclose(sched.get_last_lr(),
                               [sgdr(b, 13, 10, 2, 1e-3) for b in BASE], rtol=1e-13)


def test_cyclic_momentum_moves_against_the_rate():
    opt = optimizer("Adam")
    sched = ls.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=4, base_momentum=0.8,
                        max_momentum=0.9)
    for e in range(1, 20):
        grads_step(opt)
        sched.step()
        f = cyclic(1.0, e, 4, 4, lambda c, e: 1.0) / 0.9 - 0.1 / 0.9  # 0..1
        assert abs(opt.param_groups[0]["betas"][0] - (0.9 - 0.1 * f)) < 1e-14
        assert abs(sched.get_last_lr()[0] - (0.01 + 0.09 * f)) < 1e-14
    assert opt.param_groups[1]["betas"][1] == 0.999


def test_made_with_last_epoch_the_first_step_keeps_the_rates():
    # torch's other way to resume: the groups hold initial_lr and the rates of the
    # saved epoch, and the scheduler is made with last_epoch; its constructor's
    # step does not move the rates once more (torch's _is_initial), the next
    # step continues the chainable form.
    opt = optimizer()
    ls.CosineAnnealingLR(opt, T_max=30)
    for g, lr in zip(opt.param_groups, (0.05, 0.02)):
        g["lr"] = lr
    sched = ls.CosineAnnealingLR(opt, T_max=30, last_epoch=9)
    assert sched.last_epoch == 10 and sched.get_last_lr() == [0.05, 0.02]
    grads_step(opt)
    sched.step()
    ratio = (1 + math.cos(math.pi * 11 / 30)) / (1 + math.cos(math.pi * 10 / 30))
    np.testing.assert_allclose(sched.get_last_lr(), [0.05 * ratio, 0.02 * ratio],
                               rtol=1e-15)
    opt = optimizer()
    ls.ExponentialLR(opt, gamma=0.5)
    sched = ls.ExponentialLR(opt, gamma=0.5, last_epoch=3)
    assert sched.get_last_lr() == BASE


@pytest.mark.parametrize("name,make,recurrence,closed", CASES, ids=[c[0] for c in CASES])
def test_against_torch(name, make, recurrence, closed):
    torch = pytest.importorskip("torch")
    tls = torch.optim.lr_scheduler

    class Shim:
        """The constructors above, on torch's module."""

        def __getattr__(self, attr):
            return getattr(tls, attr)

    opt = optimizer()
    tparams = [torch.zeros(6, requires_grad=True), torch.zeros(3, requires_grad=True)]
    topt = torch.optim.SGD([{"params": [tparams[0]], "lr": BASE[0]},
                            {"params": [tparams[1]], "lr": BASE[1]}])
    global ls
    mine = make(opt)
    saved, ls = ls, Shim()
    try:
        theirs = make(topt)
    finally:
        ls = saved
    for e in range(STEPS + 1):
        np.testing.assert_allclose(mine.get_last_lr(), theirs.get_last_lr(), rtol=1e-12,
                                   err_msg=f"{name} epoch {e}")
        if e == STEPS:
            break
        grads_step(opt)
        for p in tparams:
            p.grad = torch.ones_like(p)
        topt.step()
        mine.step()
        theirs.step()
