"""Whether the time model ranks a redistribution's candidate plans as they measure.

    make plan-ranking                   # both link classes at 4 ranks, one after the other
    mpiexec -n 4 python benchmarks/plan_ranking.py                 # shared memory
    mpiexec -n 4 --mca btl self,tcp python benchmarks/plan_ranking.py --link net
    mpiexec -n 2 python benchmarks/plan_ranking.py --sizes 1KiB,1MiB --reps 5

Every 1-D transition (on a mesh of all ranks) and, at 4 ranks, every pair on a
(2, 2) mesh, of float64 tensors of 1 KiB to 64 MiB in all. The candidates of a
transition are the distinct plans the planner makes under three models: the one
meshes use (a calibrated table if any: `make calibrate`), bytes first (messages
free) and rounds first (bytes nearly free), so the direct exchange and the chain
of per-dim collectives both appear where they differ. Each candidate is run by
the C executor (median of --reps) and predicted by the mesh's model; a mismatch
is a transition where the model's choice measures more than --tolerance slower
than the fastest candidate; an order disagreement is a pair of candidates the
model orders one way and the clock, beyond --tolerance, the other. `--link net`
prices every step on the network class (each rank its own node), as a run over
`--mca btl self,tcp` moves every byte through TCP. Each candidate is timed --reps
times, fewer (at least 3) once the slowest rank has spent --budget seconds on it,
which keeps a run at 4 ranks to minutes per link class. It times: run it on a
quiet machine. Prints the machine, then the mismatches and a summary; --out
writes every figure as JSON.
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


def timed(comm, mesh, plan, local, reps: int, budget: float) -> float:
    times = []
    for i in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        _C.redistribute(mesh._handle, plan, local)
        times.append(time.perf_counter() - t0)
        # Every rank stops at the same repetition: the slowest rank's total decides.
        if i >= 3 and comm.allreduce(sum(times[1:]), op=MPI.MAX) > budget:
            break
    # The slowest rank's time is the step's time.
    return comm.allreduce(statistics.median(times[1:]), op=MPI.MAX)


def order_disagreements(row, tolerance: float) -> list:
    """Pairs of candidates the model orders one way and the clock the other.

    >>> order_disagreements([{"plan": "a", "predicted_s": 1, "measured_s": 3},
    ...                      {"plan": "b", "predicted_s": 2, "measured_s": 1}], 0.1)
    [('a', 'b')]
    """
    out = []
    for x, y in itertools.combinations(row, 2):
        if x["predicted_s"] > y["predicted_s"]:
            x, y = y, x
        if x["predicted_s"] < y["predicted_s"] and \
                x["measured_s"] > y["measured_s"] * (1 + tolerance):
            out.append((x["plan"], y["plan"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1KiB,16KiB,256KiB,4MiB,64MiB")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tolerance", type=float, default=0.10,
                    help="how much slower than the fastest candidate the model's "
                         "choice may measure before it counts as a mismatch")
    ap.add_argument("--budget", type=float, default=0.5,
                    help="seconds per candidate after which timing stops (>= 3 reps)")
    ap.add_argument("--link", choices=("shm", "net"), default="shm",
                    help="the link class the run exercises: net prices every step "
                         "on the network (run it over --mca btl self,tcp)")
    ap.add_argument("--label", help="the transport, for the output (default: --link)")
    ap.add_argument("--out", help="JSON file for every figure")
    args = ap.parse_args()
    args.label = args.label or args.link
    started = time.perf_counter()
    comm = MPI.COMM_WORLD
    info = machine(comm)
    if comm.rank == 0:
        print(machine_line(info) + f"; transport {args.label}; revision "
              f"{git_revision(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}")
    meshes = [(comm.size,)] + ([(2, 2)] if comm.size == 4 else [])
    records, mismatches, total, disagreements = [], 0, 0, 0
    for mesh_shape in meshes:
        mesh = mt.init_device_mesh("cpu", mesh_shape)
        model = mesh._handle.time_model()
        if args.link == "net":
            model = tuple(model[:5]) + (1,)  # every rank its own node
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
                                "measured_s": timed(comm, mesh, p, local, args.reps,
                                                    args.budget),
                                "bytes": p.bytes, "chosen": key == chosen})
                fastest = min(r["measured_s"] for r in row)
                pick = next(r for r in row if r["chosen"])
                bad = pick["measured_s"] > fastest * (1 + args.tolerance)
                total += 1
                mismatches += bad
                order = order_disagreements(row, args.tolerance)
                disagreements += len(order)
                records.append({"mesh": mesh_shape, "src": name(a), "dst": name(b),
                                "bytes": size, "candidates": row, "mismatch": bad,
                                "order_disagreements": order})
                if bad and comm.rank == 0:
                    cands = "; ".join(
                        f"{r['plan']}: predicted {r['predicted_s'] * 1e6:.3g} us, "
                        f"measured {r['measured_s'] * 1e6:.3g} us" for r in row)
                    print(f"MISMATCH {mesh_shape} {name(a)}->{name(b)} {size} B: {cands}")
                if order and comm.rank == 0:
                    print(f"ORDER {mesh_shape} {name(a)}->{name(b)} {size} B: the model "
                          "puts " + "; ".join(f"{x} before {y}" for x, y in order) +
                          ", the clock the other way")
    if comm.rank == 0:
        print(f"{args.label}: {total} transitions with more than one candidate; the "
              f"model's choice measured more than {args.tolerance:.0%} slower than the "
              f"fastest in {mismatches}; {disagreements} candidate pairs ordered the "
              f"other way; {time.perf_counter() - started:.0f} s")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"machine": info, "transport": args.label, "link": args.link,
                           "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
