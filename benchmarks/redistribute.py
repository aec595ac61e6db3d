#!/usr/bin/env python
"""mpitensor ``DTensor.redistribute`` against the raw MPI collective, in the same run.

Run under MPI (see benchmarks/README.md)::

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 2 .venv/bin/python \
        benchmarks/redistribute.py [--max-bytes 64MiB] [--torch] [--profile]

For every transition on a 1-D mesh over all ranks and every size (powers of 4 from
1 KiB to --max-bytes of *local input* per rank, float64 2-D arrays of up to 512
columns) it times, interleaved repetition by repetition:

* ``mt``     mpitensor: ``dt.redistribute(mesh, [dst])`` (a new DTensor each call);
* ``raw``    the mpi4py collective that moves the same bytes between preallocated
             contiguous buffers (Allgather, Allreduce, Reduce_scatter_block, Alltoall;
             for Replicate->Shard, which communicates nothing, a memcpy of the chunk);
* ``np_a2a`` for Shard(0)->Shard(1) only: NumPy pack (np.ascontiguousarray of the
             column blocks) + MPI Alltoall into a new array + unpack (a reshape: the
             blocks arrive in the target's row order);
* ``torch``  with --torch: torch DTensor on gloo, ``redistribute`` of the same data.

Each repetition of each variant is preceded by a barrier and its time is the max over
ranks; the order of the variants rotates from one repetition to the next. Small sizes
run a few calls back to back per repetition (``inner``) so that one timing is well
above the timer's and the barrier's jitter; the figures are per call.

It prints a table of medians, mt/raw ratios and their [min..max] over repetitions,
the overhead at the smallest size, the peak memory of one large redistribute of each
transition, and writes benchmarks/results/<cpu>/redistribute-np{N}.json and .png.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import peak_rss_growth

from _common import (result_path, init_gloo, machine,  # benchmarks/ is sys.path[0]
                     machine_line, page_aligned, write_result)

KiB, MiB = 1024, 1024 * 1024
COLS = 512

# The goals of redistribute's speed, written here only: --goals (make bench-check) gives each point
# a goal covers PASS or FAIL (at np 2; at other np against the committed run,
# watch_verdicts), the points record them as their targets and the plot draws the
# ratio limits. (name, transitions, from bytes/rank, up to bytes/rank,
# the point's summary key, its limit, what the key is)
DIM0 = ("S0->R", "P->R", "P->S0", "R->S0")
INNER = ("S1->R", "P->S1")
GOALS = [
    ("dim-0 at >= 1 MiB", DIM0, MiB, None, "ratio", 1.10, "mt/raw"),
    ("dim-0 at 1 KiB", DIM0, None, KiB, "overhead_us", 3.0, "mt - raw, us"),
    ("inner dims at >= 1 MiB", INNER, MiB, None, "ratio", 1.25, "mt/raw"),
    ("S(i)->S(j) at >= 1 MiB", ("S0->S1",), MiB, None, "ratio", 1.30, "mt/raw Alltoall"),
    ("S(i)->S(j) vs NumPy", ("S0->S1",), None, None, "ratio_vs_np_a2a", 1.0,
     "mt/(NumPy pack + Alltoall + unpack)"),
]


# The memory goal, checked when the run measures peak memory (measure_memory): the
# growth of one redistribute within its output and one output-sized staging buffer.
MEMORY_GOAL = ("peak memory", "growth <= output + one output-sized staging buffer")


def goal_text(name: str) -> str:
    """The goals that cover transition `name`, as one line."""
    return "; ".join(f"{g[0]}: {g[6]} <= {g[5]:g}" for g in GOALS if name in g[1])


# name, source placement, target placement, raw collective
TRANSITIONS = [(name, src, dst, raw, goal_text(name)) for name, src, dst, raw in [
    ("S0->R", "S0", "R", "Allgather"),
    ("S1->R", "S1", "R", "Allgather"),
    ("P->R", "P", "R", "Allreduce"),
    ("P->S0", "P", "S0", "Reduce_scatter_block"),
    ("P->S1", "P", "S1", "Reduce_scatter_block"),
    ("S0->S1", "S0", "S1", "Alltoall"),
    ("R->S0", "R", "S0", "memcpy of the chunk"),
]]


def parse_bytes(text: str) -> int:
    t = text.strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": KiB, "m": MiB, "g": 1024 * MiB}.get(t[-1:], 1)
    return int(float(t.rstrip("kmg")) * mult)


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1024 * MiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def mt_placement(code: str):
    return {"S0": Shard(0), "S1": Shard(1), "R": Replicate(), "P": Partial("sum")}[code]


def shapes(name: str, nbytes: int, n: int):
    """(local input shape, global shape) with nbytes of float64 local input per rank."""
    e = nbytes // 8
    if name in ("S0->R", "S0->S1"):
        c = min(COLS, e)
        r = e // c
        return (r, c), (n * r, c)
    if name == "S1->R":
        c = min(COLS // n, e)
        r = e // c
        return (r, c), (r, n * c)
    if name in ("P->R", "P->S1"):
        c = min(COLS, e)
        return (e // c, c), (e // c, c)
    if name in ("P->S0", "R->S0"):
        c = min(COLS, e // n)
        return (e // c, c), (e // c, c)
    raise ValueError(name)


def output_shape(name: str, gshape, n: int):
    r, c = gshape
    return {"S0->R": (r, c), "S1->R": (r, c), "P->R": (r, c), "P->S0": (r // n, c),
            "P->S1": (r, c // n), "S0->S1": (r, c // n), "R->S0": (r // n, c)}[name]


# ---- the variants ---------------------------------------------------------------------


class Case:
    """All buffers and callables of one (transition, size) point on this rank."""

    def __init__(self, name, src, dst, nbytes, comm, mesh, tctx=None):
        n, rank = comm.size, comm.rank
        self.name, self.n, self.comm = name, n, comm
        lshape, gshape = shapes(name, nbytes, n)
        self.lshape, self.gshape = lshape, gshape
        self.oshape = output_shape(name, gshape, n)
        rng = np.random.default_rng(1234 + rank)
        # Every buffer starts on a page (page_aligned says why): the input that
        # mpitensor and the raw call share, and the raw call's output.
        local = page_aligned(lshape)
        if src == "R":  # a replica must be the same on every rank
            local[...] = np.random.default_rng(1234).standard_normal(lshape)
        else:
            local[...] = rng.standard_normal(lshape)
        self.local = local
        self.bytes = local.nbytes
        self.dst_pl = [mt_placement(dst)]
        self.mesh = mesh
        self.dt = mt.DTensor.from_local(local, mesh, [mt_placement(src)],
                                        shape=gshape, stride=(gshape[1], 1))
        e = local.size
        send = local.reshape(-1)
        self.variants = {"mt": self.run_mt}
        if name in ("S0->R", "S1->R"):
            recv = page_aligned(n * e)
            self.raw = lambda: comm.Allgather([send, MPI.DOUBLE], [recv, MPI.DOUBLE])
        elif name == "P->R":
            recv = page_aligned(e)
            self.raw = lambda: comm.Allreduce([send, MPI.DOUBLE], [recv, MPI.DOUBLE], MPI.SUM)
        elif name in ("P->S0", "P->S1"):
            recv = page_aligned(e // n)
            self.raw = lambda: comm.Reduce_scatter_block([send, MPI.DOUBLE],
                                                         [recv, MPI.DOUBLE], MPI.SUM)
        elif name == "S0->S1":
            recv = page_aligned(e)
            self.raw = lambda: comm.Alltoall([send, MPI.DOUBLE], [recv, MPI.DOUBLE])
            self.variants["np_a2a"] = self.run_np_a2a
        elif name == "R->S0":
            rows = gshape[0] // n
            chunk = local[rank * rows:(rank + 1) * rows]
            recv = page_aligned(chunk.shape)
            self.raw = lambda: np.copyto(recv, chunk)
        recv.fill(0.0)  # preallocated means resident: no first-touch page faults inside
        self.recv = recv
        self.variants["raw"] = self.raw
        if tctx is not None and nbytes <= tctx.max_bytes:
            self.torch_setup(tctx, src, dst)

    def run_mt(self):
        return self.dt.redistribute(self.mesh, self.dst_pl)

    def run_np_a2a(self):
        r, c = self.lshape
        n = self.n
        packed = np.ascontiguousarray(self.local.reshape(r, n, c // n).transpose(1, 0, 2))
        out = np.empty_like(packed)
        self.comm.Alltoall([packed, MPI.DOUBLE], [out, MPI.DOUBLE])
        return out.reshape(n * r, c // n)  # rank k's block is rows k*r..: no copy

    def torch_setup(self, tctx, src, dst):
        import torch
        from torch.distributed.tensor import DTensor as TDTensor

        tl = torch.from_numpy(self.local)
        self.tdt = TDTensor.from_local(tl, tctx.mesh, [tctx.placement(src)], run_check=False,
                                       shape=torch.Size(self.gshape),
                                       stride=(self.gshape[1], 1))
        self.tdst = [tctx.placement(dst)]
        self.tmesh = tctx.mesh
        self.twait = tctx.wait
        self.variants["torch"] = self.run_torch

    def run_torch(self):
        return self.twait(self.tdt.redistribute(self.tmesh, self.tdst).to_local())

    # -- a check that every variant computes the same thing ------------------------------
    def expected(self):
        """This rank's target local array, from the raw collective's result."""
        n, r, c = self.n, self.lshape[0], self.lshape[1]
        self.raw()
        recv = self.recv
        if self.name == "S0->R":
            return recv.reshape(self.oshape)
        if self.name == "S1->R":
            return recv.reshape(n, r, c).transpose(1, 0, 2).reshape(self.oshape)
        if self.name in ("P->R", "P->S0", "R->S0"):
            return recv.reshape(self.oshape)
        if self.name == "P->S1":
            # Reduce_scatter_block hands out contiguous slabs; the Shard(1) target is a
            # column block: reduce the packed column blocks to compare.
            packed = np.ascontiguousarray(self.local.reshape(r, n, c // n).transpose(1, 0, 2))
            out = np.empty(packed.size // n)
            self.comm.Reduce_scatter_block([packed, MPI.DOUBLE], [out, MPI.DOUBLE], MPI.SUM)
            return out.reshape(self.oshape)
        if self.name == "S0->S1":
            return self.run_np_a2a()
        raise ValueError(self.name)

    def check(self):
        want = self.expected()
        got = self.run_mt().to_local()
        ok = got.shape == want.shape and np.allclose(got, want, rtol=1e-12, atol=1e-12)
        if "np_a2a" in self.variants:
            ok = ok and np.array_equal(self.run_np_a2a(), want)
        if "torch" in self.variants:
            t = self.run_torch().numpy()
            ok = ok and t.shape == want.shape and np.allclose(t, want, rtol=1e-12, atol=1e-12)
        return ok


class TorchCtx:
    """torch.distributed on gloo over loopback, ranks and world size from MPI."""

    def __init__(self, comm, max_bytes):
        self.torch, self.dist, self.mesh = init_gloo(comm)
        from torch.distributed.tensor import Partial as TP, Replicate as TR, Shard as TS
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
        self.max_bytes = max_bytes
        self.version = self.torch.__version__
        self._pl = {"S0": TS(0), "S1": TS(1), "R": TR(), "P": TP("sum")}
        act = AsyncCollectiveTensor

        def wait(t):
            return t.wait() if isinstance(t, act) else t

        self.wait = wait

    def placement(self, code):
        return self._pl[code]

    def close(self):
        self.dist.destroy_process_group()


# ---- timing -------------------------------------------------------------------------------


def inner_calls(nbytes: int) -> int:
    return max(1, min(32, (256 * KiB) // nbytes))


def reps_for(nbytes: int, args) -> int:
    if nbytes <= MiB:
        return args.reps
    if nbytes <= 16 * MiB:
        return args.reps_large
    return args.reps_huge


def _machine_busy_ticks() -> int:
    """Busy clock ticks of all CPUs, steal (time the hypervisor gave away) included."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system irq softirq steal


