"""Train a small character-level GPT with tensor, sequence and data parallelism.

    python examples/train_gpt.py                          # one process
    mpiexec -n 2 python examples/train_gpt.py --mesh 2     # tensor parallel over 2
    mpiexec -n 4 python examples/train_gpt.py --mesh 2x2   # (dp, tp) = (2, 2)
    python examples/train_gpt.py --steps 300 --plot loss.png

The model is a GPT in torch.nn's shapes: token and position embeddings, pre-norm
transformer blocks (causal multi-head attention, GELU MLP, LayerNorm) and an
untied output head. It learns the text in examples/data/river_town.txt one
character at a time, with nothing to download.

The mesh is ``(tp,)`` or ``(dp, tp)``. Over ``tp`` the plan is Megatron's with
sequence parallelism, the one torch's tensor-parallel tutorial writes: heads and
MLP columns split, norms and residuals sharded on the sequence, logits sharded on
the vocabulary and never gathered (``loss_parallel``). Over ``dp`` every block and
then the whole model is ``fully_shard``-ed: each rank keeps 1/dp of every
parameter and of its AdamW state, and each data-parallel group trains on its share
of the batch. The batches depend only on the seed and the step, so every mesh
trains on the same data and, in float64, follows the same loss curve as one
process.

``--save-at K --ckpt DIR`` saves the model, the optimizer and the generator's
state after step K; ``--resume DIR`` continues from there, on any mesh.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, nn
from mpitensor.checkpoint.state_dict import get_state_dict, set_state_dict
from mpitensor.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from mpitensor.nn import functional as F
from mpitensor.parallel import (
    ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
    loss_parallel, parallelize_module)
from mpitensor.utils.checkpoint import checkpoint_wrapper

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "river_town.txt")


# -- data ----------------------------------------------------------------------------

class CharData:
    """The text as integer ids of its characters, with the vocabulary sorted."""

    def __init__(self, path=DATA):
        with open(path, encoding="utf-8") as f:
            self.text = f.read()
        self.chars = sorted(set(self.text))
        index = {c: i for i, c in enumerate(self.chars)}
        self.ids = np.array([index[c] for c in self.text], np.int64)

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def unigram_loss(self) -> float:
        """The cross entropy (nats) of predicting every character by its frequency
        alone: what a model that ignores the context achieves at best."""
        p = np.bincount(self.ids, minlength=self.vocab) / self.ids.size
        p = p[p > 0]
        return float(-(p * np.log(p)).sum())

    def batch(self, seed: int, step: int, batch: int, seq: int):
        """(tokens, targets) of shape (batch, seq): windows at offsets drawn from
        (seed, step) alone, so a resumed run and any mesh see the same batches."""
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, self.ids.size - seq - 1, size=batch)
        rows = starts[:, None] + np.arange(seq + 1)
        window = self.ids[rows]
        return window[:, :-1], window[:, 1:]


# -- model ---------------------------------------------------------------------------

class GPT(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq, dropout=0.0, dtype=np.float64):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim, dtype=dtype)
        self.pos_embeddings = nn.Embedding(seq, dim, dtype=dtype)
        self.layers = nn.ModuleList([nn.TransformerBlock(dim, heads, dropout=dropout,
                                                         dtype=dtype)
                                     for _ in range(layers)])
        self.norm = nn.LayerNorm(dim, dtype=dtype)
        self.output = nn.Linear(dim, vocab, bias=False, dtype=dtype)
        with mt.no_grad():  # GPT-2's scale: small embeddings keep early logits flat
            for emb in (self.tok_embeddings, self.pos_embeddings):
                emb.weight *= 0.02

    def forward(self, tokens):
        seq = tokens.shape[-1]
        h = self.tok_embeddings(tokens) + self.pos_embeddings(np.arange(seq)[None, :])
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def tp_plan():
    """Megatron's plan with sequence parallelism, as torch's tutorial writes it:
    activations between blocks are sharded on the sequence (dim 1). The outputs stay
    DTensors (``use_local_output=False``) so that the residual stream keeps its global
    shape when the sequence splits unevenly (a local array would be taken for an
    even shard)."""
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    layer = {
        "attention_norm": SequenceParallel(),
        "attention": gather,
        "attention.q_proj": ColwiseParallel(),
        "attention.k_proj": ColwiseParallel(),
        "attention.v_proj": ColwiseParallel(),
        "attention.out_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "ffn_norm": SequenceParallel(),
        "feed_forward": gather,
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }
    plan = {f"layers.*.{k}": v for k, v in layer.items()}
    plan.update({
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                          use_local_output=False),
        "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                          use_local_output=False),
        "norm": SequenceParallel(),
        # The logits stay sharded on the vocabulary: loss_parallel never gathers them.
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                  use_local_output=False),
    })
    return plan


def parse_mesh(text: str):
    """"N" is a (tp,) mesh; "DxT" a (dp, tp) mesh."""
    dims = tuple(int(s) for s in text.lower().split("x"))
    if not 1 <= len(dims) <= 2 or min(dims) < 1:
        raise ValueError(f"--mesh takes N or DPxTP (e.g. 4 or 2x2), got {text!r}")
    return dims


def make_mesh(dims, comm=MPI.COMM_WORLD):
    """The mesh of ``dims`` over the ranks of ``comm`` (all of them)."""
    if math.prod(dims) != comm.size:
        raise ValueError(f"mesh {dims} needs {math.prod(dims)} ranks, have {comm.size}")
    names = ("tp",) if len(dims) == 1 else ("dp", "tp")
    return mt.init_device_mesh("cpu", dims, mesh_dim_names=names, comm=comm)


def build(cfg, mesh):
    """The model, seeded, laid out on ``mesh``: the TP plan over ``tp``, then
    ``fully_shard`` over ``dp`` (each block, then the root, as torch's FSDP2 does);
    with ``cfg.checkpoint`` each block is checkpoint_wrapper-ed between the two.
    With ``cfg.param_dtype`` the groups are gathered and computed in it (the root's
    logits cast back to ``cfg.dtype``), as torch's MixedPrecisionPolicy."""
    mt.manual_seed(cfg.seed)
    model = GPT(cfg.vocab, cfg.dim, cfg.heads, cfg.layers, cfg.seq, cfg.dropout, cfg.dtype)
    tp_mesh = mesh["tp"]
    model = parallelize_module(model, tp_mesh, tp_plan())
    if cfg.checkpoint:  # after TP, before FSDP, as torch's scripts order them
        for i, layer in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(layer)
    if "dp" in (mesh.mesh_dim_names or ()):
        inner = MixedPrecisionPolicy(param_dtype=cfg.param_dtype)
        root = MixedPrecisionPolicy(param_dtype=cfg.param_dtype,
                                    output_dtype=None if cfg.param_dtype is None else cfg.dtype)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh["dp"], mp_policy=inner)
        fully_shard(model, mesh=mesh["dp"], mp_policy=root)
    return model


