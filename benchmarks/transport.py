"""Whether mpitensor's hand-written transport earns its place: each path against the
MPI or libc path it replaces, on the same bytes, at np 2, timed interleaved.

    mpiexec -n 2 python benchmarks/transport.py [--sizes 64KiB,1MiB,16MiB] [--parts direct,copy]

``direct`` (csrc/comm/direct.c, process_vm_readv/_writev between the ranks of a
node): redistributions on a mesh whose ranks may copy straight from each other's
arrays, against the same on a mesh made with MPITENSOR_DIRECT_READ=0, which goes
through MPI: ``S1->R`` (an inner all-gather, read directly for outputs up to
16 MiB) and ``S0->S1`` (an all-to-all as direct copies).

``copy`` (csrc/core/copy.c): the loops built from that source into a small library
(build/copy_paths.so, made with ``cc`` from benchmarks/copy_paths.c), each against
glibc's memcpy on the same runs, on both ranks at once as a redistribution's
copies run: the AVX2 vector loop (which copy.c uses on AMD CPUs for runs of 4 KiB
and more; forced here whatever the CPU) on runs whose destination sits 16 bytes
off the source modulo 64 and on aligned ones, the same loop with streaming stores
(destinations of 4 MiB and more), and what mt__copy_runs picks on this CPU. Copies never wait on
the other rank, so they are timed in CPU time (time.thread_time), which a busy
machine's scheduler does not stretch.

Per point: the median time of each side (repetitions alternate which runs first,
after a barrier; the slowest rank's time) and ``speedup = median(baseline) /
median(path)``, with the range of the per-repetition ratio; the rule is that a
path stays where it is at least 1.2 times faster on the CPU where it is switched
on. Results go to benchmarks/results/<cpu>/transport-np{N}.json.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import time

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard
from _common import (machine, machine_line, page_aligned, ratio,  # benchmarks/ is sys.path[0]
                     result_path, summary, time_interleaved, write_result)

KiB, MiB = 1024, 1024 * 1024
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLS = 512


def parse_bytes(text: str) -> int:
    t = text.strip().lower().replace("ib", "").replace("b", "")
    return int(float(t.rstrip("kmg")) * {"k": KiB, "m": MiB, "g": 1024 * MiB}.get(t[-1:], 1))


def fmt_bytes(n: int) -> str:
    for unit, size in (("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def point(comm, path, case, nbytes, times, on, off, same=True):
    """A result record: the path's and the baseline's times, the speed-up."""
    s = ratio(times[off], times[on])
    p = {"path": path, "case": case, "bytes": nbytes, "same": same,
         "path_s": summary(times[on]), "baseline_s": summary(times[off]),
         "speedup": s["median"], "speedup_min": s["min"], "speedup_max": s["max"]}
    if comm.rank == 0:
        print(f"{path:26s} {case:28s} {fmt_bytes(nbytes):>8}  path "
              f"{p['path_s']['median'] * 1e3:8.3f} ms  baseline {p['baseline_s']['median'] * 1e3:8.3f} ms"
              f"  speed-up {s['median']:5.2f} [{s['min']:.2f}..{s['max']:.2f}]"
              f"{'' if same else '  (results differ)'}", flush=True)
    return p


# ---- direct copies between processes ------------------------------------------------

def meshes(comm):
    """(a mesh that may read directly, one made with MPITENSOR_DIRECT_READ=0)."""
    old = os.environ.pop("MPITENSOR_DIRECT_READ", None)
    direct = mt.init_device_mesh("cpu", (comm.size,))
    os.environ["MPITENSOR_DIRECT_READ"] = "0"
    plain = mt.init_device_mesh("cpu", (comm.size,))
    if old is None:
        del os.environ["MPITENSOR_DIRECT_READ"]
    else:
        os.environ["MPITENSOR_DIRECT_READ"] = old
    return direct, plain


def direct_points(comm, sizes, reps, warmup):
    direct, plain = meshes(comm)
    if not direct._handle.direct_read():
        if comm.rank == 0:
            print("direct reads are not possible between these ranks (another node, "
                  "ptrace rules or a seccomp filter): direct paths not measured")
        return []
    points = []
    for name, src, dst in (("S1->R", Shard(1), Replicate()), ("S0->S1", Shard(0), Shard(1))):
        for nbytes in sizes:
            e = nbytes // 8
            cols = min(COLS if src == Shard(0) else COLS // comm.size, e)
            shape = (e // cols, cols)
            local = np.random.default_rng(comm.rank).standard_normal(shape)
            dts = {m: mt.DTensor.from_local(local, mesh, [src], run_check=False)
                   for m, mesh in (("direct", direct), ("mpi", plain))}
            same = comm.allreduce(int(np.array_equal(
                dts["direct"].redistribute(direct, [dst]).to_local(),
                dts["mpi"].redistribute(plain, [dst]).to_local())), op=MPI.MIN) == 1
            variants = {m: (lambda m=m, mesh=mesh: dts[m].redistribute(mesh, [dst]))
                        for m, mesh in (("direct", direct), ("mpi", plain))}
            t = time_interleaved(comm, variants, reps(nbytes), warmup)
            points.append(point(comm, "direct reads", name, nbytes, t, "direct", "mpi", same))
    return points


# ---- copy loops -----------------------------------------------------------------------

def copy_library(comm):
    """build/copy_paths.so, compiled from benchmarks/copy_paths.c by rank 0."""
    out = os.path.join(ROOT, "build", "copy_paths.so")
    if comm.rank == 0:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-O3", "-shared", "-fPIC", "-I", os.path.join(ROOT, "csrc/include"),
                        "-I", os.path.join(ROOT, "csrc/core"), "-o", out,
                        os.path.join(HERE, "copy_paths.c")], check=True)
    comm.Barrier()
    lib = ctypes.CDLL(out)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.bench_library.argtypes = [ptr, ptr, i64, i64, i64, i64, i64]
    lib.bench_memcpy.argtypes = [ptr, ptr, i64, i64, i64, i64]
    lib.bench_loop.argtypes = [ptr, ptr, i64, i64, i64, i64, ctypes.c_int]
    return lib


def copy_cases(sizes):
    """(case, runs, run bytes, destination stride, source stride, destination offset
    past the source's alignment, destination bytes): rows placed into every other
    slot of an output (an inner all-gather at np 2), by run length, with the
    destination 16 bytes off modulo 64 and aligned; and whole blocks of 4 MiB and
    more, and strided 4 KiB runs into them (streaming stores)."""
    cases = []
    for run in (1 * KiB, 2 * KiB, 4 * KiB, 8 * KiB, 16 * KiB, 64 * KiB):
        n = MiB // run
        for shift in (16, 0):
            cases.append((f"rows of {fmt_bytes(run)}, {'+16 B' if shift else 'aligned'}",
                          n, run, 2 * run, run, shift, 2 * MiB))
    for nbytes in sizes:
        if nbytes >= 4 * MiB:
            cases.append(("one block", 1, nbytes, 0, 0, 0, nbytes))
            for run in (512, 1 * KiB, 2 * KiB, 4 * KiB, 64 * KiB):
                for shift in (16, 0):
                    cases.append((f"rows of {fmt_bytes(run)}, {'+16 B' if shift else 'aligned'}",
                                  nbytes // (2 * run), run, 2 * run, run, shift, nbytes))
    return cases


def copy_points(comm, lib, sizes, reps, warmup):
    points = []
    if not lib.bench_has_avx2():
        if comm.rank == 0:
            print("this CPU has no AVX2: copy.c uses memcpy only, nothing to measure")
        return points
    for case, n, run, ds, ss, shift, dst_bytes in copy_cases(sizes):
        src = page_aligned((n * max(ss, run) + 64,), "u1")
        src[:] = np.random.default_rng(comm.rank).integers(0, 255, src.size, np.uint8)
        dst, ref = (page_aligned((dst_bytes + 64,), "u1") for _ in range(2))
        dst[:], ref[:] = 0, 0
        s, d, r = src.ctypes.data, dst.ctypes.data + shift, ref.ctypes.data + shift
        stream = dst_bytes >= 4 * MiB
        variants = {
            "memcpy": lambda: lib.bench_memcpy(d, s, n, ds, ss, run),
            "library": lambda: lib.bench_library(d, s, n, ds, ss, run, dst_bytes),
            "loop": lambda: lib.bench_loop(d, s, n, ds, ss, run, int(stream)),
        }
        lib.bench_memcpy(r, s, n, ds, ss, run)
        same = True
        for v in ("library", "loop"):
            variants[v]()
            same = same and np.array_equal(dst, ref)
        t = time_interleaved(comm, variants, reps(dst_bytes), warmup, time.thread_time)
        kind = "streaming stores" if stream else "vector loop"
        points.append(point(comm, f"{kind} (AVX2)", case, dst_bytes, t, "loop", "memcpy", same))
        points.append(point(comm, "copy.c as built", case, dst_bytes, t, "library", "memcpy",
                            same))
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64KiB,256KiB,1MiB,4MiB,16MiB,64MiB",
                    help="input bytes per rank")
    ap.add_argument("--parts", default="direct,copy")
    ap.add_argument("--reps", type=int, default=15, help="repetitions below 16 MiB")
    ap.add_argument("--reps-large", type=int, default=7, help="repetitions from 16 MiB")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<cpu>/...)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    info = machine(comm)
    if comm.rank == 0:
        print(machine_line(info))
        print("speed-up = median(baseline) / median(path) [range of the per-repetition "
              "ratio]; a path stays where it is >= 1.2", flush=True)
    sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    parts = args.parts.split(",")

    def reps(nbytes):
        return args.reps if nbytes < 16 * MiB else args.reps_large

    points = []
    if "direct" in parts:
        points += direct_points(comm, sizes, reps, args.warmup)
    if "copy" in parts:
        points += copy_points(comm, copy_library(comm), sizes, reps, args.warmup)
    if comm.rank == 0:
        path = args.out or result_path(f"transport-np{comm.size}.json")
        write_result(path, {"machine": info, "args": vars(args), "points": points})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
