"""Whether the time model ranks a redistribution's candidate plans as they measure.

    make plan-ranking                   # both link classes at 4 ranks, one after the other
    make bench-multinode                # across 2 simulated hosts of 2 ranks (--link hosts)
    mpiexec -n 4 python benchmarks/plan_ranking.py                 # shared memory
    mpiexec -n 4 --mca btl self,tcp python benchmarks/plan_ranking.py --link net
    mpiexec -n 2 python benchmarks/plan_ranking.py --sizes 1KiB,1MiB --reps 5
    python benchmarks/plan_ranking.py --replay benchmarks/results/amd-epyc/plan_ranking_shm-np4.json
    python benchmarks/plan_ranking.py --replay FILE.json --table time_model.json

Every 1-D transition (on a mesh of all ranks) and, at 4 ranks, every pair on a
(2, 2) mesh, of float64 tensors of 1 KiB to 64 MiB in all. The candidates of a
transition are the distinct plans the planner makes under four models: the one
meshes use (a calibrated table if any: `make calibrate`), the same without local
passes (copies and reductions free), bytes first (messages and local passes
free) and rounds first (bytes nearly free), so the direct exchange and the chain
of per-dim collectives both appear where they differ. Each candidate is run by
the C executor (median of --reps) and predicted by the mesh's model; a mismatch
is a transition where the model's choice measures more than --tolerance slower
than the fastest candidate; an order disagreement is a pair of candidates the
model orders one way and the clock, beyond --tolerance, the other. `--link net`
prices every step on the network class (each rank its own node), as a run over
`--mca btl self,tcp` moves every byte through TCP. `--link hosts` keeps the node
layout the mesh learnt (ranks on several hosts: tests/multinode/run.sh bench) and
adds the plan the same costs give a planner that ignores nodes (ranks_per_node
0), so each row also says what knowing the nodes changed, measured. Each candidate is timed --reps
times, fewer (at least 3) once the slowest rank has spent --budget seconds on it,
which keeps a run at 4 ranks to minutes per link class. It times: run it on a
quiet machine. Prints the machine, then the mismatches and a summary, and writes
every figure as JSON (--out; by default benchmarks/results/<cpu>/
plan_ranking_<label>-np<N>.json, which benchmarks/tables.py summarises in
docs/performance.md).

`--replay FILE` times nothing and needs no mpiexec: it plans the transitions of
a file --out wrote again, under the built-in model or the table --table names,
and ranks the stored measurements by it: the model's choice, the candidates it predicts, the same
mismatch summary. A choice that the file did not measure is counted apart, as
are stored candidates that no planning model reproduces (they are left out).
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
from _common import machine, machine_line, result_path, write_result  # noqa: E402

import mpitensor as mt  # noqa: E402
from mpitensor import Partial, Replicate, Shard, _timemodel, _comm, _plan  # noqa: E402
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
    go, times = _plan.runner(mesh, plan, local), []
    for i in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        go(local)
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


def planning_models(model, blind: bool = False) -> tuple:
    """The models whose plans are the candidates: `model` first, then it without
    local passes, bytes first and rounds first (ranks per node as in `model`), and
    with `blind` `model` on one node: the plan of a planner that ignores nodes."""
    a_shm, b_shm, a_net, b_net, call, copy, reduce, per_node = model
    return (model,
            (a_shm, b_shm, a_net, b_net, call, 0.0, 0.0, per_node),
            (0.0, b_net, 0.0, b_net, 0.0, 0.0, 0.0, per_node),       # bytes first
            (a_shm, 1e-15, a_net, 1e-15, call, 0.0, 0.0, per_node)   # rounds first
            ) + ((model[:7] + (0,),) if blind else ())


def label_of(plan) -> str:
    return "+".join(f"{k}@{d}" if d >= 0 else k for k, d, *_ in plan.steps())


def candidates(shape, mesh_shape, a, b, models) -> dict:
    """{label: plan} of the distinct plans under `models`, the first model's first;
    empty when the move is refused."""
    plans = {}
    for m in models:
        try:
            p = _plan.Plan(shape, mesh_shape, _codes(a), _codes(b), "f8", m)
        except (RuntimeError, TypeError):
            return {}
        plans.setdefault(label_of(p), p)
    return plans


def blind_label(shape, mesh_shape, a, b, model) -> str:
    """The label of the plan `model`'s costs give on one node: what a planner that
    ignores the nodes would run."""
    return label_of(_plan.Plan(shape, mesh_shape, _codes(a), _codes(b), "f8",
                            model[:7] + (0,)))


def shape_for(size: int, ranks: int) -> tuple[int, int]:
    elems = max(size // 8, 1)
    rows = min(elems, 64 * ranks)
    return rows, max(elems // rows, 1)


def verdict(row, tolerance: float):
    """(the chosen candidate measured beyond tolerance of the fastest, the order
    disagreements) of a row of candidates, one of them chosen."""
    fastest = min(r["measured_s"] for r in row)
    pick = next(r for r in row if r["chosen"])
    return (pick["measured_s"] > fastest * (1 + tolerance),
            order_disagreements(row, tolerance))


def report(mesh_shape, a, b, size, row, bad, order) -> None:
    if bad:
        cands = "; ".join(f"{r['plan']}: predicted {r['predicted_s'] * 1e6:.3g} us, "
                          f"measured {r['measured_s'] * 1e6:.3g} us" for r in row)
        print(f"MISMATCH {tuple(mesh_shape)} {a}->{b} {size} B: {cands}")
    if order:
        print(f"ORDER {tuple(mesh_shape)} {a}->{b} {size} B: the model puts " +
              "; ".join(f"{x} before {y}" for x, y in order) + ", the clock the other way")


def report_blind(mesh_shape, a, b, size, row) -> None:
    """One line where knowing the nodes changed the plan: both, as measured."""
    aware = next(r for r in row if r["chosen"])
    blind = next(r for r in row if r["node_blind"])
    print(f"NODES {tuple(mesh_shape)} {a}->{b} {size} B: {aware['plan']} measured "
          f"{aware['measured_s'] * 1e6:.3g} us (predicted {aware['predicted_s'] * 1e6:.3g}), "
          f"the node-blind {blind['plan']} {blind['measured_s'] * 1e6:.3g} us "
          f"(predicted {blind['predicted_s'] * 1e6:.3g}): "
          f"{blind['measured_s'] / aware['measured_s']:.2f}x")


def measure(args, comm) -> list:
    """Times every candidate of every transition; the records, printed as found."""
    meshes = [(comm.size,)] + ([(2, 2)] if comm.size == 4 else [])
    records = []
    if args.link == "net":
        # Ranks on different nodes cannot copy from each other's memory: the
        # ranks of this one node must not either, or large exchanges would be
        # timed by a path the network class never takes. Every rank reads the
        # same argument, so every rank's mesh decides alike.
        os.environ["MPITENSOR_DIRECT_READ"] = "0"
    for mesh_shape in meshes:
        mesh = mt.init_device_mesh("cpu", mesh_shape)
        model = _comm.mesh_time_model(mesh)
        if args.link == "net":
            model = tuple(model[:7]) + (1,)  # every rank its own node
        hosts = args.link == "hosts"
        for size in (parse_size(s) for s in args.sizes.split(",")):
            shape = shape_for(size, comm.size)
            full = np.arange(shape[0] * shape[1], dtype="f8").reshape(shape)
            for a, b in pairs(len(mesh_shape)):
                plans = candidates(shape, mesh_shape, a, b, planning_models(model, hosts))
                if len(plans) < 2:
                    continue
                # A Partial dim's local array has its Replicate shape; values do
                # not matter for the time.
                held = [Replicate() if isinstance(p, Partial) else p for p in a]
                local = mt.distribute_tensor(full, mesh, held).to_local()
                chosen = next(iter(plans))  # planned under the mesh's model first
                blind = blind_label(shape, mesh_shape, a, b, model) if hosts else None
                row = [{"plan": label, "predicted_s": p.predict(model),
                        "measured_s": timed(comm, mesh, p, local, args.reps, args.budget),
                        "bytes": p.bytes, "net_bytes": p.net_bytes,
                        "chosen": label == chosen, "node_blind": label == blind}
                       for label, p in plans.items()]
                bad, order = verdict(row, args.tolerance)
                records.append({"mesh": mesh_shape, "src": name(a), "dst": name(b),
                                "bytes": size, "shape": shape, "model": model,
                                "candidates": row, "mismatch": bad,
                                "order_disagreements": order})
                if comm.rank == 0 and hosts and blind != chosen:
                    report_blind(mesh_shape, name(a), name(b), size, row)
                if comm.rank == 0:
                    report(mesh_shape, name(a), name(b), size, row, bad, order)
    return records


def blind_summary(records) -> str:
    """Where the node-aware choice differs from the node-blind one: how many, and
    the geometric mean of the measured ratio blind / aware.

    >>> blind_summary([{"candidates": [
    ...     {"chosen": True, "node_blind": False, "measured_s": 1.0},
    ...     {"chosen": False, "node_blind": True, "measured_s": 4.0}]}])
    'the nodes changed 1 of 1 plans; the node-blind plan measured 4.00x the node-aware one (geometric mean, 1 faster, 0 slower)'
    """
    ratios = []
    for rec in records:
        aware = next((r for r in rec["candidates"] if r["chosen"]), None)
        blind = next((r for r in rec["candidates"] if r.get("node_blind")), None)
        if aware and blind and aware is not blind:
            ratios.append(blind["measured_s"] / aware["measured_s"])
    if not ratios:
        return f"the nodes changed none of {len(records)} plans"
    mean = float(np.exp(np.mean(np.log(ratios))))
    return (f"the nodes changed {len(ratios)} of {len(records)} plans; the node-blind plan "
            f"measured {mean:.2f}x the node-aware one (geometric mean, "
            f"{sum(r > 1 for r in ratios)} faster, {sum(r < 1 for r in ratios)} slower)")


def placements_of(text: str):
    """The placements name() wrote: "[S0,P]" -> (Shard(0), Partial())."""
    named = {"R": Replicate(), "P": Partial()}
    return tuple(named.get(t) or Shard(int(t[1:])) for t in text.strip("[]").split(","))


def replay_record(rec, ranks: int, model):
    """The record re-ranked under `model`: (row, stored candidates left out); row
    is None when the model's choice was not measured. The candidates are planned
    under `model`'s planning models and those of the run that stored them."""
    mesh_shape = tuple(rec["mesh"])
    shape = tuple(rec.get("shape") or shape_for(rec["bytes"], ranks))
    a, b = placements_of(rec["src"]), placements_of(rec["dst"])
    blind = any("node_blind" in c for c in rec["candidates"])
    models = planning_models(model, blind)
    if rec.get("model"):
        models += planning_models(tuple(rec["model"]), blind)
    plans = candidates(shape, mesh_shape, a, b, models)
    chosen = next(iter(plans))
    row, missing = [], 0
    for c in rec["candidates"]:
        p = plans.get(c["plan"])
        if p is None:
            missing += 1
            continue
        row.append({**c, "predicted_s": p.predict(model), "chosen": c["plan"] == chosen})
    if not any(r["chosen"] for r in row):
        return None, missing
    return row, missing


