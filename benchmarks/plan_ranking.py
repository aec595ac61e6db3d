"""Whether the time model ranks a redistribution's candidate plans as they measure.

    mpiexec -n 4 python benchmarks/plan_ranking.py                 # shared memory
    mpiexec -n 4 --mca btl self,tcp python benchmarks/plan_ranking.py --label tcp
    mpiexec -n 2 python benchmarks/plan_ranking.py --sizes 1KiB,1MiB --reps 5

Every 1-D transition (on a mesh of all ranks) and, at 4 ranks, every pair on a
(2, 2) mesh, of float64 tensors of 1 KiB to 64 MiB in all. The candidates of a
transition are the distinct plans the planner makes under three models: the one
meshes use (a calibrated table if any: `make calibrate`), bytes first (messages
free) and rounds first (bytes nearly free), so the direct exchange and the chain
of per-dim collectives both appear where they differ. Each candidate is run by
the C executor (median of --reps) and predicted by the mesh's model; a mismatch
is a transition where the model's choice measures more than --tolerance slower
than the fastest candidate. It times: run it on a quiet machine. Prints the
machine, then the mismatches and a summary; --out writes every figure as JSON.
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import git_revision, machine, machine_line  # noqa: E402

import mpitensor as mt  # noqa: E402
from mpitensor import Partial, Replicate, Shard, _C  # noqa: E402
from mpitensor._layout import _codes  # noqa: E402

KiB, MiB = 1024, 1024 * 1024


def parse_size(text: str) -> int:
    t = text.strip()
    for unit, mult in (("GiB", 1024 * MiB), ("MiB", MiB), ("KiB", KiB)):
        if t.endswith(unit):
            return int(float(t[:-len(unit)]) * mult)
    return int(t)


def name(placements) -> str:
    out = []
    for p in placements:
        out.append("R" if isinstance(p, Replicate) else "P" if isinstance(p, Partial)
                   else f"S{p.dim}")
    return "[" + ",".join(out) + "]"


def pairs(ndim: int):
    src_opts = [Replicate(), Shard(0), Shard(1), Partial()]
    dst_opts = [Replicate(), Shard(0), Shard(1)]
    for a in itertools.product(src_opts, repeat=ndim):
        for b in itertools.product(dst_opts, repeat=ndim):
            if a != b:
                yield a, b


def timed(comm, mesh, plan, local, reps: int) -> float:
    times = []
    for _ in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        _C.redistribute(mesh._handle, plan, local)
        times.append(time.perf_counter() - t0)
    # The slowest rank's time is the step's time.
    return comm.allreduce(statistics.median(times[1:]), op=MPI.MAX)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1KiB,16KiB,256KiB,4MiB,64MiB")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tolerance", type=float, default=0.10,
                    help="how much slower than the fastest candidate the model's "
                         "choice may measure before it counts as a mismatch")
    ap.add_argument("--label", default="shm", help="the transport, for the output")
    ap.add_argument("--out", help="JSON file for every figure")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    info = machine(comm)
    if comm.rank == 0:
        print(machine_line(info) + f"; transport {args.label}; revision "
              f"{git_revision(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}")
    meshes = [(comm.size,)] + ([(2, 2)] if comm.size == 4 else [])
    records, mismatches, total = [], 0, 0
    for mesh_shape in meshes:
        mesh = mt.init_device_mesh("cpu", mesh_shape)
        model = mesh._handle.time_model()
        flat = (0.0, model[3], 0.0, model[3], 0.0, model[5])     # bytes first
        rounds = (model[2], 1e-15, model[2], 1e-15, model[4], model[5])  # rounds first
        for size in (parse_size(s) for s in args.sizes.split(",")):
            elems = max(size // 8, 1)
            rows = min(elems, 64 * comm.size)
            shape = (rows, max(elems // rows, 1))
            full = np.arange(shape[0] * shape[1], dtype="f8").reshape(shape)
            for a, b in pairs(len(mesh_shape)):
                plans = {}
                for m in (model, flat, rounds):
                    try:
                        p = _C.Plan(shape, mesh_shape, _codes(a), _codes(b), "f8", m)
                    except (RuntimeError, TypeError):
                        break
                    key = tuple((s[0], s[1]) for s in p.steps())
                    plans.setdefault(key, p)
                if len(plans) < 2:
                    continue
                # A Partial dim's local array has its Replicate shape; values do
                # not matter for the time.
                held = [Replicate() if isinstance(p, Partial) else p for p in a]
                local = mt.distribute_tensor(full, mesh, held).to_local()
                chosen = next(iter(plans))  # planned under the mesh's model first
                row = []
                for key, p in plans.items():
                    label = "+".join(f"{k}@{d}" if d >= 0 else k for k, d in key)
                    row.append({"plan": label,
                                "predicted_s": p.predict(model),
                                "measured_s": timed(comm, mesh, p, local, args.reps),
                                "bytes": p.bytes, "chosen": key == chosen})
                fastest = min(r["measured_s"] for r in row)
                pick = next(r for r in row if r["chosen"])
                bad = pick["measured_s"] > fastest * (1 + args.tolerance)
                total += 1
                mismatches += bad
                records.append({"mesh": mesh_shape, "src": name(a), "dst": name(b),
                                "bytes": size, "candidates": row, "mismatch": bad})
                if bad and comm.rank == 0:
                    cands = "; ".join(
                        f"{r['plan']}: predicted {r['predicted_s'] * 1e6:.3g} us, "
                        f"measured {r['measured_s'] * 1e6:.3g} us" for r in row)
                    print(f"MISMATCH {mesh_shape} {name(a)}->{name(b)} {size} B: {cands}")
    if comm.rank == 0:
        print(f"{total} transitions with more than one candidate; the model's choice "
              f"measured more than {args.tolerance:.0%} slower than the fastest in "
              f"{mismatches}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"machine": info, "transport": args.label,
                           "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
