"""Optional (skipped without torch): the same model, parameters and plan dict under
torch's parallelize_module (gloo) and mpitensor's give the same output and the same
collectives, and the styles print the same reprs."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import mpitensor as mt  # noqa: E402
from mpitensor import nn  # noqa: E402
from mpitensor import parallel as mp  # noqa: E402
from mpitensor.debug import CommDebugMode  # noqa: E402
from torch_helpers import init_gloo  # noqa: E402

COMM = MPI.COMM_WORLD
W = COMM.Get_size()


# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")


@pytest.fixture(scope="module")
def meshes():
    from torch.distributed.device_mesh import init_device_mesh

    init_gloo()
    return mt.init_device_mesh("cpu", (W,)), init_device_mesh("cpu", (W,))


def torch_block(ref):
    """torch modules with ref's (a mpitensor TransformerBlock) names and values."""
    tnn = torch.nn
    F = torch.nn.functional

    class FF(tnn.Module):
        def __init__(self, ff):
            super().__init__()
            self.w1 = tnn.Linear(*ff.w1.weight.shape[::-1], dtype=torch.float64)
            self.w2 = tnn.Linear(*ff.w2.weight.shape[::-1], dtype=torch.float64)

        def forward(self, x):
            return self.w2(F.gelu(self.w1(x)))

    class Attn(tnn.Module):
        def __init__(self, a):
            super().__init__()
            e, self.d = a.embed_dim, a.head_dim
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
                tnn.Linear(e, e, dtype=torch.float64) for _ in range(4))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = (p(x).view(b, s, -1, self.d).transpose(1, 2)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out_proj(o.transpose(1, 2).reshape(b, s, -1))

    class Block(tnn.Module):
        def __init__(self, blk):
            super().__init__()
            e = blk.attention.embed_dim
            self.attention_norm = tnn.LayerNorm(e, dtype=torch.float64)
            self.ffn_norm = tnn.LayerNorm(e, dtype=torch.float64)
            self.attention = Attn(blk.attention)
            self.feed_forward = FF(blk.feed_forward)

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    model = Block(ref)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(ref.state_dict()[name]))
    return model


def plan(lib, sequence_parallel):
    out = lib.Shard(1) if sequence_parallel else None
    P = lib.parallel
    plan = {f"attention.{n}": P.ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
    plan["attention.out_proj"] = P.RowwiseParallel(output_layouts=out)
    plan["feed_forward.w1"] = P.ColwiseParallel()
    plan["feed_forward.w2"] = P.RowwiseParallel(output_layouts=out)
    if sequence_parallel:
        gather = P.PrepareModuleInput(input_layouts=(lib.Shard(1),),
                                      desired_input_layouts=(lib.Replicate(),))
        plan.update({"attention_norm": P.SequenceParallel(), "attention": gather,
                     "ffn_norm": P.SequenceParallel(), "feed_forward": gather})
    return plan


class TorchLib:
    from torch.distributed.tensor import Replicate, Shard
    import torch.distributed.tensor.parallel as parallel


class MtLib:
    Replicate, Shard, parallel = mt.Replicate, mt.Shard, mp


def kinds(counts):
    out = {}
    for key, n in counts.items():
        name = str(getattr(key, "__name__", key))
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            if kind in name:
                out[kind] = out.get(kind, 0) + n
    return out


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_block_matches_torch(meshes, sequence_parallel):
    from torch.distributed.tensor.debug import CommDebugMode as TorchComm

    mesh, tmesh = meshes
    # Even splits: torch's RowwiseParallel takes a local input's global width to be
    # the local width times the ranks, so an uneven hidden size fails there.
    mt.manual_seed(0)
    ref = nn.TransformerBlock(4 * W, 2 * W, hidden_dim=8 * W)
    tmodel = torch.distributed.tensor.parallel.parallelize_module(
        torch_block(ref), tmesh, plan(TorchLib, sequence_parallel))
    mt.manual_seed(0)
    model = mp.parallelize_module(nn.TransformerBlock(4 * W, 2 * W, hidden_dim=8 * W),
                                  mesh, plan(MtLib, sequence_parallel))
    x = np.random.default_rng(1).standard_normal((2, 4 * W, 4 * W))
    if sequence_parallel:
        x = mt.distribute_tensor(x, mesh, [mt.Shard(1)]).to_local()
    with CommDebugMode() as ours:
        y = model(x)
    with TorchComm() as theirs, torch.no_grad():
        ty = tmodel(torch.from_numpy(x))
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-10, atol=1e-12)
    if W > 1:
        expected = kinds(theirs.get_comm_counts())
        # A local array a SequenceParallel style receives is an even shard in both
        # (no exchange of shard sizes): the same collectives.
        assert kinds(ours.get_comm_counts()) == expected


def test_reprs_match_torch():
    from torch.distributed.tensor import Replicate as TR, Shard as TS
    import torch.distributed.tensor.parallel as tp

    pairs = [
        (mp.ColwiseParallel(input_layouts=mt.Shard(0)), tp.ColwiseParallel(input_layouts=TS(0))),
        (mp.RowwiseParallel(output_layouts=mt.Shard(1)), tp.RowwiseParallel(output_layouts=TS(1))),
        (mp.SequenceParallel(sequence_dim=0), tp.SequenceParallel(sequence_dim=0)),
        (mp.PrepareModuleInput(input_layouts=(mt.Shard(0), None),
                               desired_input_layouts=(mt.Replicate(), None)),
         tp.PrepareModuleInput(input_layouts=(TS(0), None), desired_input_layouts=(TR(), None))),
        (mp.PrepareModuleOutput(output_layouts=mt.Replicate(), desired_output_layouts=mt.Shard(0)),
         tp.PrepareModuleOutput(output_layouts=TR(), desired_output_layouts=TS(0))),
        (mp.PrepareModuleInputOutput(input_layouts=mt.Shard(1), desired_input_layouts=mt.Replicate(),
                                     output_layouts=mt.Replicate(),
                                     desired_output_layouts=mt.Shard(1)),
         tp.PrepareModuleInputOutput(input_layouts=TS(1), desired_input_layouts=TR(),
                                     output_layouts=TR(), desired_output_layouts=TS(1))),
    ]
    for ours, theirs in pairs:
        assert repr(ours) == repr(theirs)
