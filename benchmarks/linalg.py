#!/usr/bin/env python
"""Distributed linear algebra against Heat and against NumPy in one
process, the peers in the same processes.

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 2 .venv/bin/python \
        benchmarks/linalg.py [--quick] [--sections tsqr] [--scalapack mkl]

One section per engine, each a function of SECTIONS that returns its points:

- ``scalapack``: ``np.linalg.solve`` (a vector right-hand side) and
  ``np.linalg.eigh`` of a row-sharded ``[Shard(0)]`` float64 matrix on ScaLAPACK,
  against Heat's best paths from ``split=0``: ``ht.linalg.solve`` of A resplit to
  None (it takes no A split along its matrix axes, and its distributed
  Gauss-Jordan ``inv`` is far slower) and ``ht.linalg.eigh`` at n = 2,000, and
  against NumPy on rank 0 alone at n = 4,000, and at both sizes against a plain C
  program calling the same ScaLAPACK routine on the block-cyclic descriptors
  mpitensor builds (benchmarks/scalapack_plain.c, compiled with ``mpicc`` into a
  temporary directory as a library whose one-repetition entry runs in these
  processes, interleaved with mpitensor's; its time is the routine's alone, the
  matrix made in the cyclic layout beforehand). ``mt_over_plain`` is mpitensor's
  time over the plain program's, repetition by repetition: what mpitensor adds
  (each block's copy to the cyclic layout and back, its messages, Python). The
  plain solve is ``pXgetrf`` and ``pXgetrs`` on the 1 x P grid; mpitensor's solve
  of rows runs its own LU with lookahead (csrc/linalg/scalapack_lu.c) on its rows
  where they lie, so there the ratio also weighs the two LUs.
- ``tsqr``: ``np.linalg.qr`` and ``np.linalg.svd(full_matrices=False)`` of a
  200,000 x 64 float64 matrix, rows sharded ``[Shard(0)]`` (TSQR in C), against
  Heat's ``ht.linalg.qr`` / ``ht.linalg.svd`` on a ``split=0`` DNDarray of the same
  matrix and NumPy on the whole matrix on rank 0 alone (the other ranks wait at a
  barrier, so it has the machine to itself as a one-process program would).

Each timed call leaves its library's full answer where it belongs (Q/U on the rows'
ranks, R/S/Vh on every rank). Before timing, every answer is checked against the
matrix (||A - QR|| / ||A||, or the singular values against NumPy's); a wrong
answer is recorded, not timed away. Figures are medians (and min, max) over the
repetitions of the slowest rank's time, interleaved repetition by repetition
(benchmarks/_common.time_interleaved). Heat is optional: without it its columns
are left out and the reason recorded. Heat 1.8 as measured here:
``pip install torch==2.13.0`` and ``pip install --no-deps heat==1.8.0 "scipy~=1.14"
pillow``, with a stand-in ``torchvision`` package (Heat imports it for its MNIST
and image-transform helpers only, which this benchmark does not use).
``--scalapack mkl`` runs mpitensor and the plain program on MKL's ScaLAPACK (the
``mkl`` extra) instead of Debian's; the library run on is recorded.
Writes benchmarks/results/<cpu>/linalg-np{N}.json (linalg-mkl-np{N}.json on MKL's).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard
# MKL's ScaLAPACK's libraries in the order mpitensor loads them.
from mpitensor._algorithms._scalapack import MKL as MKL_LIBRARIES, scalapack_library

from _common import (machine, machine_line, ratio, result_path, summary,  # benchmarks/ is sys.path[0]
                     time_interleaved, write_result)


def heat_module():
    """(heat, None), or (None, why it cannot be imported)."""
    try:
        import heat as ht
        import torch
        torch.set_num_threads(1)
        return ht, None
    except Exception as e:  # not installed, or a torch/torchvision pair that fails to load
        return None, f"{type(e).__name__}: {e}"


def numpy_alone(comm, fn, reps, warmup):
    """Seconds of ``fn`` on rank 0 alone, the other ranks waiting, per repetition."""
    out = []
    for r in range(-warmup, reps):
        comm.Barrier()
        t0 = time.perf_counter()
        if comm.rank == 0:
            fn()
        comm.Barrier()
        if r >= 0:
            out.append(time.perf_counter() - t0)
    return comm.bcast(out, root=0)


def qr_error(a, q, r) -> float:
    return float(np.linalg.norm(a - q @ r) / np.linalg.norm(a))


def sv_error(s, a_s) -> float:
    return float(np.abs(np.asarray(s) - a_s).max() / a_s[0])


def tsqr_section(comm, args, ht):
    """qr and svd of a tall row-sharded matrix: mpitensor's TSQR, Heat, NumPy."""
    rows, cols = (20_000, 64) if args.quick else (args.rows, args.cols)
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    a = np.random.default_rng(0).standard_normal((rows, cols))
    dt = mt.distribute_tensor(a, mesh, [Shard(0)])
    want_s = np.linalg.svd(a, compute_uv=False)
    ha = ht.array(a, split=0) if ht is not None else None

    def mt_qr():
        q, r = np.linalg.qr(dt)
        return q, r

    def mt_svd():
        return np.linalg.svd(dt, full_matrices=False)

    calls = {"qr": {"mt": mt_qr, "numpy": lambda: np.linalg.qr(a)},
             "svd": {"mt": mt_svd, "numpy": lambda: np.linalg.svd(a, full_matrices=False)}}
    if ht is not None:
        calls["qr"]["heat"] = lambda: ht.linalg.qr(ha)
        calls["svd"]["heat"] = lambda: ht.linalg.svd(ha, full_matrices=False)
    right = {"qr": {}, "svd": {}}
    q, r = mt_qr()
    right["qr"]["mt"] = qr_error(a, q.full_tensor(), r.full_tensor())
    right["svd"]["mt"] = sv_error(mt_svd()[1].full_tensor(), want_s)
    if ht is not None:
        for op, check in (("qr", lambda res: qr_error(a, res[0].numpy(), res[1].numpy())),
                          ("svd", lambda res: sv_error(res[1].numpy(), want_s))):
            try:
                right[op]["heat"] = check(calls[op]["heat"]())
            except Exception as e:  # an API this Heat lacks: recorded, not timed
                right[op]["heat"] = f"{type(e).__name__}: {e}"
                del calls[op]["heat"]
    points = []
    for op, ways in calls.items():
        timed = {k: v for k, v in ways.items() if k != "numpy"}
        times = time_interleaved(comm, timed, args.reps, args.warmup)
        times["numpy"] = numpy_alone(comm, ways["numpy"], args.reps, args.warmup)
        points.append({
            "op": op, "shape": [rows, cols], "dtype": "float64", "layout": "[Shard(0)]",
            "seconds": {k: summary(v) for k, v in times.items()},
            "mt_speedup": {k: ratio(v, times["mt"]) for k, v in times.items() if k != "mt"},
            "error": right[op]})
    return points