def dp_rank_and_size(mesh):
    """This rank's data-parallel group and the number of groups."""
    if "dp" not in (mesh.mesh_dim_names or ()):
        return 0, 1
    return mesh.get_local_rank("dp"), mesh.size(0)


def loss_of(model, tokens, targets):
    """The mean cross entropy of the next character, logits sharded on the vocabulary."""
    logits = model(tokens)  # (batch, seq, vocab): Shard(-1) over tp
    with loss_parallel():
        return F.cross_entropy(np.moveaxis(logits, -1, 1), targets)


def local_batch(data, cfg, step, mesh):
    """This data-parallel group's rows of the step's global batch."""
    tokens, targets = data.batch(cfg.seed, step, cfg.batch, cfg.seq)
    r, n = dp_rank_and_size(mesh)
    rows = cfg.batch // n
    return tokens[r * rows:(r + 1) * rows], targets[r * rows:(r + 1) * rows]


def global_loss(loss, mesh) -> float:
    """The loss of the whole batch: the mean over data-parallel groups (a Replicate
    DTensor over tp, so every rank holds its group's value)."""
    value = float(loss.detach().to_local())
    _, n = dp_rank_and_size(mesh)
    if n == 1:
        return value
    return mesh.get_group("dp").allreduce(value) / n