def _own_ticks() -> int:
    with open("/proc/self/stat") as f:
        v = f.read().rsplit(")", 1)[1].split()
    return int(v[11]) + int(v[12])  # utime, stime of all threads


def foreign_load(comm, fn):
    """Runs fn(); returns (its result, CPUs' worth of work done meanwhile by processes
    other than this job's ranks). On a 2-core machine shared with other jobs this is
    how a noisy measurement shows itself."""
    comm.Barrier()
    busy0, own0, t0 = _machine_busy_ticks(), _own_ticks(), time.perf_counter()
    result = fn()
    comm.Barrier()
    busy1, own1, t1 = _machine_busy_ticks(), _own_ticks(), time.perf_counter()
    own = comm.allreduce(own1 - own0, MPI.SUM)
    busy = comm.bcast(busy1 - busy0)
    tick = os.sysconf("SC_CLK_TCK")
    return result, max(0.0, (busy - own) / tick / max(t1 - t0, 1e-9))


def time_point_quiet(case: Case, reps: int, inner: int, warmup: int, retries: int,
                     max_foreign: float):
    """time_point, repeated (up to `retries` more times) while other processes used
    more than `max_foreign` CPUs during it; keeps the quietest attempt."""
    best = None
    for attempt in range(retries + 1):
        times, foreign = foreign_load(case.comm,
                                      lambda: time_point(case, reps, inner, warmup))
        if best is None or foreign < best[1]:
            best = (times, foreign, attempt + 1)
        if foreign <= max_foreign:
            break
    return best