def replay(args) -> int:
    with open(args.replay, encoding="utf-8") as f:
        data = json.load(f)
    costs = _timemodel.read_table(args.table) if args.table else None
    base = tuple(costs) if costs else _comm.default_time_model()[:7]
    link = data.get("link")
    ranks = data.get("ranks") or data.get("machine", {}).get("np") or 4
    print(f"replay of {args.replay} ({data.get('transport')}); model (alpha_shm, "
          f"beta_shm, alpha_net, beta_net, call, copy, reduce) = {base}")
    total = mismatches = disagreements = unmeasured = left_out = 0
    for rec in data["records"]:
        # The node layout the run had: each rank its own node over TCP, the mesh's
        # own across hosts, one node otherwise.
        per_node = 1 if link == "net" else rec["model"][7] if link == "hosts" else 0
        model = base + (per_node,)
        row, missing = replay_record(rec, ranks, model)
        left_out += missing
        if row is None:
            unmeasured += 1
            continue
        if len(row) < 2:
            continue
        bad, order = verdict(row, args.tolerance)
        total += 1
        mismatches += bad
        disagreements += len(order)
        report(rec["mesh"], rec["src"], rec["dst"], rec["bytes"], row, bad, order)
    print(f"{data.get('transport')} (replayed): {total} transitions with more than one "
          f"measured candidate; the model's choice measured more than "
          f"{args.tolerance:.0%} slower than the fastest in {mismatches}; "
          f"{disagreements} candidate pairs ordered the other way; {unmeasured} "
          f"choices not measured; {left_out} stored candidates not reproduced")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1KiB,16KiB,256KiB,4MiB,64MiB")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--tolerance", type=float, default=0.10,
                    help="how much slower than the fastest candidate the model's "
                         "choice may measure before it counts as a mismatch")
    ap.add_argument("--budget", type=float, default=0.5,
                    help="seconds per candidate after which timing stops (>= 3 reps)")
    ap.add_argument("--link", choices=("shm", "net", "hosts"), default="shm",
                    help="the link class the run exercises: net prices every step "
                         "on the network (run it over --mca btl self,tcp); hosts keeps "
                         "the mesh's node layout (ranks on several hosts) and adds the "
                         "plan a node-blind planner would run")
    ap.add_argument("--label", help="the transport, for the output (default: --link)")
    ap.add_argument("--note", default="", help="the link the run went over, written "
                    "into the JSON (e.g. '2 simulated hosts, each host's link 10gbit')")
    ap.add_argument("--out", help="JSON file for every figure (default: "
                    "benchmarks/results/<cpu>/plan_ranking_<label>-np<N>.json)")
    ap.add_argument("--replay", help="a JSON file --out wrote: rank its measurements "
                    "under the current model, timing nothing")
    ap.add_argument("--table", help="with --replay: the calibrated table to rank by "
                    "(default: the built-in model)")
    args = ap.parse_args()
    if args.replay:
        return replay(args)
    args.label = args.label or args.link
    started = time.perf_counter()
    comm = MPI.COMM_WORLD
    info = machine(comm)
    if comm.rank == 0:
        print(machine_line(info) + f"; transport {args.label}")
    records = measure(args, comm)
    if comm.rank == 0:
        mismatches = sum(r["mismatch"] for r in records)
        disagreements = sum(len(r["order_disagreements"]) for r in records)
        print(f"{args.label}: {len(records)} transitions with more than one candidate; "
              f"the model's choice measured more than {args.tolerance:.0%} slower than "
              f"the fastest in {mismatches}; {disagreements} candidate pairs ordered "
              f"the other way; {time.perf_counter() - started:.0f} s")
        if args.link == "hosts":
            print(blind_summary(records))
        out = args.out or result_path(f"plan_ranking_{args.label}-np{comm.size}.json")
        write_result(out, {"machine": info, "transport": args.label, "link": args.link,
                           "note": args.note, "ranks": comm.size,
                           "tolerance": args.tolerance, "records": records})
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