class Config:
    """Sizes and hyper-parameters; the defaults train in well under a minute."""

    def __init__(self, **kw):
        self.dim, self.heads, self.layers, self.seq, self.batch = 96, 12, 2, 64, 16
        self.lr, self.weight_decay, self.seed, self.clip = 3e-3, 0.01, 0, 1.0
        self.dropout = 0.0
        self.dtype, self.vocab = np.float32, 0
        self.param_dtype = None  # fully_shard's MixedPrecisionPolicy (e.g. "bfloat16")
        self.checkpoint = False  # recompute each block's activations in backward
        self.accumulate = 1  # micro-batches per step, reduced once
        self.schedule, self.warmup = "constant", 0  # the learning rate's schedule
        for k, v in kw.items():
            if not hasattr(self, k):
                raise TypeError(f"Config has no {k!r}")
            setattr(self, k, v)


def make_optimizer(model, cfg):
    return mt.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def make_scheduler(opt, cfg, steps):
    """None for a constant rate; for "cosine", a linear warmup over ``cfg.warmup``
    steps, then a cosine decay to a tenth of the rate, as torch scripts chain them."""
    if cfg.schedule == "constant":
        return None
    sched = mt.optim.lr_scheduler
    decay = sched.CosineAnnealingLR(opt, T_max=max(steps - cfg.warmup, 1),
                                    eta_min=cfg.lr / 10)
    if not cfg.warmup:
        return decay
    warm = sched.LinearLR(opt, start_factor=1.0 / cfg.warmup, total_iters=cfg.warmup)
    return sched.SequentialLR(opt, [warm, decay], milestones=[cfg.warmup])


def train_steps(model, opt, data, cfg, mesh, start, stop, on_step=None, sched=None):
    """Steps ``start .. stop-1``; returns the loss of each (global, before its update).
    With ``cfg.accumulate`` k, each step's batch runs as k micro-batches whose
    gradients add up, reduced over dp once (set_requires_gradient_sync)."""
    losses = []
    k = cfg.accumulate
    for step in range(start, stop):
        tokens, targets = local_batch(data, cfg, step, mesh)
        opt.zero_grad()
        rows, total = len(tokens) // k, 0.0
        for i in range(k):
            if isinstance(model, FSDPModule):
                model.set_requires_gradient_sync(i == k - 1)
            part = slice(i * rows, (i + 1) * rows)
            loss = loss_of(model, tokens[part], targets[part])
            (loss if k == 1 else loss / k).backward()
            total += global_loss(loss, mesh)
        if cfg.clip:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(total / k)
        if on_step is not None:
            on_step(step, losses[-1])
    return losses


def save(path, model, opt, step, mesh, sched=None):
    """Model and optimizer (torch's distributed state dicts: keys by parameter name,
    so a run with or without --checkpoint resumes either way), the scheduler, the
    generator's state (dropout's next masks) and the step reached, as one
    checkpoint directory. Collective."""
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "rng": mt.get_rng_state(),
             "step": np.array(step)}
    if sched is not None:
        state["sched"] = sched.state_dict()
    mt.save(state, path, device_mesh=mesh)


def load(path, model, opt, mesh, sched=None) -> int:
    """Loads what :func:`save` wrote into ``model``, ``opt`` and ``sched``, whatever
    mesh saved it; returns the step to continue from. Collective."""
    state = mt.load(path, device_mesh=mesh)
    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    if sched is not None and "sched" in state:
        sched.load_state_dict(state["sched"])
    mt.set_rng_state(state["rng"])
    return int(state["step"])


# -- the command line ----------------------------------------------------------------

class Progress:
    """A one-line progress bar on rank 0, with the loss every ``every`` steps. When
    the output is not a terminal (a log file), only those lines, as tqdm does.
    Under mpiexec too: Open MPI gives the ranks a terminal for stdout even when
    mpiexec writes to a file, so isatty() cannot tell there."""

    def __init__(self, total, every, first, rank):
        self.total, self.every, self.first, self.rank = total, every, first, rank
        self.t0 = time.perf_counter()
        launched = any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"))
        self.tty = sys.stdout.isatty() and not launched

    def __call__(self, step, loss):
        if self.rank:
            return
        done = step + 1
        width = 30
        fill = int(width * done / self.total)
        bar = "#" * fill + "." * (width - fill)
        rate = (done - self.first) / max(time.perf_counter() - self.t0, 1e-9)
        line = f"step {done:5d}/{self.total} [{bar}] loss {loss:.4f}  {rate:5.1f} steps/s"
        if done % self.every == 0 or done == self.total:
            print("\r" + line if self.tty else line, flush=True)
        elif self.tty:
            print("\r" + line, end="", flush=True)