def time_point(case: Case, reps: int, inner: int, warmup: int) -> dict:
    comm = case.comm
    names = list(case.variants)
    for _ in range(warmup):
        for v in names:
            for _ in range(inner):
                case.variants[v]()
    local = {v: np.zeros(reps) for v in names}
    gc.collect()
    gc.disable()
    try:
        for i in range(reps):
            k = i % len(names)
            for v in names[k:] + names[:k]:  # rotate the order every repetition
                fn = case.variants[v]
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                local[v][i] = (time.perf_counter() - t0) / inner
    finally:
        gc.enable()
    out = {}
    for v in names:
        glob = np.empty(reps)
        comm.Allreduce(local[v], glob, MPI.MAX)
        out[v] = glob.tolist()
    return out


def summarize(times: dict) -> dict:
    s = {}
    raw = np.array(times["raw"])
    for v, t in times.items():
        t = np.array(t)
        s[v] = {"median_us": float(np.median(t) * 1e6), "min_us": float(t.min() * 1e6),
                "max_us": float(t.max() * 1e6)}
    mtt = np.array(times["mt"])
    per = mtt / raw
    s["ratio"] = float(np.median(mtt) / np.median(raw))
    s["ratio_min"], s["ratio_max"] = float(per.min()), float(per.max())
    s["ratio_median_of_reps"] = float(np.median(per))
    s["ratio_p25"], s["ratio_p75"] = (float(x) for x in np.percentile(per, [25, 75]))
    s["overhead_us"] = float((np.median(mtt) - np.median(raw)) * 1e6)
    if "np_a2a" in times:
        per = mtt / np.array(times["np_a2a"])
        s["ratio_vs_np_a2a"] = float(np.median(mtt) / np.median(times["np_a2a"]))
        s["ratio_vs_np_a2a_min"], s["ratio_vs_np_a2a_max"] = float(per.min()), float(per.max())
    if "torch" in times:
        per = np.array(times["torch"]) / mtt
        s["torch_over_mt"] = float(np.median(times["torch"]) / np.median(mtt))
        s["torch_over_mt_min"], s["torch_over_mt_max"] = float(per.min()), float(per.max())
    return s


# ---- peak memory ------------------------------------------------------------------------


def measure_memory(comm, mesh, nbytes, tctx, names):
    rows = []
    for name, src, dst, _, _ in TRANSITIONS:
        if name not in names:
            continue
        case = Case(name, src, dst, nbytes, comm, mesh,
                    tctx if tctx is not None and nbytes <= tctx.max_bytes else None)
        out_bytes = int(np.prod(case.oshape)) * 8
        row = {"transition": name, "bytes": case.bytes, "output_bytes": out_bytes}
        variants = dict(case.variants)
        sc = same_call(case)
        if sc is not None and name.startswith("P->"):  # MPI's own buffers differ
            variants["same_call"] = sc
        for v in ("mt", "raw", "same_call", "torch"):
            if v not in variants:
                continue
            comm.Barrier()
            g = peak_rss_growth(variants[v])
            row[v + "_growth_bytes"] = comm.allreduce(g, MPI.MAX)
        row["limit_bytes"] = 2 * out_bytes
        row["mt_within_limit"] = row["mt_growth_bytes"] <= 2 * out_bytes * 1.02 + MiB
        rows.append(row)
        del case
        gc.collect()
    return rows


