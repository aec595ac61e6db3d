"""NumPy functions on a sharded axis, the way a scientist calls them: ``np.sort``
(distributed sample sort), ``np.fft.fft`` (four-step method), ``np.fft.fft2``
(pencil method) and ``np.var`` (merged moments) of 2**24 float64 elements sharded
``[Shard(0)]``, against NumPy on the
whole array in one process and against gathering the array first
(``full_tensor()``) and computing on every rank, timed interleaved in one run.

    mpiexec -n 1 python benchmarks/numpy_ops.py       # then -n 2, -n 4
    mpiexec -n 2 python benchmarks/numpy_ops.py --elements 4096 --reps 2   # a quick check

Each repetition times the three ways of each operation one after the other (the
NumPy one on rank 0 alone, while the others wait at a barrier, so it has the
machine to itself as a one-process program would). The JSON keeps every time and
the bytes each rank sent (CommDebugMode) in the distributed and the gathering way.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor.debug import CommDebugMode
from _common import (machine, machine_line, ratio, result_path, summary,  # benchmarks/ is sys.path[0]
                     write_result)


def ops(n: int):
    """(name, the global shape, the NumPy call, the call on a DTensor) per operation:
    sort, fft and var of a vector, fft2 of a square-ish matrix of the same size."""
    rows = 1 << (int(np.log2(n)) // 2)
    return [
        ("sort", (n,), np.sort, np.sort),
        ("fft", (n,), np.fft.fft, np.fft.fft),
        ("fft2", (rows, n // rows), np.fft.fft2, np.fft.fft2),
        ("var", (n,), np.var, lambda x: np.var(x).full_tensor()),
    ]


def timed(comm, fn, on_rank0_only=False) -> float:
    comm.Barrier()
    start = time.perf_counter()
    if not on_rank0_only or comm.rank == 0:
        out = fn()
        if isinstance(out, mt.DTensor):
            out.to_local()
    comm.Barrier()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=2 ** 24)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<cpu>/...)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    rng = np.random.default_rng(0)
    info = machine(comm)
    results = []
    for name, shape, np_call, dt_call in ops(args.elements):
        full = rng.normal(size=shape) if comm.rank == 0 else None
        dt = mt.distribute_tensor(full if full is not None else np.empty(shape), mesh,
                                  [mt.Shard(0)], src_data_rank=0)
        ways = {
            "numpy_1proc": (lambda: np_call(full), True),
            "distributed": (lambda: dt_call(dt), False),
            "gather_then_numpy": (lambda: np_call(dt.full_tensor()), False),
        }
        sent = {}
        for way in ("distributed", "gather_then_numpy"):
            with CommDebugMode() as mode:
                ways[way][0]()
            sent[way] = int(sum(mode.get_comm_bytes().values()))
        times = {way: [] for way in ways}
        for way, (fn, alone) in ways.items():  # warm-up
            timed(comm, fn, alone)
        for _ in range(args.reps):
            for way, (fn, alone) in ways.items():
                times[way].append(timed(comm, fn, alone))
        results.append({"op": name, "shape": shape,
                        "seconds": {w: summary(t) for w, t in times.items()},
                        "speedup": {w: ratio(times["numpy_1proc"], t) for w, t in times.items()},
                        "bytes_sent_rank": sent})
        del dt, full
    if comm.rank == 0:
        print(machine_line(info))
        print(f"{args.elements} float64 elements, [Shard(0)] over {comm.size} ranks; "
              f"median of {args.reps} (seconds; speed-up over one-process NumPy)")
        for r in results:
            cells = "  ".join(f"{w} {s['median']:.4f} ({r['speedup'][w]['median']:.2f}x)"
                              for w, s in r["seconds"].items())
            print(f"{r['op']:5s} {cells}  bytes sent/rank: {r['bytes_sent_rank']}")
        path = args.out or result_path(f"numpy_ops-np{comm.size}.json")
        write_result(path, {"machine": info, "args": vars(args), "results": results})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
