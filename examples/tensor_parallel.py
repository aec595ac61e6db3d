"""Tensor parallelism for a NumPy GPT, with the plan you would write for torch.

    python examples/tensor_parallel.py             # one process: the reference
    mpiexec -n 4 python examples/tensor_parallel.py

Every rank builds the same model (same seed), then parallelize_module shards it
over the ranks with Megatron's layout: attention heads and MLP columns split
column-wise, the projections back row-wise, the vocabulary of the embedding and
of the output layer split too. The sharded forward is checked against the
single-process forward, and module hooks count each layer's collectives: two
all-reduces per layer, or, with sequence parallelism, two all-gathers and two
reduce-scatters moving the same bytes.
"""

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, nn
from mpitensor.debug import CommDebugMode
from mpitensor.nn import functional as F
from mpitensor.parallel import (
    ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
    loss_parallel, parallelize_module)

# Forward only: parameters require grad (as torch's), so nothing is to be recorded.
mt.autograd.set_grad_enabled(False)

comm = MPI.COMM_WORLD
rank, nranks = comm.Get_rank(), comm.Get_size()
VOCAB, DIM, HEADS, LAYERS, BATCH, SEQ = 50, 32, 4 * nranks, 2, 2, 8 * nranks


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM * nranks)
        self.layers = nn.ModuleList([nn.TransformerBlock(DIM * nranks, HEADS)
                                     for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(DIM * nranks)
        self.output = nn.Linear(DIM * nranks, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def plan(sequence_parallel):
    """The plan dict of torch's tensor-parallel tutorial, for this model."""
    out = Shard(1) if sequence_parallel else Replicate()
    layer = {
        "attention.q_proj": ColwiseParallel(),
        "attention.k_proj": ColwiseParallel(),
        "attention.v_proj": ColwiseParallel(),
        "attention.out_proj": RowwiseParallel(output_layouts=out),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=out),
    }
    if sequence_parallel:
        gather = PrepareModuleInput(input_layouts=(Shard(1),),
                                    desired_input_layouts=(Replicate(),))
        layer.update({"attention_norm": SequenceParallel(), "attention": gather,
                      "ffn_norm": SequenceParallel(), "feed_forward": gather})
    whole = {f"layers.*.{k}": v for k, v in layer.items()}
    whole["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=out)
    if sequence_parallel:
        whole["norm"] = SequenceParallel()
    # Logits stay sharded on the vocabulary: loss_parallel needs no gather.
    whole["output"] = ColwiseParallel(input_layouts=out, output_layouts=Shard(-1),
                                      use_local_output=False)
    return whole


def count_per_layer(model):
    """A CommDebugMode around each layer's forward, through the module hooks."""
    report = []
    for i, layer in enumerate(model.layers):
        mode = CommDebugMode()

        def start(mod, args, mode=mode):
            mode.__enter__()  # returns None: the inputs pass unchanged

        def stop(mod, args, out, i=i, mode=mode):
            mode.__exit__(None, None, None)
            report.append((i, dict(mode.get_comm_counts()),
                           sum(mode.get_comm_bytes().values())))

        layer.register_forward_pre_hook(start)
        layer.register_forward_hook(stop)
    return report


def build():
    mt.manual_seed(0)
    return GPT()


mesh = mt.init_device_mesh("cpu", (nranks,), mesh_dim_names=("tp",))
tokens = np.random.default_rng(0).integers(0, VOCAB, size=(BATCH, SEQ))
targets = np.roll(tokens, -1, axis=1)
reference = build()(tokens)
ref_loss = F.cross_entropy(np.moveaxis(reference, -1, 1), targets)

for sp in (False, True):
    model = parallelize_module(build(), mesh, plan(sp))
    report = count_per_layer(model)
    logits = model(tokens)  # a DTensor sharded on the vocabulary
    with loss_parallel():
        loss = F.cross_entropy(np.moveaxis(logits, -1, 1), targets)
    err = np.abs(logits.full_tensor() - reference).max()
    if rank == 0:
        title = "with sequence parallelism" if sp else "Megatron tensor parallelism"
        heads = model.layers[0].attention.q_proj.weight.to_local().shape[0] // (
            DIM * nranks // HEADS)
        print(f"\n{title} over {nranks} rank(s): {heads} of {HEADS} heads per rank")
        print(f"  logits equal the single-process forward: max |diff| = {err:.2e}")
        print(f"  loss {float(loss.to_local()):.6f} (single process {float(ref_loss):.6f})")
        for i, counts, nbytes in report:
            print(f"  layer {i}: {counts or 'no collectives'} ({nbytes} bytes sent by rank 0)")
    assert err < 1e-10 and abs(float(loss.to_local()) - float(ref_loss)) < 1e-10