# ---- profile: where the time goes -------------------------------------------------------


class Emulation:
    """NumPy + mpi4py re-implementations of what the C executor does for each step,
    so the C call can be compared with the same work done from Python:
    allocate the output (and a staging buffer where the executor stages), one MPI
    call, unpack. S0->S1 uses MPI_Alltoallw with subarray types made per call, as
    the executor does."""

    def __init__(self, case: Case):
        self.c = case
        n, (r, c) = case.n, case.lshape
        comm, local = case.comm, case.local
        send = local.reshape(-1)
        oshape = case.oshape
        D = MPI.DOUBLE
        name = case.name
        if name == "S0->R":
            def f():
                out = np.empty(oshape)
                comm.Allgather([send, D], [out, D])
                return out
        elif name == "S1->R":
            def f():
                stg = np.empty(n * send.size)
                comm.Allgather([send, D], [stg, D])
                out = np.empty(oshape)
                out.reshape(r, n, c)[...] = stg.reshape(n, r, c).transpose(1, 0, 2)
                return out
        elif name == "P->R":
            def f():
                out = np.empty(oshape)
                comm.Allreduce([send, D], [out, D], MPI.SUM)
                return out
        elif name == "P->S0":
            def f():
                out = np.empty(oshape)
                comm.Reduce_scatter_block([send, D], [out, D], MPI.SUM)
                return out
        elif name == "P->S1":
            def f():
                stg = np.ascontiguousarray(local.reshape(r, n, c // n).transpose(1, 0, 2))
                out = np.empty(oshape)
                comm.Reduce_scatter_block([stg, D], [out, D], MPI.SUM)
                return out
        elif name == "S0->S1":
            w = c // n

            def f():
                out = np.empty(oshape)
                st, rt = [], []
                for q in range(n):
                    st.append(D.Create_subarray([r, c], [r, w], [0, q * w]).Commit())
                    rt.append(D.Create_subarray([n * r, w], [r, w], [q * r, 0]).Commit())
                ones, zeros = [1] * n, [0] * n
                comm.Alltoallw([local, (ones, zeros), st], [out, (ones, zeros), rt])
                for t in st + rt:
                    t.Free()
                return out
        elif name == "R->S0":
            rows = case.gshape[0] // n
            rank = comm.rank

            def f():
                return local[rank * rows:(rank + 1) * rows].copy()
        self.run = f

    def alloc_only(self):
        out = np.empty(self.c.oshape)
        out.fill(0.0)  # first touch: the page faults a fresh output pays for
        return out


def same_call(case: Case):
    """The MPI routine the executor calls, between preallocated resident buffers:
    separates the choice of routine (Allgatherv, Reduce_scatter, Alltoallw with
    subarray types) from the executor's own costs. None where it is the raw one."""
    n, (r, c), comm, D = case.n, case.lshape, case.comm, MPI.DOUBLE
    local, send = case.local, case.local.reshape(-1)
    e = send.size
    if case.name in ("S0->R", "S1->R"):
        recv = np.full(n * e, 0.0)  # resident (np.zeros would be lazy)
        counts, displs = [e * 8] * n, [k * e * 8 for k in range(n)]
        return lambda: comm.Allgatherv([send, e * 8, MPI.BYTE],
                                       [recv, (counts, displs), MPI.BYTE])
    if case.name in ("P->S0", "P->S1"):
        recv = np.full(e // n, 0.0)
        return lambda: comm.Reduce_scatter([send, D], [recv, D], [e // n] * n, MPI.SUM)
    if case.name == "S0->S1":
        w = c // n
        out = np.full(case.oshape, 0.0)
        st = [D.Create_subarray([r, c], [r, w], [0, q * w]).Commit() for q in range(n)]
        rt = [D.Create_subarray([n * r, w], [r, w], [q * r, 0]).Commit() for q in range(n)]
        ones, zeros = [1] * n, [0] * n
        return lambda: comm.Alltoallw([local, (ones, zeros), st], [out, (ones, zeros), rt])
    return None


def alternative(case: Case):
    """A way to do the same move with less work, for the owners to consider.
    S1->R: Allgather straight into a fresh output with a resized vector receive
    type (no staging buffer, no unpack pass). S0->S1: NumPy pack + Alltoall."""
    n, (r, c), comm, D = case.n, case.lshape, case.comm, MPI.DOUBLE
    if case.name == "S1->R":
        send = case.local.reshape(-1)
        vec = D.Create_vector(r, c, n * c).Create_resized(0, c * 8).Commit()
        oshape = case.oshape

        def f():
            out = np.empty(oshape)
            comm.Allgather([send, D], [out, 1, vec])
            return out
        return f
    if case.name == "S0->S1":
        return case.run_np_a2a
    return None


PROFILE_COLS = ["mt", "numpy_emulation", "same_call", "raw", "alternative",
                "alloc_touch_output"]


def profile(comm, mesh, sizes, args, names):
    """Per transition and size: the full call (a cached move runs in the executor
    alone, no Python code), the NumPy emulation of the executor, the executor's MPI routine between
    resident buffers, the raw collective, an alternative, and the cost of allocating
    and first-touching an output-sized array."""
    rows = []
    for name, src, dst, _, _ in TRANSITIONS:
        if name not in names:
            continue
        for nbytes in sizes:
            case = Case(name, src, dst, nbytes, comm, mesh)
            em = Emulation(case)
            want = case.run_mt().to_local()
            ok = np.allclose(em.run(), want, rtol=1e-12, atol=1e-12)
            alt = alternative(case)
            if alt is not None:
                ok = ok and np.allclose(alt(), want, rtol=1e-12, atol=1e-12)
            variants = {
                "mt": case.run_mt,
                "numpy_emulation": em.run,
                "same_call": same_call(case),
                "raw": case.raw,
                "alternative": alt,
                "alloc_touch_output": em.alloc_only,
            }
            case.variants = {k: v for k, v in variants.items() if v is not None}
            t, foreign, attempts = time_point_quiet(case, reps_for(nbytes, args),
                                                    inner_calls(nbytes), args.warmup,
                                                    args.retries, args.max_foreign)
            med = {k: float(np.median(v) * 1e6) for k, v in t.items()}
            rows.append({"transition": name, "bytes": case.bytes,
                         "check": comm.allreduce(bool(ok), MPI.LAND),
                         "foreign_cpus": foreign, "attempts": attempts,
                         "median_us": med,
                         "range_us": {k: [float(min(v) * 1e6), float(max(v) * 1e6)]
                                      for k, v in t.items()}})
            del case, em
            gc.collect()
    return rows


# ---- report ---------------------------------------------------------------------------------


def machine_info(comm):
    info = machine(comm)  # cores: the machine's; ranks may be bound to one core each
    return {**info, "oversubscribed": comm.size > info["cores"],
            "mpi4py": __import__("mpi4py").__version__}


# What a point holds for this run's output only: each repetition's time and the
# noise control's figures. The JSON keeps the summaries (benchmarks/_common.write_result).
RUN_ONLY = ("times_s", "foreign_cpus", "attempts", "target")


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def print_table(points, info, torch_on):
    np_ = info["np"]
    over = " -- OVERSUBSCRIBED: %d ranks on %d cores" % (np_, info["cores"]) \
        if info["oversubscribed"] else ""
    print(f"\nmpitensor redistribute vs raw mpi4py, np={np_}{over}")
    print("times: median over repetitions of the max over ranks, per call; "
          "ratio = median(mt)/median(raw), [min..max] of the per-repetition ratio;\n"
          "other = CPUs used by other processes on the machine while the point ran")
    hdr = (f"{'transition':<8} {'bytes/rank':>10} {'reps':>4}x{'in':<2} {'other':>5} "
           f"{'mt us':>10} {'raw us':>10} {'ratio':>6} {'[min..max]':>14}")
    extra = f" {'np_a2a us':>10} {'mt/np':>6}"
    if torch_on:
        extra += f" {'torch us':>10} {'torch/mt':>8}"
    print(hdr + extra)
    for p in points:
        s = p["summary"]
        line = (f"{p['transition']:<8} {fmt_bytes(p['bytes']):>10} {p['reps']:>4}x{p['inner']:<2} "
                f"{p['foreign_cpus']:>5.2f} {s['mt']['median_us']:>10.1f} {s['raw']['median_us']:>10.1f} "
                f"{s['ratio']:>6.2f} [{s['ratio_min']:>5.2f}..{s['ratio_max']:<5.2f}]")
        if "np_a2a" in s:
            line += f" {s['np_a2a']['median_us']:>10.1f} {s['ratio_vs_np_a2a']:>6.2f}"
        elif torch_on:
            line += " " * 18
        if "torch" in s:
            line += f" {s['torch']['median_us']:>10.1f} {s['torch_over_mt']:>7.1f}x"
        if not p["check"]:
            line += "  RESULT MISMATCH"
        print(line)


def print_overhead(points):
    small = min(p["bytes"] for p in points)
    limit = next(g[5] for g in GOALS if g[4] == "overhead_us")
    print(f"\nabsolute overhead at {fmt_bytes(small)}/rank: median(mt) - median(raw), us "
          f"(goal at 1 KiB for {', '.join(DIM0)}: <= {limit:g} us)")
    for p in points:
        if p["bytes"] == small:
            print(f"  {p['transition']:<8} {p['summary']['overhead_us']:>8.1f}")


def goal_verdicts(points) -> list:
    """One row per (goal, point it covers): the value, the limit and whether it
    passes (a point whose result differs from the raw collective's fails)."""
    rows = []
    for name, names, lo, hi, key, limit, what in GOALS:
        for p in points:
            b = p["bytes"]
            if (p["transition"] in names and (lo is None or b >= lo)
                    and (hi is None or b <= hi) and key in p["summary"]):
                v = p["summary"][key]
                rows.append({"goal": name, "transition": p["transition"], "bytes": b,
                             "what": what, "value": v, "limit": limit,
                             "pass": bool(v <= limit and p["check"])})
    return rows


def spread(summary: dict, key: str) -> float:
    """The [min..max] width, over a run's repetitions, of a point's value `key`."""
    if key == "overhead_us":
        return summary["mt"]["max_us"] - summary["mt"]["min_us"]
    return summary[f"{key}_max"] - summary[f"{key}_min"]


def watch_verdicts(points, committed) -> list:
    """At np other than 2 the goals are a regression watch, not a speed goal (ranks
    share the cores, and which share decides the figure): one row per (goal, point it
    covers), passing unless its value is worse than the committed run's (`committed`:
    that run's points, for this CPU and np) by more than that run's own spread. A
    point the committed run lacks is not judged."""
    before = {(p["transition"], p["bytes"]): p["summary"] for p in committed}
    rows = []
    for row in goal_verdicts(points):
        was = before.get((row["transition"], row["bytes"]))
        key = next(g[4] for g in GOALS if g[0] == row["goal"])
        if was is None or key not in was:
            continue
        limit = was[key] + spread(was, key)
        rows.append({**row, "limit": limit, "pass": bool(row["value"] <= limit)})
    return rows


def committed_points(n: int):
    """The points of the committed redistribute.py run for this CPU at np `n`, and
    its commit; (None, None) when there is none."""
    path = result_path(f"redistribute-np{n}.json")
    if not os.path.exists(path):
        return None, None
    with open(path) as f:
        run = json.load(f)
    return run["points"], run["machine"].get("commit", "?")


def memory_verdicts(mem_rows) -> list:
    """One row per transition of the peak-memory measurement, as goal_verdicts'."""
    return [{"goal": MEMORY_GOAL[0], "transition": r["transition"], "bytes": r["bytes"],
             "what": "peak growth / (2 x output)",
             "value": r["mt_growth_bytes"] / max(2 * r["output_bytes"], 1), "limit": 1.0,
             "pass": bool(r["mt_within_limit"])} for r in mem_rows]


def print_goals(rows, np_, against=None) -> bool:
    """Prints PASS or FAIL per point and per goal; whether every goal passed. A
    goal no point covered (sizes or transitions left out) does not pass; the
    memory goal counts only when the run measured memory. `against`: the commit of
    the run a regression watch compares with (watch_verdicts)."""
    watch = against is not None
    print(f"\nthe goals at np={np_}" + (
        f", as a regression watch: no worse than the committed run ({against}) by more "
        f"than its spread" if watch else "") + ", per point:")
    for r in rows:
        print(f"  {'PASS' if r['pass'] else 'FAIL'}  {r['goal']:<23} {r['transition']:<7} "
              f"{fmt_bytes(r['bytes']):>8}: {r['what']} = {r['value']:.2f} "
              f"(limit {r['limit']:.3g})")
    print(f"per goal (np={np_}):")
    passed = 0
    for g in GOALS:
        mine = [r for r in rows if r["goal"] == g[0]]
        verdict = ("NOT JUDGED" if watch else "NOT MEASURED") if not mine else (
            "PASS" if all(r["pass"] for r in mine) else "FAIL")
        passed += verdict in ("PASS", "NOT JUDGED")
        limit = "the committed run's + its spread" if watch else f"{g[5]:g}"
        print(f"  {verdict:<12} {g[0]}: {g[6]} <= {limit} ({', '.join(g[1])})")
    total = len(GOALS)
    mem = [r for r in rows if r["goal"] == MEMORY_GOAL[0]]
    if mem:
        total += 1
        verdict = "PASS" if all(r["pass"] for r in mem) else "FAIL"
        passed += verdict == "PASS"
        print(f"  {verdict:<12} {MEMORY_GOAL[0]}: {MEMORY_GOAL[1]} (every transition, "
              f"{fmt_bytes(mem[0]['bytes'])} of input; 2% + 1 MiB tolerated)")
    print(f"bench-check np={np_}: {passed} of {total} goals pass")
    return passed == total


def print_memory(rows):
    if not rows:
        return
    print("\npeak RSS growth during one redistribute (max over ranks), MiB; target: growth "
          "<= output + one output-sized staging buffer (limit; 'ok' within 2% + 1 MiB "
          "for Python objects, page rounding and MPI internals)")
    print(f"  {'transition':<8} {'input':>7} {'output':>7} {'limit':>7} {'mt':>8} "
          f"{'raw':>7} {'same':>7} {'torch':>7}  verdict")
    for r in rows:
        lim = 2 * r["output_bytes"]
        g = r["mt_growth_bytes"]
        tg = r.get("torch_growth_bytes")
        sg = r.get("same_call_growth_bytes")
        print(f"  {r['transition']:<8} {r['bytes'] / MiB:>7.1f} {r['output_bytes'] / MiB:>7.1f} "
              f"{lim / MiB:>7.1f} {g / MiB:>8.1f} {r['raw_growth_bytes'] / MiB:>7.1f} "
              f"{'-' if sg is None else f'{sg / MiB:.1f}':>7} "
              f"{'-' if tg is None else f'{tg / MiB:.1f}':>7}  "
              f"{'ok' if g <= lim * 1.02 + MiB else 'OVER'}")


def print_profile(rows):
    if not rows:
        return
    print("\nprofile, median us: mt = dt.redistribute (a cached move: the executor "
          "alone);\n  numpy_emulation = the executor's work redone "
          "with NumPy+mpi4py (fresh output, staging, unpack);\n  same_call = the executor's MPI routine "
          "between resident buffers (Allgatherv, Reduce_scatter, Alltoallw);\n  raw = the "
          "raw collective; alternative = S1->R: Allgather into a fresh output with a "
          "vector\n  receive type, S0->S1: NumPy pack+Alltoall; alloc_touch_output = "
          "np.empty + fill of an output-sized array")
    short = {"numpy_emulation": "emulation", "alloc_touch_output": "alloc+touch"}
    print(f"  {'transition':<8} {'bytes':>8} "
          + " ".join(f"{short.get(c, c):>11}" for c in PROFILE_COLS))
    for r in rows:
        m = r["median_us"]
        print(f"  {r['transition']:<8} {fmt_bytes(r['bytes']):>8} "
              + " ".join(f"{m[c]:>11.1f}" if c in m else f"{'-':>11}" for c in PROFILE_COLS)
              + ("" if r["check"] else "  MISMATCH"))


TARGET_LINES = {t: g[5] for g in GOALS if g[2] == MiB and g[4] == "ratio" for t in g[1]}


def size_label(x, _pos=None):
    return fmt_bytes(int(x)).replace(" ", "") if x >= 1 else ""


def _axes_style(ax, FuncFormatter):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(size_label))
    plain = FuncFormatter(lambda y, _p: f"{y:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", labelsize=7, labelrotation=45)
    ax.tick_params(axis="y", which="both", labelsize=6)
    ax.grid(True, which="both", alpha=0.3)


def plot(result, path):
    """One panel per transition: ratio of medians against size, the interquartile
    range of the per-repetition ratio as a band, the target (TARGET_LINES) as a line; with
    torch, a last panel with torch/mt."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except Exception as exc:  # noqa: BLE001 - any import failure means no plot
        print(f"\nno plot: matplotlib cannot be imported ({exc})")
        return None
    info, points = result["machine"], result["points"]
    names = [t[0] for t in TRANSITIONS if any(p["transition"] == t[0] for p in points)]
    torch_on = any("torch" in p["summary"] for p in points)
    npanel = len(names) + (1 if torch_on else 0)
    ncol = 4 if npanel > 4 else npanel
    nrow = (npanel + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.8 * ncol, 3.3 * nrow), squeeze=False)
    flat = [a for row in axes for a in row]
    for ax, name in zip(flat, names):
        pts = [p for p in points if p["transition"] == name]
        x = [p["bytes"] for p in pts]
        sm = [p["summary"] for p in pts]
        ax.plot(x, [s["ratio"] for s in sm], "o-", color="C0", label="mt / raw")
        ax.fill_between(x, [s["ratio_p25"] for s in sm], [s["ratio_p75"] for s in sm],
                        color="C0", alpha=0.2, label="IQR of per-rep ratio")
        if "ratio_vs_np_a2a" in sm[0]:
            ax.plot(x, [s["ratio_vs_np_a2a"] for s in sm], "s--", color="C1",
                    label="mt / numpy pack+Alltoall")
            ax.axhline(1.0, color="C1", lw=0.8, ls=":")
        if TARGET_LINES.get(name):
            ax.axhline(TARGET_LINES[name], color="C3", lw=0.9, ls=":",
                       label=f"target {TARGET_LINES[name]} (>= 1 MiB)")
        ax.axvline(MiB, color="grey", lw=0.5)
        ax.set_title(name + (" (raw = memcpy)" if name == "R->S0" else ""), fontsize=9)
        _axes_style(ax, FuncFormatter)
        ax.legend(fontsize=6)
    if torch_on:
        ax = flat[len(names)]
        for i, name in enumerate(names):
            pts = [p for p in points if p["transition"] == name and "torch" in p["summary"]]
            if pts:
                ax.plot([p["bytes"] for p in pts], [p["summary"]["torch_over_mt"] for p in pts],
                        "o-", color=f"C{i}", label=name, ms=3)
        ax.axhline(10, color="C3", lw=0.8, ls=":")
        ax.axhline(2, color="C3", lw=0.8, ls=":")
        _axes_style(ax, FuncFormatter)
        ax.set_title(f"torch {result.get('torch_version')} gloo time / mpitensor time",
                     fontsize=9)
        ax.legend(fontsize=6)
    for ax in flat[npanel:]:
        ax.axis("off")
    over = (f" -- OVERSUBSCRIBED ({info['np']} ranks on {info['cores']} cores)"
            if info["oversubscribed"] else f" on {info['cores']} cores")
    fig.suptitle(f"mpitensor redistribute / raw mpi4py collective (median of max over ranks),"
                 f" np={info['np']}{over}; x: local input bytes per rank", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-bytes", default="1KiB", help="smallest local input per rank")
    ap.add_argument("--max-bytes", default="64MiB", help="largest local input per rank")
    ap.add_argument("--reps", type=int, default=31, help="repetitions per point <= 1 MiB")
    ap.add_argument("--reps-large", type=int, default=15, help="repetitions for 4..16 MiB")
    ap.add_argument("--reps-huge", type=int, default=9, help="repetitions above 16 MiB")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--retries", type=int, default=2,
                    help="re-time a point up to this many times when other processes "
                    "used more than --max-foreign CPUs meanwhile (the quietest is kept)")
    ap.add_argument("--max-foreign", type=float, default=0.15,
                    help="CPUs' worth of other processes' work tolerated during a point")
    ap.add_argument("--transitions", default=",".join(t[0] for t in TRANSITIONS),
                    help="comma-separated subset without the arrow (S0R,S1R,PR,PS0,PS1,"
                    "S0S1,RS0) or quoted with it ('S0->R,P->R')")
    ap.add_argument("--torch", action="store_true", help="also time torch DTensor on gloo")
    ap.add_argument("--torch-max-bytes", default="16MiB",
                    help="largest size timed with torch (it is slow)")
    ap.add_argument("--mem-bytes", default=None,
                    help="size of the peak-memory measurement (default: --max-bytes)")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also split the time: Python, C call, NumPy emulation, raw")
    ap.add_argument("--profile-sizes", default="1KiB,1MiB,16MiB")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/"
                    "<cpu>/redistribute-np{N}[-torch].json)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--sizes", default=None,
                    help="comma-separated bytes/rank to time instead of the powers of 4 "
                    "from --min-bytes to --max-bytes")
    ap.add_argument("--goals", action="store_true",
                    help="print PASS or FAIL per goal (GOALS) and exit 1 unless all "
                    "pass (make bench-check)")
    args = ap.parse_args(argv)

    comm = MPI.COMM_WORLD.Dup()
    n, rank = comm.size, comm.rank
    if 128 % n:
        if rank == 0:
            print("np must divide 128 (1, 2, 4, 8, ...) so that every shard is even",
                  file=sys.stderr)
        return 2
    canon = {t[0].replace("->", ""): t[0] for t in TRANSITIONS}  # S0R also means S0->R
    wanted = [t.strip().replace("->", "").replace("-", "").upper()
              for t in args.transitions.split(",") if t.strip()]
    unknown = [w for w in wanted if w not in canon]
    if unknown:
        raise SystemExit(f"unknown transitions {unknown}; use {', '.join(canon)}")
    names = [canon[w] for w in wanted]
    lo, hi = parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= 4
    if args.sizes:
        sizes = [parse_bytes(x) for x in args.sizes.split(",")]
        hi = max(sizes)
    mesh = mt.init_device_mesh("cpu", (n,))
    tctx = TorchCtx(comm, parse_bytes(args.torch_max_bytes)) if args.torch else None
    info = machine_info(comm) if rank == 0 else None
    if rank == 0:
        over = " -- OVERSUBSCRIBED" if info["oversubscribed"] else ""
        print(machine_line(info) + over, flush=True)
        built = datetime.datetime.fromtimestamp(os.path.getmtime(mt._C.__file__),
                                                datetime.timezone.utc)
        print(f"mpitensor {info['commit']} (extension built {built:%Y-%m-%d %H:%M} UTC)"
              + (f"; torch {tctx.version} gloo" if tctx else ""), flush=True)
        load_start = loadavg()

    result = {"machine": info, "args": vars(args), "points": []}
    if tctx:
        result["torch_version"] = tctx.version

    t_start = time.perf_counter()
    for name, src, dst, raw_name, target in TRANSITIONS:
        if name not in names:
            continue
        for nbytes in sizes:
            case = Case(name, src, dst, nbytes, comm, mesh, tctx)
            ok = comm.allreduce(bool(case.check()), MPI.LAND)
            reps, inner = reps_for(nbytes, args), inner_calls(nbytes)
            times, foreign, attempts = time_point_quiet(case, reps, inner, args.warmup,
                                                        args.retries, args.max_foreign)
            point = {"foreign_cpus": foreign, "attempts": attempts, "transition": name,
                     "src": src, "dst": dst, "raw": raw_name,
                     "target": target, "bytes": case.bytes,
                     "local_shape": list(case.lshape), "global_shape": list(case.gshape),
                     "output_shape": list(case.oshape), "reps": reps, "inner": inner,
                     "check": ok, "times_s": times, "summary": summarize(times)}
            result["points"].append(point)
            if rank == 0:
                sm = point["summary"]
                msg = (f"  {name:<7} {fmt_bytes(case.bytes):>8}: mt {sm['mt']['median_us']:.1f} us, "
                       f"raw {sm['raw']['median_us']:.1f} us, ratio {sm['ratio']:.2f}")
                if "torch" in sm:
                    msg += f", torch/mt {sm['torch_over_mt']:.1f}x"
                print(msg + ("" if ok else "  MISMATCH")
                      + f"  (other load {foreign:.2f} CPUs, attempt {attempts})"
                      + f"  [{time.perf_counter() - t_start:.0f} s]", flush=True)
            del case
            gc.collect()
    result["elapsed_s"] = time.perf_counter() - t_start
    if rank == 0:  # other jobs on the machine show here: ratios are still side by side
        load_end = loadavg()

    # Peak memory after the timing: measured first, its large transfers left the
    # process in a state where the raw calls timed after it ran slower.
    mem_rows = []
    if not args.no_memory:
        mb = parse_bytes(args.mem_bytes) if args.mem_bytes else hi
        mem_rows = measure_memory(comm, mesh, mb, tctx, names)
        if tctx and tctx.max_bytes < mb:  # torch's own figure, at the largest size it runs
            mem_rows += measure_memory(comm, mesh, tctx.max_bytes, tctx, names)
        result["memory"] = mem_rows

    if args.profile:
        psizes = [parse_bytes(x) for x in args.profile_sizes.split(",")]
        psizes = [x for x in psizes if x <= hi]
        result["profile"] = profile(comm, mesh, psizes, args, names)

    if tctx:
        tctx.close()
    all_pass = True
    if rank == 0:
        print_table(result["points"], info, tctx is not None)
        print(f"load average at start {load_start}, at end {load_end} "
              f"(np={n} ranks of this run included)")
        print_overhead(result["points"])
        print_memory(mem_rows)
        print_profile(result.get("profile"))
        if args.goals:
            committed, against = committed_points(n) if n != 2 else (None, None)
            if n == 2:
                rows = goal_verdicts(result["points"])
            elif committed is None:
                rows, against = [], "none"
                print(f"\nno committed run at np={n} on this CPU to watch against "
                      "(make bench writes one): only the memory goal is judged")
            else:
                rows = watch_verdicts(result["points"], committed)
            result["goals"] = rows + memory_verdicts(mem_rows)
            all_pass = print_goals(result["goals"], n, against)
        out = args.out or result_path(
            f"redistribute-np{n}{'-torch' if tctx else ''}.json")
        write_result(out, {**result, "points": [
            {k: v for k, v in p.items() if k not in RUN_ONLY} for p in result["points"]]})
        print(f"\nwrote {out}")
        if not args.no_plot:
            png = plot(result, os.path.splitext(out)[0] + ".png")
            if png:
                print(f"wrote {png}")
    comm.Free()
    return 0 if all_pass else 1  # rank 0's status is mpiexec's


if __name__ == "__main__":
    sys.exit(main())
