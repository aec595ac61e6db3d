"""torch's fsdp_tp_example.py (pytorch/examples, distributed/tensor_parallelism),
ported to mpitensor: 2-D parallelism, tensor + sequence parallelism within a
data-parallel replica ("tp") and fully_shard across replicas ("dp"), on a small
Llama-style model (RMSNorm, causal attention, SwiGLU feed-forward).

The structure is the original's: a (dp, tp) mesh, ``parallelize_module`` of the
embedding/norm/output and then of each block over ``mesh["tp"]`` with the same
plan dicts (torch's module names: ``wq``, ``wk``, ``wv``, ``wo``, ``w1``, ``w2``,
``w3``), the heads divided by the tp size, then ``fully_shard`` over ``mesh["dp"]``
(each block, then the root) and a training loop in which every replica draws its
own batch. A plain SGD step stands in for the original's AdamW; the model is
float64 so that the losses equal a one-process run's to rounding.

Run: ``mpiexec -n 4 python -m mpi4py examples/fsdp_tp_example.py`` (any number of
ranks: tp is 2 when it divides it, dp the rest).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, nn
from mpitensor.fsdp import fully_shard
from mpitensor.nn import functional as F
from mpitensor.parallel import (
    ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module)

VOCAB, DIM, N_HEADS, N_LAYERS, SEQ = 64, 32, 4, 2, 8


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        # after ColwiseParallel each rank holds n_heads // tp heads, as in torch's
        heads = [p(x).reshape(bsz, seqlen, self.n_heads, self.head_dim).transpose(0, 2, 1, 3)
                 for p in (self.wq, self.wk, self.wv)]
        out = F.scaled_dot_product_attention(*heads, is_causal=True)
        return self.wo(out.transpose(0, 2, 1, 3).reshape(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.attention = Attention(dim, n_heads)
        self.feed_forward = FeedForward(dim, 4 * dim)
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        mt.manual_seed(0)  # the same weights on every rank, as torch's example
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([TransformerBlock(DIM, N_HEADS) for _ in range(N_LAYERS)])
        self.norm = nn.RMSNorm(DIM, eps=1e-5)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def build(mesh):
    """The original's set-up on a (dp, tp) mesh: TP/SP over tp, FSDP over dp."""
    tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    model = Transformer()
    model = parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for transformer_block in model.layers:
        layer_tp_plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                            desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        }
        attn_layer = transformer_block.attention
        attn_layer.n_heads = attn_layer.n_heads // tp_mesh.size()
        parallelize_module(transformer_block, tp_mesh, layer_tp_plan)
    for transformer_block in model.layers:
        fully_shard(transformer_block, mesh=dp_mesh)
    return fully_shard(model, mesh=dp_mesh)


def train(mesh, steps=5, batch_size=12, lr=0.5):
    """Trains for ``steps`` on one global batch (a replica takes its own rows of
    it; torch's example draws random tokens, which leave nothing to learn) and
    returns the loss of the whole batch at every step."""
    model = build(mesh)
    dp = mesh.size(mesh.mesh_dim_names.index("dp"))
    dp_rank = mesh.get_local_rank("dp")
    rows = slice(dp_rank * batch_size // dp, (dp_rank + 1) * batch_size // dp)
    data = np.random.default_rng(0).integers(0, VOCAB, size=(batch_size, SEQ + 1))
    inp, target = data[rows, :-1], data[rows, 1:]
    losses = []
    for _ in range(steps):
        logits = model(inp)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
        loss.backward()
        with mt.no_grad():
            for p in model.parameters():
                p.to_local()[...] -= lr * p.grad.to_local()
                p.grad = None
            # the replicas' mean: each replica's loss is a term of the average
            mine = loss.detach().to_local() if isinstance(loss, DTensor) else loss
            whole = DTensor.from_local(np.asarray(mine, np.float64), mesh["dp"],
                                       [Partial("avg")]).full_tensor()
        losses.append(float(whole))
    return losses


def main():
    world = MPI.COMM_WORLD.Get_size()
    tp = 2 if world % 2 == 0 else 1
    mesh = mt.init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    for i, loss in enumerate(train(mesh)):
        if mesh.get_rank() == 0:
            print(f"step {i}: loss {loss:.6f}")


if __name__ == "__main__":
    main()

