#!/usr/bin/env python
"""mpitensor against Heat, the distributed-NumPy peer, side by side in the same processes.

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 2 .venv/bin/python \
        benchmarks/vs_heat.py [--quick]

For every operation both libraries have (table OPS) and every size (powers of 4
from 1 KiB to 64 MiB of float64 input per rank, dim 0 split), it times, interleaved
repetition by repetition, mpitensor on ``[Shard(0)]`` DTensors and Heat on
``split=0`` DNDarrays made from the same global array. Each timed call brings its
library's result to the same distribution (the one named in OPS), so neither is
timed short of an answer a user could read on every rank where it belongs. Before
timing, each result is checked against NumPy on the global array; a wrong result is
recorded, not timed away. Small sizes run a few calls back to back per repetition;
the figures are per call, the slowest rank's, with the median of the per-repetition
ratio Heat / mpitensor (above 1: mpitensor is faster).

Heat is optional (``pip install heat``, which needs torch): without it the script
says it is skipped and exits 0. torch runs one thread per rank, as every BLAS here.
Writes benchmarks/results/<cpu>/vs_heat-np{N}.json.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard

from _common import (machine, machine_line, result_path,  # benchmarks/ is sys.path[0]
                     time_interleaved, write_result)

KiB, MiB = 1024, 1024 * 1024
SIZES = [KiB * 4 ** k for k in range(9)]            # 1 KiB .. 64 MiB
QUICK_SIZES = [KiB, 64 * KiB, MiB, 16 * MiB]
MATMUL_K = 64


@dataclass
class Op:
    """One operation: its name, the distribution both results are brought to, the
    global inputs for a size, NumPy's answer, and the two libraries' calls on their
    distributed inputs (mpitensor's first; Heat's gets the heat module too)."""
    name: str
    result: str
    inputs: Callable[[int, int], list]
    numpy: Callable
    mt: Callable
    heat: Callable
    heat_replicated: tuple = ()   # which inputs Heat holds whole (split=None)


def matrix(n: int, p: int) -> tuple:
    """A global (rows, cols) shape with ``n`` elements per rank, rows split evenly:
    about square per rank, at least one column per rank (for a change of split)."""
    cols = max(p, 1 << (int(math.log2(n)) // 2))
    return (max(1, n // cols) * p, cols)


def normal(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def full(mesh, x):
    """mpitensor's result replicated on every rank (a DTensor's whole array; the
    histograms already give NumPy arrays on every rank)."""
    if isinstance(x, np.ndarray):
        return x
    return x.redistribute(mesh, [Replicate()]).to_local()


OPS = [
    Op("distribute", "Shard(0) / split=0",
       lambda n, p: [normal(matrix(n, p))], lambda g: g,
       lambda mesh, g: mt.distribute_tensor(g, mesh, [Shard(0)], src_data_rank=None),
       lambda ht, g: ht.array(g, split=0)),
    Op("S0->R", "replicated", lambda n, p: [normal(matrix(n, p))], lambda g: g,
       lambda mesh, x: full(mesh, x), lambda ht, x: ht.resplit(x, None)),
    Op("S0->S1", "Shard(1) / split=1", lambda n, p: [normal(matrix(n, p))], lambda g: g,
       lambda mesh, x: x.redistribute(mesh, [Shard(1)]), lambda ht, x: ht.resplit(x, 1)),
    Op("sum(axis=0)", "replicated", lambda n, p: [normal(matrix(n, p))],
       lambda g: g.sum(0), lambda mesh, x: full(mesh, np.sum(x, axis=0)),
       lambda ht, x: ht.sum(x, axis=0)),
    Op("var", "replicated", lambda n, p: [normal(matrix(n, p))], np.var,
       lambda mesh, x: np.var(x).full_tensor(), lambda ht, x: ht.var(x)),
    Op("a + b", "Shard(0) / split=0",
       lambda n, p: [normal(matrix(n, p)), normal(matrix(n, p), 1)], np.add,
       lambda mesh, a, b: a + b, lambda ht, a, b: a + b),
    Op(f"a @ b ({MATMUL_K} x {MATMUL_K} b)", "Shard(0) / split=0",
       lambda n, p: [normal((max(1, n // MATMUL_K) * p, MATMUL_K)),
                     normal((MATMUL_K, MATMUL_K), 1)], np.matmul,
       lambda mesh, a, b: a @ b, lambda ht, a, b: ht.matmul(a, b), heat_replicated=(1,)),
    Op("sort (1-D)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))], np.sort,
       lambda mesh, x: np.sort(x), lambda ht, x: ht.sort(x)[0]),
    Op("fft (1-D)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))], np.fft.fft,
       lambda mesh, x: np.fft.fft(x), lambda ht, x: ht.fft.fft(x)),
    Op("cumsum (1-D)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))], np.cumsum,
       lambda mesh, x: np.cumsum(x), lambda ht, x: ht.cumsum(x, 0)),
    Op("cumsum(axis=0)", "Shard(0) / split=0", lambda n, p: [normal(matrix(n, p))],
       lambda g: np.cumsum(g, 0), lambda mesh, x: np.cumsum(x, 0),
       lambda ht, x: ht.cumsum(x, 0)),
    Op("argmax(axis=0)", "replicated", lambda n, p: [normal(matrix(n, p))],
       lambda g: np.argmax(g, 0), lambda mesh, x: full(mesh, np.argmax(x, 0)),
       lambda ht, x: ht.argmax(x, 0)),
    # operations whose elements cross shard boundaries, which Heat has too
    Op("roll (1-D)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))],
       lambda g: np.roll(g, 3), lambda mesh, x: np.roll(x, 3), lambda ht, x: ht.roll(x, 3)),
    Op("diff (1-D)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))], np.diff,
       lambda mesh, x: np.diff(x), lambda ht, x: ht.diff(x)),
    Op("concatenate (1-D)", "Shard(0) / split=0",
       lambda n, p: [normal((n * p,)), normal((n * p,), 1)],
       lambda a, b: np.concatenate([a, b]), lambda mesh, a, b: np.concatenate([a, b]),
       lambda ht, a, b: ht.concatenate((a, b), axis=0)),
    Op("pad rows", "Shard(0) / split=0", lambda n, p: [normal(matrix(n, p))],
       lambda g: np.pad(g, ((1, 1), (0, 0))), lambda mesh, x: np.pad(x, ((1, 1), (0, 0))),
       lambda ht, x: ht.pad(x, ((1, 1), (0, 0)))),
    Op("unique (1-D ints)", "replicated",
       lambda n, p: [np.random.default_rng(2).integers(0, 1000, n * p).astype(np.float64)],
       np.unique, lambda mesh, x: full(mesh, np.unique(x)),
       lambda ht, x: ht.resplit(ht.unique(x, sorted=True), None)),
    # more of the functions both libraries distribute
    Op("mean", "replicated", lambda n, p: [normal(matrix(n, p))], np.mean,
       lambda mesh, x: np.mean(x).full_tensor(), lambda ht, x: ht.mean(x)),
    Op("max(axis=0)", "replicated", lambda n, p: [normal(matrix(n, p))],
       lambda g: np.max(g, axis=0), lambda mesh, x: full(mesh, np.max(x, axis=0)),
       lambda ht, x: ht.max(x, axis=0)),
    Op("exp", "Shard(0) / split=0", lambda n, p: [normal(matrix(n, p))], np.exp,
       lambda mesh, x: np.exp(x), lambda ht, x: ht.exp(x)),
    Op("where(x > 0)", "Shard(0) / split=0", lambda n, p: [normal(matrix(n, p))],
       lambda g: np.where(g > 0, g, 0.0), lambda mesh, x: np.where(x > 0, x, 0.0),
       lambda ht, x: ht.where(x > 0, x, 0.0)),
    Op("median (1-D)", "replicated", lambda n, p: [normal((n * p,))], np.median,
       lambda mesh, x: full(mesh, np.median(x)), lambda ht, x: ht.median(x)),
    Op("nonzero (1-D)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))],
       lambda g: np.flatnonzero(g > 0), lambda mesh, x: np.flatnonzero(x > 0),
       lambda ht, x: ht.nonzero(x > 0)),
    Op("bincount", "replicated",
       lambda n, p: [np.random.default_rng(3).integers(0, 100, n * p)], np.bincount,
       lambda mesh, x: full(mesh, np.bincount(x)), lambda ht, x: ht.bincount(x)),
    Op("histogram (10 bins)", "replicated", lambda n, p: [normal((n * p,))],
       lambda g: np.histogram(g, bins=10, range=(-4, 4))[0],
       lambda mesh, x: full(mesh, np.histogram(x, bins=10, range=(-4, 4))[0]),
       lambda ht, x: ht.histogram(x, bins=10, range=(-4, 4))),
    Op("cov (8 columns)", "replicated", lambda n, p: [normal((max(1, n // 8) * p, 8))],
       lambda g: np.cov(g, rowvar=False), lambda mesh, x: full(mesh, np.cov(x, rowvar=False)),
       lambda ht, x: ht.cov(x, rowvar=False)),
    Op("tril", "Shard(0) / split=0", lambda n, p: [normal(matrix(n, p))], np.tril,
       lambda mesh, x: np.tril(x), lambda ht, x: ht.tril(x)),
    Op("trace", "replicated", lambda n, p: [normal(matrix(n, p))], np.trace,
       lambda mesh, x: full(mesh, np.trace(x)), lambda ht, x: ht.trace(x)),
    Op("repeat (1-D)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))],
       lambda g: np.repeat(g, 2), lambda mesh, x: np.repeat(x, 2),
       lambda ht, x: ht.repeat(x, 2)),
    Op("flip (1-D)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))], np.flip,
       lambda mesh, x: np.flip(x), lambda ht, x: ht.flip(x)),
    Op("vstack", "Shard(0) / split=0",
       lambda n, p: [normal(matrix(n, p)), normal(matrix(n, p), 1)],
       lambda a, b: np.vstack([a, b]), lambda mesh, a, b: np.vstack([a, b]),
       lambda ht, a, b: ht.vstack((a, b))),
    Op("convolve (3 taps)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))],
       lambda g: np.convolve(g, [1.0, 2.0, 3.0], mode="same"),
       lambda mesh, x: np.convolve(x, np.array([1.0, 2.0, 3.0]), mode="same"),
       lambda ht, x: ht.convolve(x, ht.array([1.0, 2.0, 3.0]), mode="same")),
    Op("average(axis=0)", "replicated", lambda n, p: [normal(matrix(n, p))],
       lambda g: np.average(g, axis=0), lambda mesh, x: full(mesh, np.average(x, axis=0)),
       lambda ht, x: ht.average(x, axis=0)),
    Op("reshape (1-D to n x 8)", "Shard(0) / split=0", lambda n, p: [normal((n * p,))],
       lambda g: g.reshape(-1, 8), lambda mesh, x: np.reshape(x, (-1, 8)),
       lambda ht, x: ht.reshape(x, (-1, 8), new_split=0)),
]


def distribute(mesh, ht, op: Op, arrays):
    """Each library's inputs: mpitensor's cut from the global arrays without
    communication, Heat's the same way (split=0, or whole where op says)."""
    if op.name == "distribute":
        return arrays, arrays
    mts = [mt.distribute_tensor(g, mesh, [Replicate()] if i in op.heat_replicated
                                else [Shard(0)], src_data_rank=None)
           for i, g in enumerate(arrays)]
    hts = [ht.array(g, split=None if i in op.heat_replicated else 0)
           for i, g in enumerate(arrays)]
    return mts, hts