# ---- square: ScaLAPACK (csrc/linalg/scalapack.c) ------------------------------

# The eigensolver mpitensor's eigh calls (csrc/linalg/scalapack.c), which the plain
# program calls too.
EIGH_DRIVER = b"syevd"
# The process rows of the grid mpitensor's cyclic copy lies on, per op, for a
# [Shard(0)] matrix (csrc/linalg/scalapack_job.c): solve and eigh turn the P x 1
# grid to 1 x P.
PLAIN_ROWS = {"solve": 1, "eigh": 1}


def plain_link(library):
    """The linker's arguments for the ScaLAPACK mpitensor loaded (its path): MKL's
    libraries in the order they resolve one another (benchmarks/scalapack_plain.c's
    header), found where that one is, else Debian's."""
    if library is None or "libmkl_" not in os.path.basename(library):
        return ["-lscalapack-openmpi"]
    where = os.path.dirname(library)
    return [f"-L{where}", f"-Wl,--no-as-needed,-rpath,{where}",
            *(f"-l:{name}" for name in reversed(MKL_LIBRARIES))]


def plain_library(comm, folder):
    """benchmarks/scalapack_plain.c built by rank 0 into ``folder`` as a library
    (``MPICC``, default mpicc, linked to the ScaLAPACK mpitensor runs on: Debian's
    or MKL's), loaded on every rank; None and why not where it cannot be built.
    Collective."""
    out, why = os.path.join(folder, "scalapack_plain.so"), None
    if comm.rank == 0:
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scalapack_plain.c")
        cmd = [os.environ.get("MPICC", "mpicc"), "-O2", "-shared", "-fPIC", "-o", out, src,
               *plain_link(scalapack_library()), "-lm"]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            why = f"{' '.join(cmd)}: {getattr(e, 'stderr', None) or e}"
    why = comm.bcast(why, root=0)
    if why is not None:
        return None, why
    lib = ctypes.CDLL(out)
    lib.plain_once.restype = ctypes.c_double
    lib.plain_once.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_char_p, ctypes.POINTER(ctypes.c_double),
                               ctypes.POINTER(ctypes.c_int)]
    return lib, None


