"""Plans redistributions on simulated meshes far larger than this machine and shows
where the time model switches between per-mesh-dim collectives and one direct
exchange. No MPI: the planner is pure C, called through mpitensor._C.Plan with a
time model whose ranks_per_node places the simulated ranks on nodes.

    python benchmarks/simulate_plans.py                  # the built-in costs
    python benchmarks/simulate_plans.py --table PATH     # a calibrated table's
    python benchmarks/simulate_plans.py --quick          # fewer transitions

Meshes: (16, 16) = 256, (64, 64) = 4,096 and (8, 16, 128) = 16,384 ranks, with 8 or
64 ranks per node (row-major, so the last mesh dim is the innermost). Tensors:
float64 of 1 KiB to 1 GiB in all (4,096 rows, or fewer when smaller). For each
transition whose plan changes with the size, one line per size gives the plan's
steps and predicted time; the crossover is where it switches. The planning time
of each plan (wall clock, one core) is reported per mesh.
"""

import argparse
import itertools
import json
import sys
import time

import numpy as np

from mpitensor import Replicate, Shard, _C, _timemodel
from mpitensor._layout import _codes

KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3
MESHES = [(16, 16), (64, 64), (8, 16, 128)]
SIZES = [KiB * 16 ** k for k in range(6)]  # 1 KiB .. 1 GiB
SHORT = {"all_gather": "AG", "all_to_all": "A2A", "chunk": "cut", "direct": "DIRECT",
         "all_reduce": "AR", "reduce_scatter": "RS"}


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def shape_for(nbytes: int) -> tuple[int, int]:
    elems = max(nbytes // 8, 1)
    rows = min(4096, elems)
    return rows, max(elems // rows, 1)


def name(placements) -> str:
    return "[" + ",".join("R" if isinstance(p, Replicate) else f"S{p.dim}"
                          for p in placements) + "]"


def transitions(ndim: int, quick: bool):
    opts = [Replicate(), Shard(0), Shard(1)]
    pairs = [(a, b) for a in itertools.product(opts, repeat=ndim)
             for b in itertools.product(opts, repeat=ndim) if a != b]
    if quick or ndim > 2:
        # 3-D: the moves that change a shard's mesh dim or tensor dim, and gathers.
        keep = []
        for a, b in pairs:
            moved = sum(x != y for x, y in zip(a, b))
            if moved >= 2 and all(isinstance(x, Shard) or isinstance(y, Shard)
                                  for x, y in zip(a, b) if x != y):
                keep.append((a, b))
        pairs = keep[::3] if ndim > 2 else keep
    return pairs


def plan(shape, mesh, a, b, model):
    t0 = time.perf_counter()
    p = _C.Plan(shape, mesh, _codes(a), _codes(b), "f8", model)
    return p, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", help="a calibrated table (default: the built-in costs)")
    ap.add_argument("--quick", action="store_true", help="fewer transitions")
    ap.add_argument("--per-node", default="8,64", help="ranks per node to simulate")
    ap.add_argument("--json", help="write every plan's choice and time here")
    args = ap.parse_args()
    base = _C.default_time_model()
    if args.table:
        base = _timemodel.read_table(args.table) + (0,)
    print(f"time model: alpha shm {base[0] * 1e6:g} us, beta shm {base[1] * 1e9:g} ns/B, "
          f"alpha net {base[2] * 1e6:g} us, beta net {base[3] * 1e9:g} ns/B, "
          f"call {base[4] * 1e6:g} us, copy {base[5] * 1e9:g} ns/B, "
          f"reduce {base[6] * 1e9:g} ns/B" + (f" (from {args.table})" if args.table else
                                               " (built-in)"))
    records, switches = [], 0
    for mesh in MESHES:
        numel = int(np.prod(mesh))
        for per_node in [int(x) for x in args.per_node.split(",")]:
            model = tuple(base[:7]) + (per_node,)
            slowest = 0.0
            print(f"\n== mesh {mesh} ({numel} ranks), {per_node} ranks per node ==")
            for a, b in transitions(len(mesh), args.quick):
                row = []
                for size in SIZES:
                    p, took = plan(shape_for(size), mesh, a, b, model)
                    slowest = max(slowest, took)
                    steps = "+".join(SHORT[s[0]] for s in p.steps() if s[0] != "chunk")
                    row.append((size, steps or "cut", p.time, p.bytes))
                    records.append({"mesh": mesh, "per_node": per_node, "src": name(a),
                                    "dst": name(b), "bytes": size, "plan": steps,
                                    "predicted_s": p.time, "moved_bytes": p.bytes,
                                    "planning_s": took})
                kinds = [r[1] for r in row]
                if len(set(kinds)) == 1:
                    continue
                switches += 1
                where = [f"{fmt_bytes(s)}: {k} {t * 1e6:.3g} us"
                         for s, k, t, _ in row]
                flips = [fmt_bytes(row[i][0]) for i in range(1, len(row))
                         if kinds[i] != kinds[i - 1]]
                print(f"{name(a)} -> {name(b)}: switches at {', '.join(flips)}")
                print("    " + "; ".join(where))
            print(f"   slowest plan on this mesh: {slowest * 1e3:.2f} ms")
    print(f"\n{switches} transition/mesh pairs switch plans with the size")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
