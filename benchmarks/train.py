#!/usr/bin/env python
"""One training step (forward, backward, AdamW) of examples/train_gpt.py's GPT,
mpitensor against torch with the same parallelism on gloo, in the same run.

Run under MPI (see benchmarks/README.md)::

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 2 .venv/bin/python \
        benchmarks/train.py [--hidden 1024 2048] [--layers 2] [--batch 2] [--seq 256]
        [--mesh 2 | 1x2 | 2x1] [--no-torch] [--profile PATH] [--param-dtype bfloat16]

The model is the example's (``train_gpt.GPT``: token and position embeddings,
pre-norm blocks with causal attention of ``hidden // head_dim`` heads (64) and a 4x GELU MLP,
LayerNorm, untied head), float32, on its character vocabulary. The mesh (default
all ranks on ``tp``) is laid out as the example does: Megatron's plan with
sequence parallelism over ``tp``, ``fully_shard`` over ``dp``. torch gets the same
model, the same plan dict with torch's styles, ``fully_shard`` over ``dp``,
``loss_parallel`` and ``torch.optim.AdamW``, starting from the same weights; the
first step's losses are compared before timing.

Variants, each repetition running every variant once in a rotating order after a
Barrier, each time the max over ranks:

* ``single``  (np > 1) the one-process model on every rank at once (a mesh over
              MPI_COMM_SELF, one core each): the time np 1 takes, under the same load;
* ``mt``      mpitensor on the mesh;
* ``torch``   torch on the same mesh over gloo, one thread per rank;
* ``mt_ckpt`` (``--checkpoint``) mpitensor with each block checkpoint_wrapper-ed
              (activation checkpointing): its time and peak memory beside ``mt``'s.

Reported per hidden size: median and [min..max] of each time, ``speedup = single /
mt`` (np 1 -> np N), ``torch / mt``, and each variant's peak memory of a step on
rank 0: the bytes of its parameters, gradients and optimizer state plus the rise
of the process's peak RSS during the step (mpitensor.debug.peak_rss_growth), with
``mt / torch``. Targets (np 2): torch/mt >= 1.0, speedup >= 1.6x, memory
within 1.2x of torch's. Writes benchmarks/results/<cpu>/train-np{N}.json.

``--param-dtype bfloat16`` (or float16) instead counts one step's collectives with
CommDebugMode, float32 beside fully_shard's ``MixedPrecisionPolicy(param_dtype=...)``:
calls and bytes each rank sends, per collective, and their ratio. The mesh then
defaults to all ranks on ``dp`` (``Nx1``), where fully_shard does all the moving.
No timing.

``--profile PATH`` instead runs ``--reps`` mpitensor steps under cProfile on every
rank (``PATH.rank{r}``) and prints rank 0's largest self times.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import os
import pstats

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor.debug import CommDebugMode, peak_rss_growth

from _common import (
    init_gloo, machine, machine_line, ratio, result_path, summary, write_result,
    time_interleaved)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TARGET_SPEEDUP, TARGET_TORCH_X, TARGET_MEMORY_X = 1.6, 1.0, 1.2

_spec = importlib.util.spec_from_file_location(
    "train_gpt", os.path.join(REPO, "examples", "train_gpt.py"))
G = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(G)


# -- mpitensor ------------------------------------------------------------------------

class MtRun:
    """The example's model and AdamW on ``mesh``; ``step()`` is one training step."""

    def __init__(self, cfg, mesh, data):
        self.cfg, self.mesh, self.data = cfg, mesh, data
        self.model = G.build(cfg, mesh)
        self.opt = G.make_optimizer(self.model, cfg)
        self.n = 0

    def step(self):
        tokens, targets = G.local_batch(self.data, self.cfg, self.n, self.mesh)
        self.n += 1
        loss = G.loss_of(self.model, tokens, targets)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss

    def state_bytes(self) -> int:
        """This rank's bytes of parameters, gradients and optimizer state."""
        total = 0
        for p in self.model.parameters():
            total += local_nbytes(p) + (local_nbytes(p.grad) if p.grad is not None else 0)
        for state in self.opt.state.values():
            total += sum(local_nbytes(v) for v in state.values())
        return total


def local_nbytes(x) -> int:
    if isinstance(x, mt.DTensor):
        return x.to_local().nbytes if x.device_mesh.get_coordinate() is not None else 0
    return getattr(x, "nbytes", 0)


# -- torch ------------------------------------------------------------------------------

