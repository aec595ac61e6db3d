"""The small models the tests share: a GPT in mpitensor.nn with the tensor-parallel
plans written for it the way they are written for torch (Megatron's, with and without
sequence parallelism), and a two-layer MLP for data parallelism."""

from __future__ import annotations

import numpy as np

import mpitensor as mt
from mpitensor import Replicate, Shard, nn
from mpitensor.parallel import (
    ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel)


class MLP(nn.Module):
    """Dims 5 -> 7 -> 3 by default: dim 0 of every parameter is uneven over 2..4
    ranks, and empty on some rank at 4."""

    def __init__(self, dims=(5, 7, 3), seed=3):
        super().__init__()
        mt.manual_seed(seed)
        self.w1 = nn.Linear(dims[0], dims[1])
        self.w2 = nn.Linear(dims[1], dims[2])

    def forward(self, x):
        return self.w2(np.tanh(self.w1(x)))


class GPT(nn.Module):
    def __init__(self, vocab, dim, heads, layers, hidden=None, fused_qkv=False,
                 dropout=0.0, norm="layer"):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([
            nn.TransformerBlock(dim, heads, hidden, norm=norm, fused_qkv=fused_qkv,
                                dropout=dropout) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim) if norm == "layer" else nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def build(seed=0, **kw):
    mt.manual_seed(seed)
    return GPT(**kw)


def layer_plan(fused_qkv=False, sequence_parallel=False, local=True):
    """`local=False` keeps the sequence shards DTensors between modules, which
    uneven sequence shards need (a local array is taken as an even shard)."""
    qkv = (["attention.qkv_proj"] if fused_qkv else
           ["attention.q_proj", "attention.k_proj", "attention.v_proj"])
    out = Shard(1) if sequence_parallel else None
    plan = {name: ColwiseParallel() for name in qkv}
    plan["attention.out_proj"] = RowwiseParallel(output_layouts=out, use_local_output=local)
    plan["feed_forward.w1"] = ColwiseParallel()
    plan["feed_forward.w2"] = RowwiseParallel(output_layouts=out, use_local_output=local)
    if sequence_parallel:
        gather = PrepareModuleInput(input_layouts=(Shard(1),),
                                    desired_input_layouts=(Replicate(),))
        plan.update({"attention_norm": SequenceParallel(), "attention": gather,
                     "ffn_norm": SequenceParallel(), "feed_forward": gather})
    return plan


def model_plan(fused_qkv=False, sequence_parallel=False, loss_parallel=False, local=True):
    """The whole model's plan, with "layers.*." keys."""
    plan = {f"layers.*.{k}": v
            for k, v in layer_plan(fused_qkv, sequence_parallel, local).items()}
    if sequence_parallel:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                 output_layouts=Shard(1),
                                                 use_local_output=local)
        plan["norm"] = SequenceParallel()
        first = Shard(1)
    else:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate())
        first = Replicate()
    plan["output"] = ColwiseParallel(
        input_layouts=first,
        output_layouts=Shard(-1) if loss_parallel else Replicate(),
        use_local_output=not loss_parallel)
    return plan


def heads_for(world, fused=False):
    """(heads, head_dim): an uneven split of heads where torch.chunk keeps heads
    whole (3 heads of 2 over 4 ranks: 1, 1, 1, 0; 5 heads of 2 over 3: 2, 2, 1).
    A fused qkv projection splits rows of 3 * head_dim: there, only even ones."""
    if fused:
        return {1: (3, 4), 2: (2, 3), 3: (3, 2), 4: (4, 2)}[world]
    return {1: (3, 4), 2: (4, 3), 3: (5, 2), 4: (3, 2)}[world]