def plain_call(lib, op, n):
    """(call, its routine times, its check): one repetition of the plain program's
    ``op`` per call, with mpitensor's grid and block, the routine's own seconds
    (slowest rank) appended to the list."""
    seconds, check, info = [], ctypes.c_double(0), ctypes.c_int(0)

    def call():
        seconds.append(lib.plain_once(op.encode(), n, 0, PLAIN_ROWS[op], EIGH_DRIVER,
                                      ctypes.byref(check), ctypes.byref(info)))
        if info.value != 0:
            raise RuntimeError(f"the plain program's {op} returned INFO {info.value}")
    return call, seconds, check

def solve_error(a, x, b) -> float:
    """||A x - b|| / (||A|| ||x|| + ||b||): backward error of a solve."""
    return float(np.linalg.norm(a @ x - b) /
                 (np.linalg.norm(a) * np.linalg.norm(x) + np.linalg.norm(b)))


def square_problem(n):
    """A well-conditioned n x n matrix, its symmetric part and a right-hand side."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)
    return a, (a + a.T) / 2, rng.standard_normal(n)


def heat_square_calls(ht, a, s, b):
    """Heat's solve (of the gathered A) and eigh on split=0 DNDarrays, each with its check;
    an API this Heat lacks is recorded instead."""
    # b replicated: Heat's solve refuses a b split along its rows.
    ha, hs, hb = ht.array(a, split=0), ht.array(s, split=0), ht.array(b[:, None])
    want = np.linalg.eigvalsh(s)
    calls, errors = {}, {}
    # Heat's solve takes no A split along its matrix axes, and its distributed
    # inverse (Gauss-Jordan, row by row) is far slower: its best path gathers A
    # (resplit to None) and solves on every process.
    for op, call, check in (
            ("solve", lambda: ht.linalg.solve(ht.resplit(ha, None), hb),
             lambda x: solve_error(a, x.numpy()[:, 0], b)),
            ("eigh", lambda: ht.linalg.eigh(hs),
             lambda r: float(np.abs(np.sort(r[0].numpy()) - want).max() / np.abs(want).max()))):
        try:
            errors[op] = check(call())
            calls[op] = call
        except Exception as e:  # noqa: BLE001 - recorded, not timed
            errors[op] = f"{type(e).__name__}: {e}"
    return calls, errors


def square_point(comm, args, ht, op, n, peers, plain):
    """One op at size n: mpitensor on [Shard(0)] rows against ``peers`` (heat in the
    same processes, numpy on rank 0 alone) and the ``plain`` program's library (or
    None), each checked before it is timed."""
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    a, s, b = square_problem(n)
    da, ds = (mt.distribute_tensor(m, mesh, [Shard(0)]) for m in (a, s))
    db = mt.distribute_tensor(b, mesh, [Shard(0)])
    want = np.linalg.eigvalsh(s) if op == "eigh" else None
    mt_call = (lambda: np.linalg.solve(da, db)) if op == "solve" else (lambda: np.linalg.eigh(ds))
    numpy_call = (lambda: np.linalg.solve(a, b)) if op == "solve" else (lambda: np.linalg.eigh(s))
    got = mt_call()
    errors = {"mt": solve_error(a, got.full_tensor(), b) if op == "solve" else
              float(np.abs(got[0].full_tensor() - want).max() / np.abs(want).max())}
    timed = {"mt": mt_call}
    if "heat" in peers and ht is not None:
        calls, heat_errors = heat_square_calls(ht, a, s, b)
        errors["heat"] = heat_errors[op]
        if op in calls:
            timed["heat"] = calls[op]
    if plain is not None:
        timed["plain"], plain_seconds, plain_check = plain_call(plain, op, n)
    times = time_interleaved(comm, timed, args.reps, args.warmup)
    if plain is not None:
        # The routine's own time, not the call's (which makes the matrix first).
        times["plain"] = plain_seconds[-args.reps:]
        if op == "eigh":
            errors["plain (residual)"] = plain_check.value
    if "numpy" in peers:
        times["numpy"] = numpy_alone(comm, numpy_call, args.reps, args.warmup)
    point = {"op": op, "shape": [n, n], "dtype": "float64", "layout": "[Shard(0)]",
             "seconds": {k: summary(v) for k, v in times.items()},
             "mt_speedup": {k: ratio(v, times["mt"]) for k, v in times.items()
                            if k not in ("mt", "plain")},
             "error": errors}
    if plain is not None:
        point["mt_over_plain"] = ratio(times["mt"], times["plain"])
    return point


def scalapack_section(comm, args, ht):
    """solve and eigh of a row-sharded square matrix on ScaLAPACK: against Heat at
    n = 2,000 and against NumPy in one process at n = 4,000 (quick: 300 and 600)."""
    small, large = (300, 600) if args.quick else (args.square_n, args.square_n_numpy)
    # Rank 0's temporary directory, which every rank reads the library from.
    tmp = tempfile.TemporaryDirectory() if comm.rank == 0 else None
    try:
        plain, why = plain_library(comm, comm.bcast(tmp and tmp.name, root=0))
        if plain is None and comm.rank == 0:
            print(f"the plain ScaLAPACK program is left out: {why}")
        return [square_point(comm, args, ht, op, n, peers, plain)
                for n, peers in ((small, ("heat",)), (large, ("numpy",)))
                for op in ("solve", "eigh")]
    finally:
        comm.Barrier()
        if tmp is not None:
            tmp.cleanup()


SECTIONS = {"tsqr": tsqr_section, "scalapack": scalapack_section}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small matrix, two repetitions")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated, of {', '.join(SECTIONS)}")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--square-n", type=int, default=2_000,
                    help="n of the square section's comparison with Heat")
    ap.add_argument("--square-n-numpy", type=int, default=4_000,
                    help="n of the square section's comparison with one-process NumPy")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (7; quick 2)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<cpu>/...)")
    ap.add_argument("--scalapack", choices=("debian", "mkl"), default=None,
                    help="the ScaLAPACK of mpitensor and the plain program (default: "
                         "MPITENSOR_SCALAPACK's, else Debian's, else MKL's)")
    args = ap.parse_args()
    if args.scalapack:
        os.environ["MPITENSOR_SCALAPACK"] = args.scalapack
    args.reps = args.reps or (2 if args.quick else 7)
    comm = MPI.COMM_WORLD
    ht, why = heat_module()
    info = machine(comm)
    info["heat"] = ht.__version__ if ht is not None else f"not run ({why})"
    info["scalapack"] = scalapack_library() or "not found"
    results = {}
    for name in args.sections.split(","):
        results[name] = SECTIONS[name](comm, args, ht)
    if comm.rank == 0:
        print(machine_line(info) + f"; Heat {info['heat']}; np {comm.size}; "
              f"ScaLAPACK {info['scalapack']}")
        for name, points in results.items():
            for p in points:
                cells = "  ".join(f"{k} {s['median'] * 1e3:.1f}ms"
                                  for k, s in p["seconds"].items())
                over = (f"  mt/plain {p['mt_over_plain']['median']:.2f}"
                        if "mt_over_plain" in p else "")
                print(f"{name} {p['op']:4s} {p['shape']}  {cells}{over}  error {p['error']}")
        mkl = "libmkl_" in os.path.basename(info["scalapack"])
        path = args.out or result_path(f"linalg{'-mkl' if mkl else ''}-np{comm.size}.json")
        write_result(path, {"machine": info, "args": vars(args), "sections": results})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
