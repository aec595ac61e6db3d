"""Gradient accumulation with fully_shard, as torch FSDP2's
``set_requires_gradient_sync``: micro-steps without sync make no collective in
backward, the last one makes one reduce-scatter per group, and the gradients are
those of four synced backwards added up, and torch's."""

from __future__ import annotations

import numpy as np
import pytest
import mpitensor as mt
from mpitensor.debug import CommDebugMode
from fsdp_torch import rank_rows, torch_stack
from test_fsdp_prefetch import DIMS, RANK, RS, T, W, X, Stack, batch, loss_of, sharded

MICRO = 4


@pytest.fixture(scope="module")
def mesh():
    return mt.init_device_mesh("cpu", (W,), mesh_dim_names=("dp",))


def grads(model) -> dict:
    return {n: p.grad.detach().full_tensor() for n, p in model.named_parameters()}


def accumulate(model, mesh, sync_each: bool):
    """Backward of MICRO micro-batches (the batch scaled by 1..MICRO) into .grad;
    the collectives of each micro-step's backward."""
    x, t = batch(mesh)
    counts = []
    for k in range(MICRO):
        if not sync_each:
            model.set_requires_gradient_sync(k == MICRO - 1)
        loss = loss_of(model, x * (k + 1.0), t)
        with CommDebugMode() as mode:
            loss.backward()
        counts.append(mode.get_comm_counts().get(RS, 0))
    return counts, grads(model)


def test_one_reduce_scatter_per_group_and_the_same_gradients(mesh):
    plain_counts, want = accumulate(sharded(mesh), mesh, sync_each=True)
    counts, got = accumulate(sharded(mesh), mesh, sync_each=False)
    groups = len(DIMS)  # four blocks and the root
    if W > 1:
        assert plain_counts == [groups] * MICRO
        assert counts == [0] * (MICRO - 1) + [groups]
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15,
                                   err_msg=name)


def test_no_gradient_before_the_sync_and_recurse_false(mesh):
    model = sharded(mesh)
    x, t = batch(mesh)
    model.set_requires_gradient_sync(False)
    loss_of(model, x, t).backward()
    assert all(p.grad is None for p in model.parameters())
    # recurse=False: only the root's own group syncs; the blocks keep accumulating
    model.set_requires_gradient_sync(True, recurse=False)
    with CommDebugMode() as mode:
        loss_of(model, x, t).backward()
    if W > 1:
        assert mode.get_comm_counts().get(RS, 0) == 1
    assert [n for n, p in model.named_parameters() if p.grad is not None] == \
        ["head.weight", "head.bias"]


def test_equals_torch(mesh):
    """torch 2.13's FSDP2, the same micro-steps with set_requires_gradient_sync."""
    pytest.importorskip("torch")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from mpitensor.testing import init_torch_gloo

    init_torch_gloo()
    model = torch_stack(DIMS, Stack())
    tmesh = init_device_mesh("cpu", (W,))
    for block in model.layers:
        torch_fully_shard(block, mesh=tmesh)
    torch_fully_shard(model, mesh=tmesh)
    x, t = rank_rows(RANK, W, X, T)
    for k in range(MICRO):
        model.set_requires_gradient_sync(k == MICRO - 1)
        ((model(x * (k + 1.0)) - t) ** 2).mean().backward()
    theirs = [p.grad.full_tensor().numpy() for p in model.parameters()]
    _, ours = accumulate(sharded(mesh), mesh, sync_each=False)
    assert len(ours) == len(theirs)
    for (name, a), b in zip(ours.items(), theirs):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13, err_msg=name)
