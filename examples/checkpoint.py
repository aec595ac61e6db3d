"""Sharded checkpoints of a tensor-parallel model, as plain .npy files.

    python examples/checkpoint.py             # one process
    mpiexec -n 4 python examples/checkpoint.py

A small GPT is parallelized over all ranks with Megatron's plan and its
state_dict saved: one .npy file per parameter, each written collectively with
MPI-IO, every rank writing only its own shard. numpy.load reads any of them as an
ordinary array. The checkpoint is then loaded onto a different layout (sequence
parallelism on the "tp" half of a 2-D mesh, each rank reading only its box) and
into an unsharded model; both give the saved model's output.
"""

import json
import os
import shutil
import tempfile

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, nn
from mpitensor.parallel import (
    ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
    parallelize_module)

# Forward only: parameters require grad (as torch's), so nothing is to be recorded.
mt.autograd.set_grad_enabled(False)

comm = MPI.COMM_WORLD
rank, nranks = comm.Get_rank(), comm.Get_size()
VOCAB, DIM, HEADS, LAYERS, BATCH, SEQ = 50, 48, 12, 2, 2, 12  # 12 heads: any split of 1..4


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([nn.TransformerBlock(DIM, HEADS) for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def plan(sequence_parallel):
    """torch's tensor-parallel tutorial plan; logits come back replicated."""
    out = Shard(1) if sequence_parallel else Replicate()
    layer = {
        "attention.q_proj": ColwiseParallel(), "attention.k_proj": ColwiseParallel(),
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
    whole["output"] = ColwiseParallel(input_layouts=out, output_layouts=Replicate())
    return whole


def build(seed):
    mt.manual_seed(seed)
    return GPT()


def say(*lines):
    if rank == 0:
        print(*lines, sep="\n")


tokens = np.random.default_rng(0).integers(0, VOCAB, size=(BATCH, SEQ))
directory = comm.bcast(tempfile.mkdtemp(prefix="mt-checkpoint-") if rank == 0 else None)
path = os.path.join(directory, "gpt")

# 1. Save: a model parallelized over all ranks.
mesh = mt.init_device_mesh("cpu", (nranks,), mesh_dim_names=("tp",))
model = parallelize_module(build(seed=0), mesh, plan(sequence_parallel=False))
expected = model(tokens)
mt.save(model.state_dict(), path)  # collective: every rank writes its shards
name = "layers.0.feed_forward.w1.weight"
with open(os.path.join(path, "index.json")) as f:
    entry = json.load(f)["entries"][name]
local = model.state_dict()[name].to_local()
say(f"saved {len(model.state_dict())} tensors from {nranks} rank(s) into {path}/",
    f"  {entry['file']}: shape {entry['shape']}, saved as {entry['placements']} on a "
    f"mesh of {entry['mesh_shape']}; rank 0 wrote its {local.shape} shard")

# 2. Any one file is an ordinary NumPy array: the whole weight.
if rank == 0:
    whole = np.load(os.path.join(path, entry["file"]))
    plain_weight = build(seed=0).layers[0].feed_forward.w1.weight
    print(f"  numpy.load: {whole.shape} {whole.dtype}, equal to the unsharded "
          f"model's weight: {np.array_equal(whole, plain_weight)}")
    assert np.array_equal(whole, plain_weight)

# 3. Load onto another layout: sequence parallelism on mesh["tp"] of a 2-D mesh.
grid = mt.init_device_mesh("cpu", (2, nranks // 2) if nranks % 4 == 0 else (1, nranks),
                           mesh_dim_names=("dp", "tp"))
other = parallelize_module(build(seed=1), grid["tp"], plan(sequence_parallel=True))
state = mt.load(path, like=other.state_dict())  # each rank reads only its box
other.load_state_dict(state)
err = np.abs(other(tokens) - expected).max()
w = other.state_dict()[name]
say(f"loaded onto a {grid.shape} mesh, tensor-parallel on 'tp' with sequence "
    f"parallelism:", f"  {name}: {w.placements} on {w.device_mesh.shape}, "
    f"local {w.to_local().shape}", f"  output equals the saved model's: max |diff| = {err:.1e}")
assert err < 1e-12

# 4. Or into an unsharded model on every rank: the DTensors are gathered.
plain = build(seed=2)
plain.load_state_dict(mt.load(path))
err = np.abs(plain(tokens) - expected).max()
say(f"loaded into an unsharded model: max |diff| = {err:.1e}")
assert err < 1e-12

comm.Barrier()
if rank == 0:
    shutil.rmtree(directory)
