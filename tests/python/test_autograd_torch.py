"""Optional (skipped without torch): the same programs on the same values under
torch DTensor (gloo) and mpitensor give the same gradients, in float64."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import mpitensor as mt  # noqa: E402
from mpitensor import DTensor, Partial, Replicate, Shard  # noqa: E402
from torch_helpers import init_gloo  # noqa: E402

COMM = MPI.COMM_WORLD
W = COMM.Get_size()


@pytest.fixture(scope="module")
def meshes():
    from torch.distributed.device_mesh import init_device_mesh

    init_gloo()
    return mt.init_device_mesh("cpu", (W,)), init_device_mesh("cpu", (W,))


def arrays(*shapes):
    rng = np.random.default_rng(5)
    return [rng.standard_normal(s) for s in shapes]


def both(meshes, values, placements):
    """Leaves with these values and placements in mpitensor and in torch."""
    from torch.distributed import tensor as td

    mesh, tmesh = meshes
    ours, theirs = [], []
    for a, pls in zip(values, placements):
        ours.append(mt.distribute_tensor(a, mesh, pls, requires_grad=True))
        tpls = [td.Shard(p.dim) if p.is_shard() else td.Replicate() for p in pls]
        theirs.append(td.distribute_tensor(torch.tensor(a, requires_grad=True), tmesh, tpls))
    return ours, theirs


def assert_same_grads(ours, theirs):
    for i, (o, t) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(o.grad.full_tensor(), t.grad.full_tensor().numpy(),
                                   rtol=1e-12, atol=1e-12, err_msg=f"leaf {i}")


def test_tensor_parallel_mlp_gradients_equal_torch(meshes):
    from torch.distributed import tensor as td

    mesh, tmesh = meshes
    values = arrays((3, 8), (8, 4 * W), (4 * W,), (4 * W, 5))
    pls = [[Replicate()], [Shard(1)], [Shard(0)], [Shard(0)]]
    (x, w1, b1, w2), (tx, tw1, tb1, tw2) = both(meshes, values, pls)
    y = (np.tanh(x @ w1 + b1) @ w2).redistribute(mesh, [Replicate()])
    (y * y).mean().backward()
    ty = (torch.tanh(tx @ tw1 + tb1) @ tw2).redistribute(tmesh, [td.Replicate()])
    (ty * ty).mean().backward()
    assert_same_grads([x, w1, b1, w2], [tx, tw1, tb1, tw2])


def test_local_round_trip_gradients_equal_torch(meshes):
    from torch.distributed import tensor as td

    mesh, tmesh = meshes
    values = arrays((2 * W, 3), (2 * W, 3))
    pls = [[Shard(0)], [Replicate()]]
    (a, b), (ta, tb) = both(meshes, values, pls)
    y = DTensor.from_local(np.exp(a.to_local()) * 2.0, mesh, [Shard(0)])
    z = b.to_local(grad_placements=[Partial()]) * float(COMM.rank + 1)
    ((y * y).sum() + DTensor.from_local(z, mesh, [Partial()]).sum()).backward()
    ty = td.DTensor.from_local(torch.exp(ta.to_local()) * 2.0, tmesh, [td.Shard(0)])
    tz = tb.to_local(grad_placements=[td.Partial()]) * float(COMM.rank + 1)
    ((ty * ty).sum() + td.DTensor.from_local(tz, tmesh, [td.Partial()]).sum()).backward()
    assert_same_grads([a, b], [ta, tb])


def test_broadcast_and_reduction_gradients_equal_torch(meshes):
    mesh, tmesh = meshes
    values = arrays((4, 2 * W), (2 * W,))
    pls = [[Shard(1)], [Shard(0)]]
    (a, b), (ta, tb) = both(meshes, values, pls)
    ((a * b - b / 3.0).sum(axis=0) ** 2).mean().backward()
    ((ta * tb - tb / 3.0).sum(dim=0) ** 2).mean().backward()
    assert_same_grads([a, b], [ta, tb])
