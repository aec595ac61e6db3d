#!/usr/bin/env python
"""Forward time of a tensor-parallel MLP and transformer block, against the same
model unsharded, in the same run, interleaved.

Run under MPI (see benchmarks/README.md)::

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 2 .venv/bin/python \
        benchmarks/tensor_parallel.py [--hidden 1024 2048 4096] [--tokens 512] [--torch]

Models (float32, batch 1 x ``--tokens`` positions, ``hidden`` features):

* ``mlp``    FeedForward(hidden, 4*hidden), tanh-GELU; plan w1 Colwise, w2 Rowwise
* ``block``  pre-norm TransformerBlock (hidden // 64 heads, causal attention,
             LayerNorm, 4*hidden MLP); plan q/k/v Colwise, out_proj Rowwise,
             w1 Colwise, w2 Rowwise (Megatron: 2 all-reduces)

Variants, each repetition running every variant once in a rotating order after a
Barrier, each time the max over ranks:

* ``single``  the unsharded model on every rank at once (each rank one core): the
              time one process takes, under the same machine load;
* ``tp``      the model after ``parallelize_module`` over all ranks;
* ``torch``   (with --torch) torch's ``parallelize_module`` with the same plan over
              gloo, one thread per rank.

Reported per (model, hidden): median and [min..max] over repetitions of each time,
``speedup = single / tp`` and ``torch / tp``. Targets: speed-up >= 1.6x at
np 2 for hidden >= 2048; tp no slower than torch at any size.
Ours calls the BLAS mpitensor.nn chose at import (MPITENSOR_BLAS; printed first
and stored in the JSON). Writes benchmarks/results/<cpu>/tensor_parallel-np{N}[-torch].json.
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import nn
from mpitensor.nn import _kernels
from mpitensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from _common import (  # benchmarks/ is sys.path[0]
    init_gloo, machine, machine_line, ratio, result_path, summary, time_interleaved,
    write_result)

# Forward only: parameters require grad (as torch's), so nothing is to be recorded.
mt.autograd.set_grad_enabled(False)

TARGET_SPEEDUP, TARGET_TORCH_X = 1.6, 1.0


def plans(kind):
    mlp = {"w1": ColwiseParallel(), "w2": RowwiseParallel()}
    if kind == "mlp":
        return mlp
    plan = {f"attention.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")}
    plan["attention.out_proj"] = RowwiseParallel()
    plan.update({f"feed_forward.{k}": v for k, v in mlp.items()})
    return plan


def build(kind, hidden):
    mt.manual_seed(0)
    if kind == "mlp":
        return nn.FeedForward(hidden, 4 * hidden, activation="gelu_tanh", dtype=np.float32)
    return nn.TransformerBlock(hidden, max(1, hidden // 64), activation="gelu_tanh",
                               dtype=np.float32)


def torch_model(torch, kind, ref):
    """The same model in torch, with ref's parameters and the same child names."""
    tnn = torch.nn

    class FF(tnn.Module):
        def __init__(self, ff):
            super().__init__()
            self.w1 = tnn.Linear(*ff.w1.weight.shape[::-1])
            self.w2 = tnn.Linear(*ff.w2.weight.shape[::-1])

        def forward(self, x):
            return self.w2(torch.nn.functional.gelu(self.w1(x), approximate="tanh"))

    class Attn(tnn.Module):
        def __init__(self, a):
            super().__init__()
            e = a.embed_dim
            self.head_dim = a.head_dim
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
                tnn.Linear(e, e) for _ in range(4))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out_proj(o.transpose(1, 2).reshape(b, s, -1))

    class Block(tnn.Module):
        def __init__(self, blk):
            super().__init__()
            e = blk.attention.embed_dim
            self.attention_norm, self.ffn_norm = tnn.LayerNorm(e), tnn.LayerNorm(e)
            self.attention = Attn(blk.attention)
            self.feed_forward = FF(blk.feed_forward)

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    model = FF(ref) if kind == "mlp" else Block(ref)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.ascontiguousarray(ref.state_dict()[name])))
    return model