def main(argv=None):
    """The command line; returns the losses of the steps it ran."""
    comm = MPI.COMM_WORLD
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mesh", default=str(comm.size),
                   help="N for a (tp,) mesh, DPxTP for (dp, tp); default: all ranks on tp")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--dim", type=int, default=96)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-every", type=int, default=25)
    p.add_argument("--save-at", type=int, default=None, help="save a checkpoint after this step")
    p.add_argument("--ckpt", default="gpt_ckpt", help="checkpoint directory (--save-at, --resume)")
    p.add_argument("--resume", default=None, metavar="DIR", help="continue from a checkpoint")
    p.add_argument("--plot", default=None, metavar="PNG", help="write the loss curve")
    p.add_argument("--schedule", default="constant", choices=("constant", "cosine"),
                   help="the learning rate: constant, or warmup then cosine decay")
    p.add_argument("--warmup", type=int, default=0, help="warmup steps of --schedule cosine")
    p.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing: recompute each block in backward")
    p.add_argument("--accumulate", type=int, default=1, metavar="K",
                   help="micro-batches per step, their gradients reduced once")
    args = p.parse_args(argv)

    data = CharData()
    cfg = Config(dim=args.dim, heads=args.heads, layers=args.layers, seq=args.seq,
                 batch=args.batch, lr=args.lr, seed=args.seed, dropout=args.dropout,
                 vocab=data.vocab, checkpoint=args.checkpoint, accumulate=args.accumulate,
                 schedule=args.schedule, warmup=args.warmup,
                 dtype=np.dtype(args.dtype).type)
    dims = parse_mesh(args.mesh)
    mesh = make_mesh(dims, comm)
    if cfg.batch % (dp_rank_and_size(mesh)[1] * cfg.accumulate):
        raise SystemExit(f"--batch {cfg.batch} must split evenly over dp {dims[0]} and "
                         f"--accumulate {cfg.accumulate}")
    model = build(cfg, mesh)
    opt = make_optimizer(model, cfg)
    sched = make_scheduler(opt, cfg, args.steps)
    start = load(args.resume, model, opt, mesh, sched) if args.resume else 0
    if args.save_at is not None and not start < args.save_at <= args.steps:
        raise SystemExit(f"--save-at {args.save_at} must lie after the first step ({start}) "
                         f"and at most --steps {args.steps}")
    rank = comm.rank
    if rank == 0:
        nparams = sum(int(np.prod(q.shape)) for q in model.parameters())
        print(f"{len(data.text)} characters, vocabulary {data.vocab}; model {nparams} "
              f"parameters, {args.dtype}; mesh {dims} "
              f"({'dp, tp' if len(dims) == 2 else 'tp'}) on {comm.size} rank(s)")
        print(f"unigram baseline (character frequencies alone): {data.unigram_loss():.4f}; "
              f"uniform guess: {math.log(data.vocab):.4f}")
        if start:
            print(f"resumed at step {start} from {args.resume}")
    progress = Progress(args.steps, args.print_every, start, rank)
    losses = []
    stop = args.steps if args.save_at is None else args.save_at
    losses += train_steps(model, opt, data, cfg, mesh, start, stop, progress, sched)
    if args.save_at is not None:
        save(args.ckpt, model, opt, stop, mesh, sched)
        if rank == 0:
            print(f"saved step {stop} to {args.ckpt}")
        losses += train_steps(model, opt, data, cfg, mesh, stop, args.steps, progress, sched)
    if rank == 0 and losses:
        print(f"final loss {losses[-1]:.4f} (unigram baseline {data.unigram_loss():.4f})")
        if args.plot:
            plot(args.plot, range(start + 1, start + len(losses) + 1), losses,
                 data.unigram_loss())
    return losses


def plot(path, steps, losses, baseline):
    try:
        import matplotlib
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed; no plot written")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(list(steps), losses, label="training loss")
    ax.axhline(baseline, color="grey", linestyle="--", label="unigram baseline")
    ax.set_xlabel("step")
    ax.set_ylabel("cross entropy (nats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