def as_global(x) -> np.ndarray:
    """A result as one global NumPy array on every rank (for the check only)."""
    if isinstance(x, mt.DTensor):
        return x.full_tensor()
    if hasattr(x, "larray"):            # a Heat DNDarray
        return np.asarray(x.numpy())
    return np.asarray(x)


def right(got: np.ndarray, want: np.ndarray) -> bool:
    want = np.asarray(want)
    if got.shape != want.shape:
        return False
    if want.dtype.kind in "iub":
        return bool(np.array_equal(got, want))
    scale = float(np.max(np.abs(want))) if want.size else 1.0
    return bool(np.allclose(got, want, rtol=1e-6, atol=1e-9 * max(scale, 1.0)))


def quartiles(values) -> dict:
    v = np.asarray(values, dtype=float)
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3),
            "min": float(v.min()), "max": float(v.max())}


def inner_calls(nbytes: int) -> int:
    return max(1, min(32, (256 * KiB) // nbytes))


def point(comm, mesh, ht, op: Op, nbytes: int, reps: int, warmup: int) -> dict:
    """Checks and times ``op`` at ``nbytes`` of input per rank. Collective."""
    arrays = op.inputs(nbytes // 8, comm.size)
    mts, hts = distribute(mesh, ht, op, arrays)
    want = op.numpy(*arrays)
    checks = {"mt": right(as_global(op.mt(mesh, *mts)), want),
              "heat": right(as_global(op.heat(ht, *hts)), want)}
    # Every rank records the same verdict: the slowest rank's view of it.
    checks = {k: bool(comm.allreduce(int(v), op=MPI.MIN)) for k, v in checks.items()}
    inner = inner_calls(nbytes)

    def repeat(fn, args):
        def run():
            for _ in range(inner):
                fn(*args)
        return run

    times = time_interleaved(comm, {"mt": repeat(op.mt, [mesh, *mts]),
                                    "heat": repeat(op.heat, [ht, *hts])}, reps, warmup)
    times = {k: [t / inner for t in v] for k, v in times.items()}
    return {"op": op.name, "result": op.result, "bytes": nbytes,
            "shapes": [list(a.shape) for a in arrays], "reps": reps, "inner": inner,
            "mt_s": quartiles(times["mt"]), "heat_s": quartiles(times["heat"]),
            "heat_over_mt": quartiles([h / m for h, m in zip(times["heat"], times["mt"])]),
            "mt_right": checks["mt"], "heat_right": checks["heat"]}


def parse_bytes(text: str) -> int:
    t = text.strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": KiB, "m": MiB, "g": 1024 * MiB}.get(t[-1:], 1)
    return int(float(t.rstrip("kmg")) * mult)


def size_text(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"sizes {', '.join(map(size_text, QUICK_SIZES))} and fewer repetitions")
    ap.add_argument("--sizes", default=None, help="e.g. 1KiB,1MiB (default 1 KiB..64 MiB)")
    ap.add_argument("--ops", default=None, help="comma-separated names from OPS")
    ap.add_argument("--reps", type=int, default=None, help="repetitions up to 1 MiB (15; quick 7)")
    ap.add_argument("--reps-large", type=int, default=None, help="above 1 MiB (7; quick 3)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<cpu>/...)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    try:
        import heat as ht
        import torch
    except Exception as e:  # not installed, or a torch/torchvision pair that fails to load
        if comm.rank == 0:
            print(f"vs_heat: skipped, heat cannot be imported here "
                  f"({type(e).__name__}: {e}; pip install heat)")
        return 0
    torch.set_num_threads(1)
    sizes = ([parse_bytes(s) for s in args.sizes.split(",")] if args.sizes
             else QUICK_SIZES if args.quick else SIZES)
    reps = args.reps or (7 if args.quick else 15)
    reps_large = args.reps_large or (3 if args.quick else 7)
    ops = OPS if args.ops is None else [o for o in OPS if o.name in args.ops.split(",")]
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    info = machine(comm)
    info["heat"] = ht.__version__
    info["torch"] = torch.__version__
    if comm.rank == 0:
        print(machine_line(info) + f"; Heat {ht.__version__}; torch {torch.__version__}")
        print(f"{'operation':<20} {'per rank':>9} {'mpitensor':>11} {'Heat':>11} "
              f"{'Heat/mt':>8} [IQR]        right (mt, Heat)")
    points = []
    for op in ops:
        for nbytes in sizes:
            p = point(comm, mesh, ht, op, nbytes, reps if nbytes <= MiB else reps_large,
                      args.warmup)
            points.append(p)
            gc.collect()
            if comm.rank == 0:
                r = p["heat_over_mt"]
                print(f"{op.name:<20} {size_text(nbytes):>9} {p['mt_s']['median'] * 1e3:>9.3f}ms "
                      f"{p['heat_s']['median'] * 1e3:>9.3f}ms {r['median']:>8.2f} "
                      f"[{r['q1']:.2f}..{r['q3']:.2f}]  {p['mt_right']}, {p['heat_right']}",
                      flush=True)
    if comm.rank == 0:
        path = args.out or result_path(f"vs_heat-np{comm.size}.json")
        write_result(path, {"machine": info, "args": vars(args), "points": points})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
