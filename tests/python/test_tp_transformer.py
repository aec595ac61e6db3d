"""Tensor parallelism end to end: an MLP and a 2-layer GPT parallelized with the
plan dicts written for torch give the single-process output (float64, rtol 1e-10)
at any number of ranks, with uneven head, feature and vocabulary splits; each
layer's forward runs Megatron's collectives (2 all-reduces; with sequence
parallelism 2 all-gathers and 2 reduce-scatters of the same volume); heads cut
by a split are an error on every rank; loss_parallel never gathers the logits."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Shard, distribute_tensor, nn
from mpitensor.debug import CommDebugMode
from mpitensor.nn import functional as F
from mpitensor.parallel import (
    ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module)
from tp_models import build, heads_for, layer_plan, model_plan

W = MPI.COMM_WORLD.Get_size()
B, S, VOCAB = 2, 12, 37  # S divides by 1..4: sequence shards are even


# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def config(fused=False):
    heads, head_dim = heads_for(W, fused)
    dim = heads * head_dim
    return dict(vocab=VOCAB, dim=dim, heads=heads, layers=2, hidden=3 * dim + 1,
                fused_qkv=fused)


TOKENS = np.random.default_rng(7).integers(0, VOCAB, size=(B, S))


def per_layer_counts(model):
    """CommDebugMode around each layer's forward, through the module hooks."""
    modes, out = {}, []
    for i, layer in enumerate(model.layers):
        def pre(mod, args, i=i):
            modes[i] = CommDebugMode().__enter__()

        def post(mod, args, output, i=i):
            modes[i].__exit__(None, None, None)
            out.append((dict(modes[i].get_comm_counts()), dict(modes[i].get_comm_bytes())))

        layer.register_forward_pre_hook(pre)
        layer.register_forward_hook(post)
    return out


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_mlp_colwise_rowwise_is_one_all_reduce(mesh, activation):
    def mlp():
        mt.manual_seed(1)
        return nn.FeedForward(10, 4 * W + 3, activation=activation)  # uneven hidden

    x = np.random.default_rng(0).standard_normal((B, S, 10))
    ref = mlp()(x)
    m = parallelize_module(mlp(), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    with CommDebugMode() as comm:
        y = m(x)
    assert dict(comm.get_comm_counts()) == ({"all_reduce": 1} if W > 1 else {})
    close(y, ref)


@pytest.mark.parametrize("fused", [False, True])
def test_gpt_tensor_parallel(mesh, fused):
    ref = build(**config(fused))(TOKENS)
    model = parallelize_module(build(**config(fused)), mesh, model_plan(fused))
    counts = per_layer_counts(model)
    with CommDebugMode() as comm:
        logits = model(TOKENS)
    close(logits, ref)
    if W > 1:
        assert [c for c, _ in counts] == [{"all_reduce": 2}] * 2
        # + the vocab-parallel embedding's all-reduce and the logits' all-gather
        assert dict(comm.get_comm_counts()) == {"all_reduce": 5, "all_gather_into_tensor": 1}


@pytest.mark.parametrize("fused", [False, True])
def test_gpt_sequence_parallel(mesh, fused):
    ref = build(**config(fused))(TOKENS)
    model = parallelize_module(build(**config(fused)), mesh, model_plan(fused, True))
    counts = per_layer_counts(model)
    logits = model(TOKENS)
    close(logits, ref)
    if W > 1:
        # The two norms receive local arrays (use_local_output) taken as even
        # shards, as in torch: one all-gather and one reduce-scatter per block.
        for c, nbytes in counts:
            assert c == {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}
            assert nbytes["all_gather_into_tensor"] == nbytes["reduce_scatter_tensor"]
            assert nbytes["reduce_scatter_tensor"] > 0


def test_block_plan_on_a_single_block(mesh):
    """The per-layer plan applied to one TransformerBlock, as in torch's tutorials."""
    heads, head_dim = heads_for(W)
    dim = heads * head_dim

    def block():
        mt.manual_seed(3)
        return nn.TransformerBlock(dim, heads, hidden_dim=2 * dim + 1, norm="rms")

    x = np.random.default_rng(1).standard_normal((B, S, dim))
    ref = block()(x)
    b = parallelize_module(block(), mesh, layer_plan())
    with CommDebugMode() as comm:
        y = b(x)
    close(y, ref)
    assert dict(comm.get_comm_counts()) == ({"all_reduce": 2} if W > 1 else {})


@pytest.mark.skipif(W == 1, reason="one rank holds every head")
def test_split_that_cuts_heads_raises_everywhere(mesh):
    heads = {2: 3, 3: 4, 4: 3}[W]  # head_dim 4: torch.chunk cuts a head on some rank
    model = parallelize_module(build(vocab=VOCAB, dim=heads * 4, heads=heads, layers=1),
                               mesh, model_plan())
    with pytest.raises(ValueError, match="cuts a head"):
        model(TOKENS)


def test_loss_parallel_matches_and_never_gathers_logits(mesh):
    cfg = config()
    target = np.random.default_rng(2).integers(0, VOCAB, size=(B, S))
    target[0, 3] = -100
    ref_logits = build(**cfg)(TOKENS)
    ref = F.cross_entropy(np.moveaxis(ref_logits, -1, 1), target)
    model = parallelize_module(build(**cfg), mesh, model_plan(loss_parallel=True))
    logits = model(TOKENS)
    assert isinstance(logits, DTensor) and logits.placements == (Shard(2),)
    with loss_parallel(), CommDebugMode() as comm:
        loss = F.cross_entropy(np.moveaxis(logits, -1, 1), target)
    assert isinstance(loss, DTensor) and loss.shape == ()
    close(loss.to_local(), ref)
    if W > 1:
        assert dict(comm.get_comm_counts()) == {"all_reduce": 2}
    with loss_parallel():
        per_item = F.cross_entropy(np.moveaxis(logits, -1, 1), target, reduction="none")
    close(per_item.to_local(), F.cross_entropy(np.moveaxis(ref_logits, -1, 1), target,
                                               reduction="none"))


def test_loss_parallel_1d_and_bad_layouts(mesh):
    x = np.random.default_rng(3).standard_normal((5, 2 * W + 1))
    t = np.array([0, 2 * W, 1, W, 0])
    with loss_parallel():
        got = F.cross_entropy(distribute_tensor(x, mesh, [Shard(1)]), t, reduction="sum")
        close(got.to_local(), F.cross_entropy(x, t, reduction="sum"))
        if W > 1:
            with pytest.raises(ValueError, match="class dim"):
                F.cross_entropy(distribute_tensor(x, mesh, [Shard(0)]), t)


def test_sequence_parallel_with_an_uneven_sequence(mesh):
    """Sequence shards of uneven length (torch.chunk's) still give the right output
    when they travel between modules as DTensors (a local array is an even shard)."""
    tokens = TOKENS[:, :W + 1] if W > 1 else TOKENS[:, :5]
    ref = build(**config())(tokens)
    model = parallelize_module(build(**config()), mesh,
                               model_plan(sequence_parallel=True, local=False))
    close(model(tokens), ref)
