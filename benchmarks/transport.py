"""Whether mpitensor's hand-written transport earns its place: each path against the
MPI or libc path it replaces, on the same bytes, at np 2, timed interleaved.

    mpiexec -n 2 python benchmarks/transport.py [--sizes 64KiB,1MiB,16MiB] [--parts direct,copy]

``direct`` (csrc/comm/direct.c, process_vm_readv/_writev between the ranks of a
node): all-to-alls run as direct copies (``S0->S1`` of float64 arrays of 512 and
of 128 columns, ``S1->S2`` of 3-D ones: the shortest runs each side copies
directly) on a mesh whose ranks may copy straight from each other's arrays,
against the same on a mesh made with MPITENSOR_DIRECT_READ=0, which goes through
MPI; each point records whether the direct path was taken (a copy made to fail
is).

``copy`` (csrc/core/copy.c): the copy built from that source into a small library
(build/copy_paths.so, made with ``cc`` from benchmarks/copy_paths.c), against
glibc's memcpy on the same runs, on both ranks at once as a redistribution's
copies run, at the points where copy.c streams on this CPU (it says which it
skips): whole blocks, rows of whole aligned vectors and rows 16 bytes off the
source modulo 64, into destinations of 4 MiB and more. Both write the same
destination, taking turns, so each finds it as the other left it. Copies never
wait on the other rank, so they are timed in CPU time (time.thread_time), which a
busy machine's scheduler does not stretch.

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
from mpitensor import Shard, _comm
from _common import (machine, machine_line, page_aligned, ratio,  # benchmarks/ is sys.path[0]
                     result_path, summary, time_interleaved, write_result)

KiB, MiB = 1024, 1024 * 1024
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The direct all-to-alls: (case, a rank's local float64 shape for `e` elements,
# source, target). At np 2 a rank copies runs of 2 KiB on its own side into one
# run on the other; of 512 bytes, the shortest its own side copies directly
# (MT__DIRECT_MIN_LOCAL_RUN); and of 512 bytes into runs of 4 KiB on the other
# side, the shortest the other side takes (MT__DIRECT_MIN_RUN).
DIRECT_CASES = (
    ("S0->S1, 512 columns", lambda e: (e // 512, 512), Shard(0), Shard(1)),
    ("S0->S1, 128 columns", lambda e: (e // 128, 128), Shard(0), Shard(1)),
    ("S1->S2, (n, 8 x np, 128)", lambda e: (e // 1024, 8, 128), Shard(1), Shard(2)),
)


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
    """(a mesh made with MPITENSOR_DIRECT_READ=1, which reads directly on any CPU
    that allows it, one made with MPITENSOR_DIRECT_READ=0)."""
    old = os.environ.get("MPITENSOR_DIRECT_READ")
    os.environ["MPITENSOR_DIRECT_READ"] = "1"
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
    if not _comm.direct_read(direct):
        if comm.rank == 0:
            print("direct reads are not possible between these ranks (another node, "
                  "ptrace rules or a seccomp filter): direct paths not measured")
        return []
    points = []
    for (name, local_shape, src, dst), nbytes in ((c, b) for c in DIRECT_CASES for b in sizes):
        local = np.random.default_rng(comm.rank).standard_normal(local_shape(nbytes // 8))
        dts = {m: mt.DTensor.from_local(local, mesh, [src], run_check=False)
               for m, mesh in (("direct", direct), ("mpi", plain))}
        same = comm.allreduce(int(np.array_equal(
            dts["direct"].redistribute(direct, [dst]).to_local(),
            dts["mpi"].redistribute(plain, [dst]).to_local())), op=MPI.MIN) == 1
        # Whether the step really copies directly: a copy made to fail is taken.
        _comm.direct_fail_next(1)
        dts["direct"].redistribute(direct, [dst])
        taken = comm.allreduce(_comm.direct_fail_next(0) == 0, op=MPI.LOR)
        variants = {m: (lambda m=m, mesh=mesh: dts[m].redistribute(mesh, [dst]))
                    for m, mesh in (("direct", direct), ("mpi", plain))}
        t = time_interleaved(comm, variants, reps(nbytes), warmup)
        p = point(comm, "direct reads", name, nbytes, t, "direct", "mpi", same)
        p["taken"] = bool(taken)
        if comm.rank == 0 and not taken:
            print(f"  (not taken: {name} at {fmt_bytes(nbytes)} goes through MPI)")
        points.append(p)
    return points


# ---- the copy -------------------------------------------------------------------------

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
    lib.bench_streams.argtypes = [ptr, i64, i64, i64]
    return lib


def copy_cases(sizes):
    """(case, runs, run bytes, destination stride, source stride, destination offset
    past the source's alignment, destination bytes) for each destination of 4 MiB
    and more: the whole block at once, aligned and 16 bytes off modulo 64, and
    rows placed into every other slot of it (an inner all-gather at np 2): whole
    aligned vectors from 512 bytes to just under 4 KiB, and 16 bytes off from
    64 KiB to just under 1 MiB, the ends of the ranges copy.c streams."""
    cases = []
    for nbytes in (b for b in sizes if b >= 4 * MiB):
        for shift in (0, 16):
            cases.append((f"one block, {'+16 B' if shift else 'aligned'}", 1, nbytes, 0, 0,
                          shift, nbytes))
        for run, shift in [(r, 0) for r in (512, 1 * KiB, 2 * KiB, 4 * KiB - 32)] + \
                          [(r, 16) for r in (64 * KiB, MiB - 32 * KiB)]:
            cases.append((f"rows of {fmt_bytes(run)}, {'+16 B' if shift else 'aligned'}",
                          nbytes // (2 * run), run, 2 * run, run, shift, nbytes))
    return cases


def copy_points(comm, lib, sizes, reps, warmup):
    points, skipped = [], {}
    for case, n, run, ds, ss, shift, dst_bytes in copy_cases(sizes):
        src = page_aligned((n * max(ss, run) + 64,), "u1")
        src[:] = np.random.default_rng(comm.rank).integers(0, 255, src.size, np.uint8)
        dst, ref = (page_aligned((dst_bytes + 64,), "u1") for _ in range(2))
        dst[:], ref[:] = 0, 0
        s, d, r = src.ctypes.data, dst.ctypes.data + shift, ref.ctypes.data + shift
        if not comm.allreduce(lib.bench_streams(d, ds, run, dst_bytes), op=MPI.LAND):
            skipped.setdefault(fmt_bytes(dst_bytes), []).append(case)
            continue
        variants = {"memcpy": lambda: lib.bench_memcpy(d, s, n, ds, ss, run),
                    "library": lambda: lib.bench_library(d, s, n, ds, ss, run, dst_bytes)}
        lib.bench_memcpy(r, s, n, ds, ss, run)
        variants["library"]()
        same = comm.allreduce(int(np.array_equal(dst, ref)), op=MPI.MIN) == 1
        t = time_interleaved(comm, variants, reps(dst_bytes), warmup, time.thread_time)
        points.append(point(comm, "streaming stores", case, dst_bytes, t, "library", "memcpy",
                            same))
    for size, cases in skipped.items():
        if comm.rank == 0:
            print(f"copy.c uses memcpy on this CPU, nothing to measure, into {size}: "
                  f"{'; '.join(cases)}")
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="32KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB",
                    help="input bytes per rank (the copy from 4 MiB)")
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
