"""Optional (skipped without torch): a leaf's gradient stays where backward made it,
as torch 2.13's does, side by side on gloo: each program of grad_placement_cases
leaves its gradients in torch's placements (and those are the literals that
test_grad_placements.py checks without torch), with torch's values; gradient
accumulation over micro-steps, then an optimizer step, runs as many collectives
as torch's, counted by each library's CommDebugMode, and the literal counts of
test_grad_placements.py are torch's."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import mpitensor as mt  # noqa: E402
from mpitensor.debug import CommDebugMode  # noqa: E402
from grad_placement_cases import CASES, loss, mesh_shape, shape_of  # noqa: E402
from test_grad_placements import (ACCUMULATION_COUNTS, MIXED, STEP_COUNTS,  # noqa: E402
                                  accumulate, text)
from torch_helpers import init_gloo, pair_of  # noqa: E402

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
_MESHES: dict = {}


def meshes(shape):
    from torch.distributed.device_mesh import init_device_mesh

    if shape not in _MESHES:
        init_gloo()
        _MESHES[shape] = (mt.init_device_mesh("cpu", shape),
                          init_device_mesh("cpu", shape))
    return _MESHES[shape]


def torch_text(pls) -> tuple:
    """torch's placements in the cases' text ('S0', 'R', 'Psum')."""
    out = []
    for p in pls:
        if p.is_shard():
            out.append(f"S{p.dim}")
        elif p.is_partial():
            out.append(f"P{p.reduce_op}")
        else:
            out.append("R")
    return tuple(out)


def both(case):
    """The case's leaves in mpitensor and in torch, from the same local arrays."""
    shape = mesh_shape(case, W)
    mesh, tmesh = meshes(shape)
    rng = np.random.default_rng(3)
    ours, theirs = [], []
    for i, (s, pls) in enumerate(zip(case[2], case[3])):
        g = rng.standard_normal(shape_of(s, W))
        o, t = pair_of(g, mesh, tmesh, pls, requires_grad=i in case[4])
        ours.append(o)
        theirs.append(t)
    return ours, theirs


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradients_stay_where_torch_leaves_them(case):
    if mesh_shape(case, W) is None or W == 1:
        pytest.skip(f"the case's mesh does not fit {W} ranks")
    ours, theirs = both(case)
    y = case[5](*ours)
    loss(case, y).backward()
    ty = case[5](*theirs)
    loss(case, ty).backward()
    for i, want in zip(case[4], case[6]):
        got, t = ours[i].grad, theirs[i].grad
        assert torch_text(t.placements) == want, (
            f"torch 2.13 leaves leaf {i} in {t.placements}: the literal is out of date")
        assert text(got.placements) == want, (i, got.placements, t.placements)
        np.testing.assert_allclose(got.full_tensor(), t.full_tensor().detach().numpy(),
                                   rtol=1e-12, atol=1e-12)


def torch_accumulate(tmesh, x_np, w_np, steps, optimizer):
    """torch's side of test_grad_placements.accumulate: the collective counts of
    the micro-steps and of the step, the gradient's placements, the weight."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode as TorchComm

    x = distribute_tensor(torch.from_numpy(x_np.copy()), tmesh, [Shard(0)])
    w = torch.nn.Parameter(distribute_tensor(torch.from_numpy(w_np.copy()), tmesh, [Replicate()]))
    opt = optimizer([w])
    with TorchComm() as micro:
        for _ in range(steps):
            loss = ((x @ w) ** 2).mean()
            loss.backward()
            loss.full_tensor()
    placements = torch_text(w.grad.placements)
    with TorchComm() as step:
        opt.step()

    def named(c):
        return {str(k).split(".")[-1]: int(v) for k, v in c.get_comm_counts().items()}

    return named(micro), named(step), placements, w.full_tensor().detach().numpy()


TORCH_OPTIMIZERS = {
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.1),
}


@pytest.mark.parametrize("name", sorted(TORCH_OPTIMIZERS))
def test_accumulation_counts_against_torch(name):
    mesh, tmesh = meshes((W,))
    rng = np.random.default_rng(7)
    x_np, w_np = rng.standard_normal((4 * W, 3)), rng.standard_normal((3, 2))
    t_micro, t_step, t_pl, t_w = torch_accumulate(tmesh, x_np, w_np, 4,
                                                  TORCH_OPTIMIZERS[name])
    micro, step, pl, w = accumulate(mesh, x_np, w_np, 4, name)
    np.testing.assert_allclose(w, t_w, rtol=1e-12, atol=1e-12)
    if W == 1:
        return  # torch counts its collectives on a one-rank group too; mpitensor runs none
    assert t_micro == ACCUMULATION_COUNTS, "torch's count is not the literal"
    assert micro == t_micro
    assert pl == t_pl == ("Psum",)
    # mpitensor reduces a gradient once per step; torch's SGD too, its Adam thrice
    assert t_step == {"all_reduce": STEP_COUNTS[name]}
    assert step == {"all_reduce": 1}


@pytest.mark.parametrize("first,second", MIXED)
def test_mixed_accumulation_against_torch(first, second):
    """A second backward whose gradient is placed otherwise is added in the first
    one's placements, as torch's in-place add."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode as TorchComm

    if W == 1:
        pytest.skip("one rank: nothing is Partial")
    mesh, tmesh = meshes((W,))
    rng = np.random.default_rng(9)
    x_np, w_np = rng.standard_normal((2 * W, 3)), rng.standard_normal((3, 2))
    place = {"S0": (mt.Shard(0), Shard(0)), "R": (mt.Replicate(), Replicate())}
    w = mt.distribute_tensor(w_np, mesh, [mt.Replicate()], requires_grad=True)
    tw = distribute_tensor(torch.from_numpy(w_np.copy()), tmesh, [Replicate()]).requires_grad_()
    counts = []
    for pl in (first, second):
        x = mt.distribute_tensor(x_np, mesh, [place[pl][0]])
        tx = distribute_tensor(torch.from_numpy(x_np.copy()), tmesh, [place[pl][1]])
        with CommDebugMode() as ours, TorchComm() as theirs:
            (x @ w).sum().backward()
            (tx @ tw).sum().backward()
        counts.append((ours.get_total_counts(), theirs.get_total_counts()))
    assert text(w.grad.placements) == torch_text(tw.grad.placements)
    assert counts[1][0] == counts[1][1]
    np.testing.assert_allclose(w.grad.full_tensor(), tw.grad.full_tensor().numpy(),
                               rtol=1e-12, atol=1e-12)