def case(comm, mesh, kind, hidden, tokens, reps, tctx):
    x = np.random.default_rng(0).standard_normal((1, tokens, hidden)).astype(np.float32)
    single = build(kind, hidden)
    tp = parallelize_module(build(kind, hidden), mesh, plans(kind))
    want, got = single(x), tp(x)
    err = float(np.abs(got - want).max() / max(1e-30, np.abs(want).max()))
    if err > 1e-4:
        raise SystemExit(f"{kind} hidden={hidden}: TP output differs from one process ({err})")
    variants = {"single": lambda: single(x), "tp": lambda: tp(x)}
    if tctx is not None:
        torch, tmesh = tctx
        from torch.distributed.tensor.parallel import (
            ColwiseParallel as TC, RowwiseParallel as TR, parallelize_module as tpm)
        tplan = {k: (TC() if isinstance(v, ColwiseParallel) else TR())
                 for k, v in plans(kind).items()}
        tmodel = tpm(torch_model(torch, kind, single), tmesh, tplan)
        tx = torch.from_numpy(x)
        with torch.no_grad():
            terr = float(np.abs(tmodel(tx).numpy() - want).max() / np.abs(want).max())
        if terr > 1e-4:
            raise SystemExit(f"{kind} hidden={hidden}: torch's output differs ({terr})")

        def run_torch():
            with torch.no_grad():
                tmodel(tx)
        variants["torch"] = run_torch
    times = time_interleaved(comm, variants, reps, warmup=1)
    row = {"model": kind, "hidden": hidden, "tokens": tokens, "rel_err": err,
           **{k: summary(v) for k, v in times.items()},
           "speedup": ratio(times["single"], times["tp"])}
    if "torch" in times:
        row["torch_over_tp"] = ratio(times["torch"], times["tp"])
    return row


def fmt(s, scale=1.0, unit=""):
    return (f"{s['median'] * scale:.3g}{unit} [{s['min'] * scale:.3g}.."
            f"{s['max'] * scale:.3g}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--models", nargs="+", default=["mlp", "block"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--torch", action="store_true")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    tctx = None
    if args.torch:
        torch, _, tmesh = init_gloo(comm)
        tctx = (torch, tmesh)
    info = machine(comm)
    if comm.rank == 0:  # which BLAS ours calls (MPITENSOR_BLAS); NumPy's is OpenBLAS
        print(machine_line(info), flush=True)
        print(f"mpitensor BLAS: {_kernels.blas_provider()}"
              f" ({_kernels._blas.library() or 'NumPy computes'})", flush=True)
    rows = []
    for kind in args.models:
        for hidden in args.hidden:
            row = case(comm, mesh, kind, hidden, args.tokens, args.reps, tctx)
            rows.append(row)
            if comm.rank == 0:
                extra = (f"  torch/tp {fmt(row['torch_over_tp'], unit='x')}"
                         if "torch_over_tp" in row else "")
                print(f"{kind:5s} hidden {hidden:5d}: single {fmt(row['single'], 1e3, 'ms')}"
                      f"  tp {fmt(row['tp'], 1e3, 'ms')}  speedup "
                      f"{fmt(row['speedup'], unit='x')}{extra}", flush=True)
    if comm.rank == 0:
        info.update(blas=_kernels.blas_provider(), blas_library=_kernels._blas.library())
        name = f"tensor_parallel-np{comm.size}{'-torch' if args.torch else ''}.json"
        write_result(result_path(name), {
            "machine": info, "args": vars(args), "rows": rows,
            "targets": {"speedup_np2_hidden_ge_2048": TARGET_SPEEDUP,
                        "torch_over_tp": TARGET_TORCH_X}})


if __name__ == "__main__":
    main()
