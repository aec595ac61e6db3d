#!/usr/bin/env python
"""Ring attention under context_parallel: peak memory per rank and time at np N
against the same attention on one rank, in the same run, interleaved.

Run under MPI (see benchmarks/README.md)::

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 2 .venv/bin/python \\
        benchmarks/context_parallel.py [--seq 16384] [--reps 5]

The problem: batch 1, ``--heads`` 8 heads of ``--dim`` 64, ``--seq`` tokens,
``--dtype`` float32, causal unless ``--no-causal``. Variants:

* ``np1``: ``ring_attention`` of the whole sequence on a mesh of rank 0 alone
  (what one process does); the other ranks wait without spinning;
* ``ring`` / ``gather``: ``ring_attention`` on load-balanced shards over a mesh
  of all N ranks, rotate method ``alltoall`` (nonblocking shifts) / ``allgather``.

Each repetition starts every variant at a Barrier, in an order that rotates from
one repetition to the next; a variant's time is the max over ranks. Reported:
median and [min..max] per variant, and per repetition the speed-up
``np1 / variant``. Memory: for one call of each variant, each rank's peak RSS
growth during the call (VmHWM reset first) plus its resident q/k/v shards, the
max over ranks; the ratio to np1 shows how the per-rank peak falls with N.

Writes benchmarks/results/<cpu>/context_parallel-np{N}.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor.experimental import set_rotate_method
from mpitensor.experimental import _load_balance as LB
from mpitensor.experimental._ring_attention import ring_attention

from mpitensor.debug import peak_rss_growth

from _common import machine, machine_line, result_path, write_result  # benchmarks/ is sys.path[0]

MiB = 1 << 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=16384)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default=None)
    return p.parse_args()


def quiet_barrier(comm):
    """A barrier that sleeps instead of spinning, so a waiting rank leaves its
    core to the ones working (Open MPI's blocking Barrier polls)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


class Problem:
    """The full q, k, v (rank 0 keeps them for np1) and this rank's shards."""

    def __init__(self, comm, args):
        n, rank = comm.size, comm.rank
        rng = np.random.default_rng(0)
        shape = (1, args.heads, args.seq, args.dim)
        full = [rng.standard_normal(shape).astype(args.dtype) for _ in range(3)]
        head, tail = LB.rank_segments(args.seq, n, rank)
        pick = np.r_[head[0]:head[1], tail[0]:tail[1]]
        self.shards = [np.ascontiguousarray(a[:, :, pick]) for a in full]
        self.full = full if rank == 0 else None
        self.full_bytes = 3 * full[0].nbytes
        self.shard_bytes = sum(a.nbytes for a in self.shards)
        self.causal = args.causal


def variants(comm, prob, mesh_all, mesh_one):
    """{name: (callable run on every rank, whether only rank 0 works)}."""
    def np1():
        if comm.rank != 0:
            return None
        q, k, v = prob.full
        return ring_attention(q, k, v, mesh=mesh_one, is_causal=prob.causal)

    def sharded(method):
        def f():
            set_rotate_method(method)
            q, k, v = prob.shards
            return ring_attention(q, k, v, mesh=mesh_all, is_causal=prob.causal)
        return f

    out = {"np1": (np1, True)}
    if comm.size > 1:
        out["ring"] = (sharded("alltoall"), False)
        out["gather"] = (sharded("allgather"), False)
    return out


def time_once(comm, fn, solo):
    if solo:
        quiet_barrier(comm)
    else:
        comm.Barrier()
    t0 = time.perf_counter()
    fn()
    t = time.perf_counter() - t0
    if solo:
        quiet_barrier(comm)
        return comm.bcast(t, root=0)
    return comm.allreduce(t, op=MPI.MAX)


def check(comm, prob, vs, mesh_all):
    """Every sharded variant, unsharded, equals np1's output on rank 0."""
    from mpitensor.experimental import context_parallel_unshard

    want = vs["np1"][0]()
    tol = 1e-4 if np.dtype(prob.shards[0].dtype) == np.float32 else 1e-10
    ok = True
    for name, (fn, _) in vs.items():
        if name == "np1":
            continue
        got = context_parallel_unshard(mesh_all, [fn()], [2])[0]
        if comm.rank == 0:
            ok = ok and np.allclose(got, want, rtol=tol, atol=tol)
    return comm.bcast(ok, root=0)


def memory(comm, prob, vs):
    rows = {}
    for name, (fn, solo) in vs.items():
        quiet_barrier(comm)
        growth = peak_rss_growth(fn)
        resident = (prob.full_bytes if comm.rank == 0 else 0) if solo else prob.shard_bytes
        quiet_barrier(comm)
        rows[name] = comm.allreduce(growth + resident, op=MPI.MAX)
    return rows


def timings(comm, vs, reps, warmup):
    names = list(vs)
    times = {name: [] for name in names}
    for rep in range(warmup + reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            fn, solo = vs[name]
            t = time_once(comm, fn, solo)
            if rep >= warmup:
                times[name].append(t)
    return times


def summarize(times):
    out = {}
    base = times["np1"]
    for name, ts in times.items():
        speed = [b / t for b, t in zip(base, ts)]
        out[name] = {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                     "speedup_median": statistics.median(speed),
                     "speedup_min": min(speed), "speedup_max": max(speed)}
    return out


def report(info, args, prob, ok, mem, summary):
    print(machine_line(info))
    print(f"context_parallel ring attention: seq {args.seq}, {args.heads} heads of "
          f"{args.dim}, {args.dtype}, {'causal' if args.causal else 'non-causal'}; "
          f"np {info['np']} on {info['cores']} cores ({info['cpu']})"
          f"{' OVERSUBSCRIBED' if info['np'] > info['cores'] else ''}")
    print(f"check against np1: {'ok' if ok else 'MISMATCH'}; q/k/v {prob.full_bytes / MiB:.0f} MiB "
          f"whole, {prob.shard_bytes / MiB:.0f} MiB per rank sharded")
    print(f"{'variant':<8} {'peak MiB/rank':>14} {'vs np1':>7} {'median s':>9} "
          f"{'[min..max] s':>16} {'speed-up vs np1 [min..max]':>28}")
    for name, s in summary.items():
        span = "[%.2f..%.2f]" % (s["min_s"], s["max_s"])
        print(f"{name:<8} {mem[name] / MiB:>14.0f} {mem[name] / mem['np1']:>7.2f} "
              f"{s['median_s']:>9.2f} {span:>16} "
              f"{s['speedup_median']:>10.2f} [{s['speedup_min']:.2f}..{s['speedup_max']:.2f}]")


def fixed_mmap_threshold():
    """Makes glibc serve every block above 128 KiB with its own mmap and unmap it
    when freed (no dynamic threshold), so memory freed by one variant is not still
    resident when the next one's peak growth is measured."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except OSError:
        pass


def main():
    fixed_mmap_threshold()
    args = parse_args()
    comm = MPI.COMM_WORLD
    mesh_all = mt.init_device_mesh("cpu", (comm.size,))
    mesh_one = mt.DeviceMesh("cpu", [0])
    prob = Problem(comm, args)
    vs = variants(comm, prob, mesh_all, mesh_one)
    info = machine(comm)
    ok = check(comm, prob, vs, mesh_all) if comm.size > 1 else True
    mem = memory(comm, prob, vs)
    times = timings(comm, vs, args.reps, args.warmup)
    summary = summarize(times)
    if comm.rank == 0:
        report(info, args, prob, ok, mem, summary)
        out = args.out or result_path(f"context_parallel-np{comm.size}.json")
        write_result(out, {"machine": info, "args": vars(args), "check_ok": ok,
                           "peak_bytes_per_rank": mem, "summary": summary})
    set_rotate_method("allgather")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
