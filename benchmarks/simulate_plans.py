"""Plans redistributions on meshes far larger than this machine, on nodes of 64 and
128 ranks, and prices them against torch's per-mesh-dim steps. No MPI: the planner
is pure C, called through mpitensor._plan.Plan with a time model whose ranks_per_node
places the simulated ranks on nodes (row-major: the last mesh dim innermost).

    python benchmarks/simulate_plans.py                  # the study below, JSON written
    python benchmarks/simulate_plans.py --table PATH     # a calibrated table's costs
    python benchmarks/simulate_plans.py --switches       # where plans switch with size

The study: 128 to 16,384 ranks, as a 1-D mesh of every rank and as a (nodes,
local) mesh of as many nodes of 64 or 128 ranks, the way torch users lay data
parallelism across nodes and tensor parallelism inside them. The common moves: on
the 1-D mesh an all-gather, an all-reduce, a reduce-scatter and an all-to-all; on
the (nodes, local) mesh a full_tensor of a 2-D sharded tensor, the gradient
all-reduce of a tensor replicated inside the nodes (data parallelism), the
all-gather of such a tensor (fully sharded data parallelism), a Partial on both
dims, the gradient reduce-scatter of a tensor sharded inside the nodes, and a
transpose of shards. float64 of 1 MiB, 64 MiB and 1 GiB in all. For each, the
plan, its modelled time and bytes between nodes, and torch's steps priced by the
same model (Plan.torch()), go to benchmarks/results/CPU/simulate_plans-np1.json
(the CPU names where the planning time was measured); benchmarks/tables.py
summarises them in docs/performance.md.

--switches prints, for meshes (16, 16), (64, 64) and (8, 16, 128) on nodes of 8 and
64, each transition whose plan changes with the tensor's size, and where.
"""

import argparse
import itertools
import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import machine, machine_line, result_path, write_result  # noqa: E402

from mpitensor import Partial, Replicate, Shard, _timemodel, _comm, _plan  # noqa: E402
from mpitensor._layout import _codes  # noqa: E402

KiB, MiB, GiB = 1024, 1024 ** 2, 1024 ** 3
SHORT = {"all_gather": "AG", "all_to_all": "A2A", "chunk": "cut", "direct": "direct",
         "all_reduce": "AR", "reduce_scatter": "RS", "all_reduce_nodes": "AR(nodes)"}

# The study: ranks, nodes of which size, the moves of each mesh and the sizes.
RANKS = [128, 1024, 4096, 16384]
PER_NODE = [64, 128]
SCALE_SIZES = [MiB, 64 * MiB, GiB]
S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
MOVES_1D = [("all-gather", (S0,), (R,)), ("all-reduce", (P,), (R,)),
            ("reduce-scatter", (P,), (S0,)), ("all-to-all", (S0,), (S1,))]
MOVES_2D = [("full_tensor", (S0, S1), (R, R)),
            ("DP gradient all-reduce", (P, R), (R, R)),
            ("FSDP all-gather", (S0, R), (R, R)),
            ("Partial on both dims", (P, P), (R, R)),
            ("FSDP gradient reduce-scatter", (P, S1), (S0, S1)),
            ("transpose of shards", (S0, S1), (S1, S0))]

# --switches: the meshes and node sizes, 1 KiB to 1 GiB.
MESHES = [(16, 16), (64, 64), (8, 16, 128)]
SIZES = [KiB * 16 ** k for k in range(6)]


def fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def shape_for(nbytes: int) -> tuple[int, int]:
    elems = max(nbytes // 8, 1)
    rows = min(4096, elems)
    return rows, max(elems // rows, 1)


def scale_shape(nbytes: int, ranks: int) -> tuple[int, int]:
    """float64 of `nbytes` as (rows, columns) that both mesh dims can cut: as many
    rows as ranks where the tensor has that many elements."""
    elems = max(nbytes // 8, 1)
    rows = min(ranks, elems)
    return rows, max(elems // rows, 1)


def name(placements) -> str:
    return "[" + ",".join("R" if isinstance(p, Replicate) else "P" if isinstance(p, Partial)
                          else f"S{p.dim}" for p in placements) + "]"


def steps_of(plan) -> str:
    return "+".join(f"{SHORT[s[0]]}@{s[1]}" if s[1] >= 0 else SHORT[s[0]]
                    for s in plan.steps()) or "none"


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
    p = _plan.Plan(shape, mesh, _codes(a), _codes(b), "f8", model)
    return p, time.perf_counter() - t0


def scale_record(ranks, per_node, mesh, what, a, b, size, base) -> dict:
    """One move of the study: the plan, torch's steps, both priced by the model."""
    shape = scale_shape(size, ranks)
    p, took = plan(shape, mesh, a, b, base + (per_node,))
    t = p.torch()
    blind = _plan.Plan(shape, mesh, _codes(a), _codes(b), "f8", base + (0,))
    return {"ranks": ranks, "per_node": per_node, "mesh": list(mesh), "move": what,
            "src": name(a), "dst": name(b), "bytes": size, "shape": list(shape),
            "plan": steps_of(p), "predicted_s": p.time, "net_bytes": p.net_bytes,
            "moved_bytes": p.bytes,
            "torch_plan": steps_of(t) if t is not None else None,
            "torch_s": t.time if t is not None else None,
            "torch_net_bytes": p.torch_bytes()[1],
            "node_blind_plan": steps_of(blind),
            "node_blind_s": blind.predict(base + (per_node,)),
            "planning_s": took}


def scale(base, out, quiet) -> int:
    """The study: every mesh, node size, move and size; the JSON to `out`."""
    records = []
    for ranks, per_node in itertools.product(RANKS, PER_NODE):
        if per_node >= ranks:
            continue
        for mesh, moves in (((ranks,), MOVES_1D), ((ranks // per_node, per_node), MOVES_2D)):
            for (what, a, b), size in itertools.product(moves, SCALE_SIZES):
                r = scale_record(ranks, per_node, mesh, what, a, b, size, base)
                records.append(r)
                if not quiet:
                    ratio = f"{r['torch_s'] / r['predicted_s']:.2f}x" if r["torch_s"] else "-"
                    print(f"{ranks:>6} ranks, nodes of {per_node:>3}, mesh {str(tuple(mesh)):<11} "
                          f"{what:<28} {fmt_bytes(size):>7}: {r['plan']:<22} "
                          f"{r['predicted_s'] * 1e3:9.3f} ms; torch {r['torch_plan']} "
                          f"{(r['torch_s'] or 0) * 1e3:9.3f} ms ({ratio})")
    info = machine(MPI.COMM_SELF)
    write_result(out, {"machine": info, "model": list(base), "link": model_text(base),
                       "records": records})
    print(f"wrote {out}: {len(records)} moves; slowest planning "
          f"{max(r['planning_s'] for r in records) * 1e3:.1f} ms")
    return 0


def model_text(base) -> str:
    return (f"shared memory {base[0] * 1e6:g} us + {base[1] * 1e9:g} ns/B, network "
            f"{base[2] * 1e6:g} us + {base[3] * 1e9:g} ns/B per node link, "
            f"{base[4] * 1e6:g} us per step, copies {base[5] * 1e9:g} ns/B, "
            f"reductions {base[6] * 1e9:g} ns/B")


def switches(base, per_nodes, quick) -> int:
    switched = 0
    for mesh in MESHES:
        numel = int(np.prod(mesh))
        for per_node in per_nodes:
            model = tuple(base[:7]) + (per_node,)
            slowest = 0.0
            print(f"\n== mesh {mesh} ({numel} ranks), {per_node} ranks per node ==")
            for a, b in transitions(len(mesh), quick):
                row = []
                for size in SIZES:
                    p, took = plan(shape_for(size), mesh, a, b, model)
                    slowest = max(slowest, took)
                    row.append((size, steps_of(p), p.time))
                kinds = [r[1] for r in row]
                if len(set(kinds)) == 1:
                    continue
                switched += 1
                where = [f"{fmt_bytes(s)}: {k} {t * 1e6:.3g} us" for s, k, t in row]
                flips = [fmt_bytes(row[i][0]) for i in range(1, len(row))
                         if kinds[i] != kinds[i - 1]]
                print(f"{name(a)} -> {name(b)}: switches at {', '.join(flips)}")
                print("    " + "; ".join(where))
            print(f"   slowest plan on this mesh: {slowest * 1e3:.2f} ms")
    print(f"\n{switched} transition/mesh pairs switch plans with the size")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", help="a calibrated table (default: the built-in costs)")
    ap.add_argument("--switches", action="store_true",
                    help="where plans switch with the size, instead of the study")
    ap.add_argument("--quick", action="store_true", help="--switches: fewer transitions")
    ap.add_argument("--per-node", default="8,64", help="--switches: ranks per node")
    ap.add_argument("--out", help="the study's JSON (default: benchmarks/results/CPU/"
                    "simulate_plans-np1.json)")
    ap.add_argument("--quiet", action="store_true", help="the study: no line per move")
    args = ap.parse_args()
    base = tuple(_comm.default_time_model()[:7])
    if args.table:
        base = tuple(_timemodel.read_table(args.table))
    print(machine_line(machine(MPI.COMM_SELF)))
    print("time model: " + model_text(base)
          + (f" (from {args.table})" if args.table else " (built-in)"))
    if args.switches:
        return switches(base, [int(x) for x in args.per_node.split(",")], args.quick)
    return scale(base, args.out or result_path("simulate_plans-np1.json"), args.quiet)


if __name__ == "__main__":
    sys.exit(main())