def torch_gpt(torch, cfg):
    """The example's GPT in torch, with the same child names (so the same plan keys)."""
    tnn, tF = torch.nn, torch.nn.functional
    head_dim = cfg.dim // cfg.heads

    class Attention(tnn.Module):
        def __init__(self):
            super().__init__()
            d = cfg.dim
            self.q_proj, self.k_proj = tnn.Linear(d, d), tnn.Linear(d, d)
            self.v_proj, self.out_proj = tnn.Linear(d, d), tnn.Linear(d, d)

        def forward(self, x):
            b, s = x.shape[0], x.shape[1]
            # Under tensor parallelism each rank holds whole heads: their number
            # follows from the local width, as in torch's tutorial.
            q, k, v = (p(x).view(b, s, -1, head_dim).transpose(1, 2)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
            o = tF.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out_proj(o.transpose(1, 2).reshape(b, s, -1))

    class FeedForward(tnn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = tnn.Linear(cfg.dim, 4 * cfg.dim), tnn.Linear(4 * cfg.dim,
                                                                            cfg.dim)

        def forward(self, x):
            return self.w2(tF.gelu(self.w1(x)))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.ffn_norm = tnn.LayerNorm(cfg.dim), tnn.LayerNorm(cfg.dim)
            self.attention, self.feed_forward = Attention(), FeedForward()

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = tnn.Embedding(cfg.vocab, cfg.dim)
            self.pos_embeddings = tnn.Embedding(cfg.seq, cfg.dim)
            self.layers = tnn.ModuleList([Block() for _ in range(cfg.layers)])
            self.norm = tnn.LayerNorm(cfg.dim)
            self.output = tnn.Linear(cfg.dim, cfg.vocab, bias=False)

        def forward(self, tokens):
            pos = torch.arange(tokens.shape[1])[None, :]
            h = self.tok_embeddings(tokens) + self.pos_embeddings(pos)
            for layer in self.layers:
                h = layer(h)
            return self.output(self.norm(h))

    return GPT()


def torch_plan(tp_plan):
    """The example's plan dict with torch's styles of the same names and arguments."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor import parallel as tpar

    def convert(p):
        return [Shard(q.dim) if q.is_shard() else Replicate() for q in p]

    out = {}
    for key, style in tp_plan.items():
        cls = getattr(tpar, type(style).__name__)
        if type(style).__name__ == "SequenceParallel":
            out[key] = cls()
        elif type(style).__name__ == "PrepareModuleInput":
            out[key] = cls(input_layouts=tuple(convert(style.input_layouts)),
                           desired_input_layouts=tuple(convert(style.desired_input_layouts)))
        else:
            out[key] = cls(input_layouts=convert(style.input_layouts)[0],
                           output_layouts=convert(style.output_layouts)[0],
                           use_local_output=style.use_local_output)
    return out


class TorchRun:
    """The same model, plan, fully_shard and AdamW in torch over gloo."""

    def __init__(self, torch, cfg, dims, data, weights):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

        self.torch, self.cfg, self.data, self.loss_parallel = torch, cfg, data, loss_parallel
        model = torch_gpt(torch, cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(np.ascontiguousarray(weights[name])))
        names = ("tp",) if len(dims) == 1 else ("dp", "tp")
        self.mesh = init_device_mesh("cpu", dims, mesh_dim_names=names)
        model = parallelize_module(model, self.mesh["tp"], torch_plan(G.tp_plan()))
        self.dp = None
        if len(dims) == 2:
            from torch.distributed.fsdp import fully_shard

            for layer in model.layers:
                fully_shard(layer, mesh=self.mesh["dp"])
            fully_shard(model, mesh=self.mesh["dp"])
            self.dp = (self.mesh["dp"].get_local_rank(), dims[0])
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr,
                                     weight_decay=cfg.weight_decay)
        self.n = 0

    def step(self):
        torch = self.torch
        tokens, targets = self.data.batch(self.cfg.seed, self.n, self.cfg.batch, self.cfg.seq)
        self.n += 1
        if self.dp is not None:
            r, n = self.dp
            rows = self.cfg.batch // n
            tokens, targets = (a[r * rows:(r + 1) * rows] for a in (tokens, targets))
        logits = self.model(torch.from_numpy(tokens))
        with self.loss_parallel():
            loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2),
                                                     torch.from_numpy(targets))
            self.opt.zero_grad()
            loss.backward()
        self.opt.step()
        return loss

    def state_bytes(self) -> int:
        def nbytes(t):
            t = t.to_local() if hasattr(t, "to_local") else t
            return t.numel() * t.element_size()

        total = 0
        for p in self.model.parameters():
            total += nbytes(p) + (nbytes(p.grad) if p.grad is not None else 0)
        for state in self.opt.state.values():
            total += sum(nbytes(v) for v in state.values() if hasattr(v, "numel"))
        return total


# -- timing -----------------------------------------------------------------------------

def value(loss) -> float:
    with mt.no_grad():
        return float(loss.to_local())


def case(comm, cfg, dims, data, reps, torch, checkpoint=False):
    mesh = G.make_mesh(dims, comm)
    runs = {"mt": MtRun(cfg, mesh, data)}
    if checkpoint:
        ckpt = G.Config(**{**vars(cfg), "checkpoint": True})
        runs["mt_ckpt"] = MtRun(ckpt, mesh, data)
    if comm.size > 1:
        runs["single"] = MtRun(cfg, G.make_mesh((1,), MPI.COMM_SELF), data)
    if torch is not None:
        one = G.build(cfg, G.make_mesh((1,), MPI.COMM_SELF))
        with mt.no_grad():
            weights = {k: np.asarray(v.full_tensor()) for k, v in one.state_dict().items()}
        del one
        runs["torch"] = TorchRun(torch, cfg, dims, data, weights)
    # The first step of each, side by side: the same loss before any timing.
    first = {k: r.step() for k, r in runs.items()}
    losses = {k: G.global_loss(first[k], mesh) for k in ("mt", "mt_ckpt") if k in first}
    if "torch" in first:
        t = first["torch"]
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        losses["torch"] = comm.allreduce(float(t.item())) / comm.size
    if "single" in first:
        losses["single"] = value(first["single"])
    spread = max(losses.values()) - min(losses.values())
    if spread > 1e-3 * max(losses.values()):
        raise SystemExit(f"hidden {cfg.dim}: first-step losses differ: {losses}")
    memory = {}
    for k, r in runs.items():
        growth = peak_rss_growth(r.step)
        memory[k] = comm.allreduce(r.state_bytes() + growth, op=MPI.MAX)
    times = time_interleaved(comm, {k: r.step for k, r in runs.items()}, reps, warmup=1)
    row = {"hidden": cfg.dim, "heads": cfg.heads, "layers": cfg.layers, "batch": cfg.batch,
           "seq": cfg.seq, "mesh": list(dims), "first_loss": losses,
           "memory_bytes": memory, **{k: summary(v) for k, v in times.items()}}
    # The optimizer's per-step agreement (every rank steps alike: docs/reliability.md),
    # timed alone against a whole step: its share is what checking costs.
    opt = runs["mt"].opt
    agree = time_interleaved(comm, {"agree": opt._agree_on_step}, max(reps, 20), warmup=2)
    row["step_agreement"] = summary(agree["agree"])
    row["agreement_share"] = row["step_agreement"]["median"] / row["mt"]["median"]
    if "single" in times:
        row["speedup"] = ratio(times["single"], times["mt"])
    if "torch" in times:
        row["torch_over_mt"] = ratio(times["torch"], times["mt"])
        row["memory_mt_over_torch"] = memory["mt"] / memory["torch"]
    if "mt_ckpt" in times:
        row["ckpt_time_over_mt"] = ratio(times["mt_ckpt"], times["mt"])
        row["memory_ckpt_over_mt"] = memory["mt_ckpt"] / memory["mt"]
    return row


def step_bytes(comm, cfg, dims, data, param_dtype):
    """One step (after a first one) of float32 and of ``param_dtype`` counted by
    CommDebugMode: {variant: {collective: [calls, bytes sent, max over ranks]}}."""
    mesh = G.make_mesh(dims, comm)
    out = {}
    for name, low in (("float32", None), (str(param_dtype), param_dtype)):
        run = MtRun(G.Config(**{**vars(cfg), "param_dtype": low}), mesh, data)
        run.step()
        with CommDebugMode() as mode:
            run.step()
        counts, nbytes = mode.get_comm_counts(), mode.get_comm_bytes()
        out[name] = {k: [counts[k], comm.allreduce(nbytes[k], op=MPI.MAX)]
                     for k in sorted(counts)}
    return out


def print_bytes(hidden, table):
    (base, low), (a, b) = table, table.values()
    print(f"hidden {hidden:5d}: one step, bytes sent per rank (max over ranks)")
    for k in sorted(set(a) | set(b)):
        (n0, b0), (n1, b1) = a.get(k, [0, 0]), b.get(k, [0, 0])
        share = f"{b1 / b0:.3f}" if b0 else "-"
        print(f"  {k:24s} {base} {n0:3d} calls {b0:12d} B   {low} {n1:3d} calls "
              f"{b1:12d} B   {low}/{base} {share}")
    t0, t1 = sum(v[1] for v in a.values()), sum(v[1] for v in b.values())
    print(f"  {'total':24s} {base} {t0:29d} B   {low} {t1:22d} B   "
          f"{low}/{base} {t1 / t0 if t0 else float('nan'):.3f}", flush=True)


def profile(comm, cfg, dims, data, reps, path):
    """cProfile of ``reps`` mpitensor steps (after one) on every rank, written to
    ``path.rank{r}``; rank 0 prints its 25 largest self times. No torch, no timing."""
    run = MtRun(cfg, G.make_mesh(dims, comm), data)
    run.step()
    prof = cProfile.Profile()
    comm.Barrier()
    prof.enable()
    for _ in range(reps):
        run.step()
    prof.disable()
    prof.dump_stats(f"{path}.rank{comm.rank}")
    if comm.rank == 0:
        print(f"hidden {cfg.dim}: {reps} steps, rank 0 (all ranks: {path}.rank*)", flush=True)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def fmt(s, scale=1.0, unit=""):
    return (f"{s['median'] * scale:.3g}{unit} [{s['min'] * scale:.3g}.."
            f"{s['max'] * scale:.3g}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--mesh", default=None, help="N (tp) or DPxTP; default: all ranks on tp")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--checkpoint", action="store_true",
                    help="also time the model with activation checkpointing (mt_ckpt)")
    ap.add_argument("--param-dtype", default=None, choices=("bfloat16", "float16"),
                    help="instead of timing: one step's bytes, float32 beside fully_shard's "
                         "MixedPrecisionPolicy(param_dtype=...)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<cpu>/...)")
    ap.add_argument("--profile", metavar="PATH", default=None,
                    help="instead of timing: cProfile --reps mpitensor steps on each rank "
                         "into PATH.rank{r} (e.g. under perf record, one rank)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    default_mesh = f"{comm.size}x1" if args.param_dtype else str(comm.size)
    dims = G.parse_mesh(args.mesh or default_mesh)
    torch = None
    if not args.no_torch and args.profile is None and args.param_dtype is None:
        torch, _, _ = init_gloo(comm)
    data = G.CharData()
    info = machine(comm)
    if comm.rank == 0:
        print(machine_line(info), flush=True)
        print(f"GPT: {args.layers} layers, batch {args.batch} x {args.seq} tokens, float32, "
              f"mesh {dims}", flush=True)
    rows = []
    for hidden in args.hidden:
        cfg = G.Config(dim=hidden, heads=max(1, hidden // args.head_dim), layers=args.layers,
                       seq=args.seq, batch=args.batch, vocab=data.vocab, dtype=np.float32,
                       clip=0.0)
        if args.profile is not None:
            profile(comm, cfg, dims, data, args.reps, args.profile)
            continue
        if args.param_dtype is not None:
            table = step_bytes(comm, cfg, dims, data, args.param_dtype)
            rows.append({"hidden": hidden, "mesh": list(dims), "step_bytes": table})
            if comm.rank == 0:
                print_bytes(hidden, table)
            continue
        row = case(comm, cfg, dims, data, args.reps, torch, args.checkpoint)
        rows.append(row)
        if comm.rank == 0:
            mem = row["memory_bytes"]
            line = (f"hidden {hidden:5d}: mt {fmt(row['mt'], 1e3, 'ms')}"
                    f"  step agreement {fmt(row['step_agreement'], 1e6, 'us')}"
                    f" ({100 * row['agreement_share']:.2f}% of a step)")
            if "single" in row:
                line += (f"  single {fmt(row['single'], 1e3, 'ms')}"
                         f"  speedup {fmt(row['speedup'], unit='x')}")
            if "torch" in row:
                line += (f"  torch {fmt(row['torch'], 1e3, 'ms')}"
                         f"  torch/mt {fmt(row['torch_over_mt'], unit='x')}"
                         f"  memory mt {mem['mt'] / 2**20:.0f} MiB, torch "
                         f"{mem['torch'] / 2**20:.0f} MiB ({row['memory_mt_over_torch']:.2f}x)")
            if "mt_ckpt" in row:
                line += (f"  checkpointed {fmt(row['mt_ckpt'], 1e3, 'ms')}"
                         f" ({fmt(row['ckpt_time_over_mt'], unit='x')} of mt's time), memory "
                         f"{mem['mt_ckpt'] / 2**20:.0f} MiB "
                         f"({row['memory_ckpt_over_mt']:.2f}x of mt's)")
            print(line, flush=True)
    if comm.rank == 0 and args.profile is None:
        name = f"train-np{comm.size}{'' if args.mesh is None else '-' + args.mesh}"
        name += f"-{args.param_dtype}-bytes.json" if args.param_dtype else ".json"
        write_result(args.out or result_path(name), {
            "machine": info, "args": vars(args), "rows": rows,
            "targets": {"torch_over_mt": TARGET_TORCH_X, "speedup": TARGET_SPEEDUP,
                        "memory_mt_over_torch": TARGET_MEMORY_X}})


if __name__ == "__main__":
    main()
