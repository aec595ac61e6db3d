"""Optional (skipped without torch): mpitensor's functional collectives beside torch
2.13's ``torch.distributed._functional_collectives`` on gloo, on the same inputs:
the same values, the same gradients, and the same collectives counted by each
library's CommDebugMode, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import mpitensor as mt  # noqa: E402
import mpitensor.distributed._functional_collectives as funcol  # noqa: E402
from mpitensor import DTensor, Replicate  # noqa: E402
from mpitensor.debug import CommDebugMode  # noqa: E402
from mpitensor.device_mesh import local_mesh  # noqa: E402
from torch_helpers import init_gloo  # noqa: E402

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()


def groups():
    """(label, mesh shape, dim or None: the whole 1-D mesh, or "world")."""
    out = [("mesh", (N,), None), ("world", (N,), "world")]
    if N == 4:
        out += [("(mesh, 0)", (2, 2), 0), ("(mesh, 1)", (2, 2), 1)]
    return out


GROUPS = groups()


def pair(shape, dim):
    """(our group, torch's group, its size)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    init_gloo()
    ours, theirs = mt.init_device_mesh("cpu", shape), init_device_mesh("cpu", shape)
    if dim == "world":
        return COMM, dist.group.WORLD, N
    if dim is None:
        return ours, theirs, N
    return (ours, dim), (theirs, dim), shape[dim]


def counts(mode, torch_mode: bool) -> dict:
    """{collective: calls} with torch's op names cut to their last part."""
    got = mode.get_comm_counts()
    return {str(k).split(".")[-1]: v for k, v in got.items() if v}


def run_both(call_ours, call_theirs, x: np.ndarray, w_of):
    """Runs a collective in both libraries on `x` (requiring grad), weighs its
    output by `w_of(shape)` and backpropagates: (values, gradients, counts) of
    each."""
    from torch.distributed.tensor.debug import CommDebugMode as TorchMode

    a = DTensor.from_local(x.copy(), local_mesh(), [Replicate()]).requires_grad_()
    with CommDebugMode() as cm:
        y = call_ours(a)
        (y * w_of(y.shape)).sum().backward()
    t = torch.from_numpy(x.copy()).requires_grad_()
    with TorchMode() as tm:
        z = call_theirs(t)
        (z * torch.from_numpy(w_of(tuple(z.shape)))).sum().backward()
    return ((y.to_local(), z.detach().numpy()), (a.grad.to_local(), t.grad.numpy()),
            (counts(cm, False), counts(tm, True)))


def weights(shape):
    return np.linspace(0.5, 2.0, int(np.prod(shape))).reshape(shape) * (RANK + 1)


def check(call_ours, call_theirs, x, n):
    values, grads, seen = run_both(call_ours, call_theirs, x, weights)
    assert np.allclose(*values), "values"
    assert np.allclose(*grads), "gradients"
    # torch counts a collective over one rank; mpitensor has nothing to run there.
    assert seen[0] == (seen[1] if n > 1 else {}), f"counts {seen[0]} != torch's {seen[1]}"


@pytest.mark.parametrize("label,shape,dim", GROUPS, ids=[g[0] for g in GROUPS])
def test_all_gather_as_torch(label, shape, dim):
    import torch.distributed._functional_collectives as tf

    ours, theirs, n = pair(shape, dim)
    x = np.arange(12.0).reshape(2, 6) + 10 * RANK
    for d in (0, 1, -1):
        check(lambda a: funcol.all_gather_single(a, d, ours),
              lambda t: tf.all_gather_single(t, d, theirs), x, n)


@pytest.mark.parametrize("label,shape,dim", GROUPS, ids=[g[0] for g in GROUPS])
def test_reduce_scatter_as_torch(label, shape, dim):
    import torch.distributed._functional_collectives as tf

    ours, theirs, n = pair(shape, dim)
    x = np.arange(24.0 * n * n).reshape(4 * n, 6 * n) + 10 * RANK
    for d in (0, 1):
        check(lambda a: funcol.reduce_scatter_single(a, "sum", d, ours),
              lambda t: tf.reduce_scatter_single(t, "sum", d, theirs), x, n)


@pytest.mark.parametrize("label,shape,dim", GROUPS, ids=[g[0] for g in GROUPS])
def test_all_reduce_as_torch(label, shape, dim):
    import torch.distributed._functional_collectives as tf

    ours, theirs, n = pair(shape, dim)
    x = np.arange(6.0).reshape(2, 3) * (RANK + 1)
    check(lambda a: funcol.all_reduce(a, "sum", ours),
          lambda t: tf.all_reduce(t, "sum", theirs), x, n)
    for op in ("max", "min", "avg"):
        with mt.no_grad():
            mine = funcol.all_reduce(x, op, ours)
        with torch.no_grad():
            assert np.allclose(mine, tf.all_reduce(torch.from_numpy(x), op, theirs).numpy())


@pytest.mark.parametrize("label,shape,dim", GROUPS, ids=[g[0] for g in GROUPS])
def test_all_to_all_as_torch(label, shape, dim):
    import torch.distributed._functional_collectives as tf

    ours, theirs, n = pair(shape, dim)
    x = np.arange(6.0 * n).reshape(2 * n, 3) + 100 * RANK
    check(lambda a: funcol.all_to_all_single(a, None, None, ours),
          lambda t: tf.all_to_all_single(t, None, None, theirs), x, n)
    # Uneven splits: values and gradients as torch's (mpitensor counts the row
    # counts' exchange too).
    me = RANK if dim in (None, "world") else \
        mt.init_device_mesh("cpu", shape).get_local_rank(dim)
    ins, outs = [me + j + 1 for j in range(n)], [i + me + 1 for i in range(n)]
    x = np.arange(2.0 * sum(ins)).reshape(sum(ins), 2) + 100 * RANK
    values, grads, _ = run_both(lambda a: funcol.all_to_all_single(a, outs, ins, ours),
                                lambda t: tf.all_to_all_single(t, outs, ins, theirs), x,
                                weights)
    assert np.allclose(*values) and np.allclose(*grads)


def test_inside_local_map_as_torch():
    """A tensor-parallel matmul that writes its own all-gather and reduce-scatter,
    in both libraries' local_map: the same output and weight gradient."""
    import torch.distributed._functional_collectives as tf
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard as TS, distribute_tensor as tdist
    from torch.distributed.tensor.experimental import local_map as tlocal_map

    from mpitensor import Shard
    from mpitensor.experimental import local_map

    init_gloo()
    ours, theirs = mt.init_device_mesh("cpu", (N,)), init_device_mesh("cpu", (N,))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2 * N, 4)), rng.standard_normal((4, 3 * N))

    def body(lib, group):
        def f(xl, wl):
            full = lib.all_gather_single(xl, 0, group)  # every row
            y = full @ wl                                # this rank's columns
            return lib.reduce_scatter_single(y * y, "sum", 0, group)
        return f

    xd = mt.distribute_tensor(x, ours, [Shard(0)])
    wd = mt.distribute_tensor(w, ours, [Shard(1)]).requires_grad_()
    y = local_map(body(funcol, ours), out_placements=[Shard(0)],
                  in_placements=([Shard(0)], [Shard(1)]))(xd, wd)
    y.sum().backward()
    xt = tdist(torch.from_numpy(x.copy()), theirs, [TS(0)])
    wt = tdist(torch.from_numpy(w.copy()), theirs, [TS(1)]).requires_grad_()
    yt = tlocal_map(body(tf, theirs), out_placements=[TS(0)],
                    in_placements=([TS(0)], [TS(1)]))(xt, wt)
    yt.sum().backward()
    assert np.allclose(y.full_tensor(), yt.full_tensor().detach().numpy())
    assert np.allclose(wd.grad.full_tensor(), wt.grad.full_tensor().numpy())
