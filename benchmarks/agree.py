"""The cost of one agreement across ranks (``_comm.agree``: the all-reduce of status and
fingerprint that mesh creation, distribute_tensor, redistribute and a program's NumPy
calls run), against a raw mpi4py ``Allreduce`` of the same three int64 on the same
ranks; and what it adds to a small NumPy call: ``np.sum(dt, axis=1)``, which a program
makes and the ranks agree on, against ``dt.sum(axis=1)``, the same call by the
reduction method of the C base, agreed alike (the two forms are one call); and
``np.cumsum(dt, axis=1)`` and ``dt.cumsum(axis=1)`` (a method agreed as the function
is) against NumPy's
``cumsum`` of the local block; and indexing, agreed at every index: ``rep[3]`` and
``rep[3] = 1.0`` of a Replicate DTensor (one agreement each, where the index was local)
against the same on the local block, and ``dt[1:5]`` of a sharded one (its agreement
rides in the exchange's). Timed interleaved in one run.

    mpiexec -n 2 python benchmarks/agree.py [--calls 2000] [--reps 15]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import _comm
from _common import (machine, machine_line, per_call_us, result_path,  # benchmarks/ is sys.path[0]
                     summary, write_result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per repetition")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<cpu>/...)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD.Dup()
    mesh = mt.init_device_mesh("cpu", (comm.size,))
    status, out = np.zeros(3, np.int64), np.zeros(3, np.int64)

    def agree():
        _comm.agree(mesh, True, 7, "unused")

    def raw():
        comm.Allreduce(status, out, MPI.MAX)

    dt = mt.distribute_tensor(np.ones((64 * comm.size, 16)), mesh, [mt.Shard(0)])

    def np_sum():
        np.sum(dt, axis=1)

    def method_sum():
        dt.sum(axis=1)

    local = dt.to_local()

    def np_cumsum():
        np.cumsum(dt, axis=1)

    def method_cumsum():
        dt.cumsum(axis=1)

    def local_cumsum():
        np.cumsum(local, axis=1)

    rep = mt.distribute_tensor(np.ones((64, 16)), mesh, [mt.Replicate()])
    rep_local = rep.to_local()

    def index():
        rep[3]

    def local_index():
        rep_local[3]

    def index_write():
        rep[3] = 1.0

    def local_write():
        rep_local[3] = 1.0

    def index_exchange():
        dt[1:5]

    info = machine(comm)
    calls = (("agree", agree), ("raw", raw), ("np_sum", np_sum), ("method_sum", method_sum),
             ("np_cumsum", np_cumsum), ("method_cumsum", method_cumsum),
             ("local_cumsum", local_cumsum), ("index", index), ("local_index", local_index),
             ("index_write", index_write), ("local_write", local_write),
             ("index_exchange", index_exchange))
    times = {name: [] for name, _ in calls}
    for name, fn in calls:  # warm-up
        per_call_us(fn, args.calls // 4)
    for _ in range(args.reps):
        for name, fn in calls:
            comm.Barrier()
            times[name].append(per_call_us(fn, args.calls))
    if comm.rank == 0:
        print(machine_line(info))
        for name, t in times.items():
            print(f"{name:13s} {statistics.median(t):6.2f} us per call "
                  f"[{min(t):.2f}..{max(t):.2f}]")
        med = {k: statistics.median(t) for k, t in times.items()}
        print(f"a program's np.sum over the method's: {med['np_sum'] / med['method_sum']:.2f}x")
        print(f"over NumPy's cumsum of the local block: np.cumsum "
              f"+{med['np_cumsum'] - med['local_cumsum']:.2f} us, dt.cumsum "
              f"+{med['method_cumsum'] - med['local_cumsum']:.2f} us")
        print(f"over the local block's: rep[3] +{med['index'] - med['local_index']:.2f} us, "
              f"rep[3] = 1.0 +{med['index_write'] - med['local_write']:.2f} us")
        path = args.out or result_path(f"agree-np{comm.size}.json")
        write_result(path, {"machine": info, "args": vars(args),
                            "per_call_us": {k: summary(t) for k, t in times.items()}})
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
