"""The 2023 tensor-parallel API: each make_input_* / make_output_* helper does what
its name says, PairwiseParallel on an MLP and on MultiheadAttention (swapped for a
TensorParallelMultiheadAttention) matches the single-process output with one
all-reduce, and PairwiseSequenceParallel all-gathers in and reduce-scatters out."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, nn
from mpitensor.debug import CommDebugMode
from mpitensor.parallel import (
    PairwiseParallel, PairwiseSequenceParallel, TensorParallelMultiheadAttention,
    parallelize_module)
from mpitensor.parallel import style

W = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()


# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")


X = np.random.default_rng(3).standard_normal((2 * W, 5))


def counts(fn, *args, **kw):
    with CommDebugMode() as comm:
        out = fn(*args, **kw)
    return out, dict(comm.get_comm_counts())


def test_input_helpers(mesh):
    local = distribute_tensor(X, mesh, [Shard(0)]).to_local()
    # a local shard is an even shard, as in torch: nothing travels
    dt, c = counts(style.make_input_shard_1d, local, mesh, dim=0)
    assert c == {}
    assert dt.placements == (Shard(0),) and dt.shape == X.shape
    dt, c = counts(style.make_input_shard_1d, distribute_tensor(X, mesh), mesh, dim=1)
    assert c == {} and dt.placements == (Shard(1),)
    np.testing.assert_array_equal(dt.full_tensor(), X)
    dt = style.make_input_shard_1d_last_dim(distribute_tensor(X, mesh))
    assert dt.placements == (Shard(1),)
    dt, c = counts(style.make_input_replicate_1d, (X, "other args ignored"), mesh)
    assert c == {} and dt.placements == (Replicate(),)
    np.testing.assert_array_equal(dt.to_local(), X)
    dt, c = counts(style.make_input_reshard_replicate, local, mesh)
    assert c == ({"all_gather_into_tensor": 1} if W > 1 else {})  # the data
    assert dt.placements == (Replicate(),)
    np.testing.assert_array_equal(dt.to_local(), X)
    with pytest.raises(ValueError, match="device_mesh"):
        style.make_input_replicate_1d(X)
    if W == 4:
        with pytest.raises(ValueError, match="1D"):
            style.make_input_replicate_1d(X, mt.init_device_mesh("cpu", (2, 2)))


def partial_of(x, mesh):
    """A Partial(sum) DTensor whose reduction is x (x on the first rank)."""
    local = x if RANK == 0 else np.zeros_like(x)
    return DTensor.from_local(local, mesh, [Partial()])


def test_output_helpers(mesh):
    out, c = counts(style.make_output_replicate_1d, partial_of(X, mesh))
    assert c == ({"all_reduce": 1} if W > 1 else {}) and out.placements == (Replicate(),)
    out, c = counts(style.make_output_shard_1d, partial_of(X, mesh), dim=0)
    assert c == ({"reduce_scatter_tensor": 1} if W > 1 else {})
    np.testing.assert_array_equal(out.full_tensor(), X)
    out = style.make_output_tensor(partial_of(X, mesh))
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, X)
    out, c = counts(style.make_output_reshard_tensor, partial_of(X, mesh))
    assert c == ({"reduce_scatter_tensor": 1} if W > 1 else {})
    np.testing.assert_array_equal(out, distribute_tensor(X, mesh, [Shard(0)]).to_local())
    shard = distribute_tensor(X, mesh, [Shard(0)])
    assert style.make_sharded_output_tensor(shard) is shard.to_local()
    with pytest.raises(TypeError, match="DTensor"):
        style.make_output_tensor(X, mesh)


def mlp(layers=2):
    mt.manual_seed(5)
    mods = []
    hidden = 4 * W + 1  # uneven over the ranks
    for i in range(layers):
        mods += [nn.Linear(5, hidden) if i % 2 == 0 else nn.Linear(hidden, 5), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


@pytest.mark.parametrize("layers", [2, 4])
def test_pairwise_parallel_mlp(mesh, layers):
    ref = mlp(layers)(X)
    m = parallelize_module(mlp(layers), mesh, PairwiseParallel())
    assert m[0].weight.placements == (Shard(0),) and m[2].weight.placements == (Shard(1),)
    y, c = counts(m, X)
    assert c == ({"all_reduce": layers // 2} if W > 1 else {})
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-12)


def test_pairwise_sequence_parallel_mlp(mesh):
    ref = mlp()(X)
    m = parallelize_module(mlp(), mesh, PairwiseSequenceParallel())
    y, c = counts(m, distribute_tensor(X, mesh, [Shard(0)]).to_local())
    # the input's data (an even shard, as in torch), then the reduce-scatter
    assert c == ({"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1} if W > 1 else {})
    np.testing.assert_allclose(y, distribute_tensor(ref, mesh, [Shard(0)]).to_local(),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fused", [False, True])
def test_pairwise_parallel_swaps_multihead_attention(mesh, fused):
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            mt.manual_seed(8)
            self.attn = nn.MultiheadAttention(4 * W, 2 * W, fused_qkv=fused, causal=True)

        def forward(self, x):
            return self.attn(x)

    x = np.random.default_rng(4).standard_normal((2, 6, 4 * W))
    ref = Holder()(x)
    h = parallelize_module(Holder(), mesh, PairwiseParallel())
    assert isinstance(h.attn, TensorParallelMultiheadAttention)
    y, c = counts(h, x)
    assert c == ({"all_reduce": 1} if W > 1 else {})
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-12)


def test_tensor_parallel_multihead_attention_cross_attention(mesh):
    mt.manual_seed(2)
    mha = TensorParallelMultiheadAttention(2 * W, W, tp_size=W)
    q = np.random.default_rng(5).standard_normal((1, 3, 2 * W))
    kv = np.random.default_rng(6).standard_normal((1, 7, 2 * W))
    ref = mha(q, kv, kv)
    mt.manual_seed(2)
    tp = parallelize_module(TensorParallelMultiheadAttention(2 * W, W, tp_size=W), mesh,
                            PairwiseParallel())
    np.testing.assert_allclose(tp(q, kv, kv), ref, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="tp_size"):
        TensorParallelMultiheadAttention(12, 3, tp_size=2)
