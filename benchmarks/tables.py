"""The tables of docs/performance.md, docs/plans.md, docs/benchmarks.md (the
comparison with Heat), docs/linalg.md and docs/checkpoints.md (files), generated
from the benchmarks' JSON results.

    python benchmarks/tables.py            # rewrite the tables of the pages
    python benchmarks/tables.py --check    # exit 1 when the page differs from the JSON

Each table sits between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` on the
page and is made from ``benchmarks/results/*.json`` (committed; `make bench`
rewrites them and runs this script), so the figures on the page are always those
of the committed results. Each table has a section per kind of CPU, headed by the
CPU, MPI, NumPy and the commit and day of its runs; a benchmark without results
gets a line that says so.
Every figure is a ratio or a difference of two variants timed interleaved in the
same run: ``median [low..high]`` is the median over repetitions and the range of
the per-repetition ratio (its interquartile range where the JSON has one).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
PAGES = tuple(os.path.join(os.path.dirname(HERE), "docs", name)
              for name in ("performance.md", "plans.md", "benchmarks.md", "linalg.md",
                           "checkpoints.md", "ecosystem.md", "reliability.md"))
# The plots of the same results (benchmarks/plot.py --out docs/img/perf), shown
# under their tables when present.
PLOTS = os.path.join(os.path.dirname(HERE), "docs", "img", "perf")
MARKER = re.compile(r"(<!-- table:(\w+) -->\n)(.*?)(<!-- /table:\2 -->)", re.S)


def load(results: str) -> dict:
    """{cpu folder: {(kind, np, torch?): data}} of every result file, e.g.
    {"amd-epyc": {("redistribute", 2, False): ...}}: one folder per kind of CPU."""
    out = {}
    for path in sorted(glob.glob(os.path.join(results, "*", "*.json"))):
        m = re.fullmatch(r"(\w+)-np(\d+)(-torch)?", os.path.splitext(os.path.basename(path))[0])
        if m:
            with open(path) as f:
                cpu = os.path.basename(os.path.dirname(path))
                out.setdefault(cpu, {})[(m.group(1), int(m.group(2)), bool(m.group(3)))] = \
                    json.load(f)
    return out


def size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def ranged(median: float, low: float, high: float, digits: int = 2) -> str:
    return f"{median:.{digits}f} [{low:.{digits}f}..{high:.{digits}f}]"


def stat(s: dict, digits: int = 2) -> str:
    """A {median, min, max[, q1, q3]} dict: median and IQR, else min..max."""
    low, high = (s["q1"], s["q3"]) if "q1" in s else (s["min"], s["max"])
    return ranged(s["median"], low, high, digits)


def table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def machine(data: dict) -> dict:
    """The machine record of a result (benchmarks/_common.machine), as the tables
    show it."""
    m = data["machine"]
    return {"date": m["date"][:16].replace("T", " "), "commit": m["commit"],
            "cpu": f"{m['cpu']}, {m['cores']} cores", "mpi": m["mpi"].split(",")[0],
            "numpy": m["numpy"], "python": m["python"]}


def where(results: dict) -> str:
    """The line above a CPU's tables: the CPU, MPI and NumPy, and the commit and day
    of each run the tables come from (results: one table's, on one CPU)."""
    first = machine(next(iter(results.values())))
    runs = sorted({(m["commit"], m["date"][:10]) for m in map(machine, results.values())})
    return (f"**{first['cpu']}**; {first['mpi']}, NumPy {first['numpy']}; "
            + "; ".join(f"commit `{c}` ({day})" for c, day in runs))


def runs_of(results: dict, kind: str) -> list:
    """(np, with torch, data) of every result of benchmark `kind` (on one CPU), in
    order of np."""
    return [(n, torch, data) for (k, n, torch), data in sorted(results.items()) if k == kind]


def redistribute(results: dict) -> str:
    out = []
    for n, torch, data in runs_of(results, "redistribute"):
        points = data["points"]
        sizes = sorted({p["bytes"] for p in points})
        rows = []
        for name in dict.fromkeys(p["transition"] for p in points):
            by_size = {p["bytes"]: p for p in points if p["transition"] == name}
            first = next(iter(by_size.values()))
            cells = []
            for b in sizes:
                s = by_size[b]["summary"] if b in by_size else None
                cells.append("" if s is None else ranged(
                    s["ratio"], s.get("ratio_p25", s["ratio_min"]),
                    s.get("ratio_p75", s["ratio_max"])))
            small = by_size[sizes[0]]["summary"].get("overhead_us") if sizes[0] in by_size else None
            rows.append([name, first["raw"], *cells, "" if small is None else f"{small:.1f}"])
        out.append(f"np {n}: time of `redistribute` / time of the raw mpi4py call, by local "
                   f"input per rank\n\n" + table(["transition", "raw MPI call", *map(size, sizes),
                                            f"us above raw at {size(sizes[0])}"], rows))
        torch_rows = [[p["transition"], size(p["bytes"]), ranged(
            p["summary"]["torch_over_mt"], p["summary"]["torch_over_mt_min"],
            p["summary"]["torch_over_mt_max"])] for p in points if "torch_over_mt" in p["summary"]]
        if torch_rows:
            out.append(f"np {n}: time of torch DTensor (gloo) / time of mpitensor\n\n"
                       + table(["transition", "local input", "torch / mpitensor"], torch_rows))
    return "\n".join(out)


def dispatch(results: dict) -> str:
    out = []
    columns = [("overhead_us", "cached"), ("traced_overhead_us", "traced (CommDebugMode)"),
               ("miss_overhead_us", "decision not cached"),
               ("torch_overhead_us", "torch DTensor, cached")]
    for n, torch, data in runs_of(results, "dispatch"):
        # Only the smallest size: above it the operation's own jitter swamps a
        # sub-microsecond overhead (the JSON has every size).
        smallest = min(r["n"] for r in data["results"])
        rows_in = [r for r in data["results"] if r["n"] == smallest]
        present = [(k, label) for k, label in columns if any(k in r for r in rows_in)]
        rows = [[r["op"], f"{r['n']} x {r['n']}", *(stat(r[k]) if k in r else ""
                                                     for k, _ in present)] for r in rows_in]
        out.append(f"np {n}: microseconds above NumPy on the local arrays, per call "
                   f"(median [IQR])\n\n" + table(["operation", "global shape",
                                                  *(label for _, label in present)], rows))
    return "\n".join(out)


def tensor_parallel(results: dict) -> str:
    out = []
    for n, torch, data in runs_of(results, "tensor_parallel"):
        has_torch = any("torch_over_tp" in r for r in data["rows"])
        rows = [[r["model"], r["hidden"], r["tokens"], stat(r["speedup"]),
                 *([stat(r["torch_over_tp"])] if "torch_over_tp" in r else
                   ([""] if has_torch else []))] for r in data["rows"]]
        out.append(f"np {n}, BLAS `{data['machine']['blas']}`: forward of one "
                   f"process / tensor-parallel forward (speed-up)\n\n"
                   + table(["model", "hidden", "tokens", "speed-up",
                            *(["torch TP / mpitensor TP"] if has_torch else [])], rows))
    return "\n".join(out)


def checkpoint(results: dict) -> str:
    out = []
    for n, torch, data in runs_of(results, "checkpoint"):
        rows = [[r["layout"], size(r["bytes"]), stat(r["save"]["ratio"]),
                 stat(r["load"]["ratio"])] for r in data["results"]]
        out.append(f"np {n}: bandwidth of `mt.save` / `mt.load` over `numpy.save` / "
                   f"`numpy.load` of the whole array by one process\n\n"
                   + table(["placements", "array", "save", "load"], rows))
    return "\n".join(out)


def transport(results: dict) -> str:
    out = []
    for n, torch, data in runs_of(results, "transport"):
        points = data["points"]
        sizes = sorted({p["bytes"] for p in points})
        rows = []
        for path, case in dict.fromkeys((p["path"], p["case"]) for p in points):
            by_size = {p["bytes"]: p for p in points if (p["path"], p["case"]) == (path, case)}
            rows.append([path, case, *(ranged(by_size[b]["speedup"], by_size[b]["speedup_min"],
                                              by_size[b]["speedup_max"])
                                       if b in by_size else "" for b in sizes)])
        out.append(f"np {n}: time of the MPI or libc path / time of the hand-written one, "
                   f"where the library takes it, by input per rank (direct copies) or "
                   f"destination (streaming stores)\n\n"
                   + table(["path", "case", *map(size, sizes)], rows))
    return "\n".join(out)


def context_parallel(results: dict) -> str:
    out = []
    for n, torch, data in runs_of(results, "context_parallel"):
        summary, peak, args = data["summary"], data["peak_bytes_per_rank"], data["args"]
        rows = [[name, ranged(s["speedup_median"], s["speedup_min"], s["speedup_max"]),
                 f"{peak[name] / peak['np1']:.2f}"] for name, s in summary.items()
                if name != "np1"]
        out.append(f"np {n}, {args['seq']} tokens, {args['heads']} heads of {args['dim']}, "
                   f"{args['dtype']}{', causal' if args.get('causal') else ''}: against the "
                   f"whole sequence on one rank\n\n"
                   + table(["attention", "speed-up", "peak memory per rank / one rank's"],
                           rows))
    return "\n".join(out)


def debug(results: dict) -> str:
    out = []
    for n, torch, data in runs_of(results, "debug"):
        checks = [[f"{r['n']} x {r['n']}", stat(r["off_us"]), stat(r["on_us"]),
                   stat(r["ratio"])] for r in data["rows"] if r["case"] == "checks"]
        hooks = [[f"{r['n']} x {r['n']}", stat(r["off_us"]), stat(r["logged_us"])]
                 for r in data["rows"] if r["case"] == "hooks" and "off_us" in r]
        text = (f"np {n}: `Shard(0) -> Replicate` with `set_collective_checks(True)` "
                f"(us per call)\n\n" + table(["global shape", "off", "on", "on / off"], checks))
        if hooks:
            text += ("\n`a + b` with every tool off and with debug logging on (us per call)"
                     "\n\n" + table(["global shape", "off", "+dtensor"], hooks))
        out.append(text)
    return "\n".join(out)


def train(results: dict) -> str:
    out = []
    for n, torch, data in runs_of(results, "train"):
        rows = data["rows"]
        has_torch = any("torch_over_mt" in r for r in rows)
        table_rows = [[r["hidden"], "x".join(map(str, r["mesh"])), stat(
            {k: v * 1e3 for k, v in r["mt"].items()}, 0),
            stat(r["speedup"]) if "speedup" in r else "",
            *([stat(r["torch_over_mt"]) if "torch_over_mt" in r else "",
               f"{r['memory_mt_over_torch']:.2f}" if "memory_mt_over_torch" in r else ""]
              if has_torch else [])] for r in rows]
        first = rows[0]
        out.append(f"np {n}, {first['layers']} layers, batch {first['batch']} x {first['seq']} "
                   f"tokens, float32, forward + backward + AdamW\n\n"
                   + table(["hidden", "mesh", "mpitensor step (ms)", f"speed-up np 1 -> np {n}",
                            *(["torch / mpitensor", "peak memory mpitensor / torch"]
                              if has_torch else [])], table_rows))
    return "\n".join(out)


def autograd(results: dict) -> str:
    out = []
    for n, torch, data in runs_of(results, "autograd"):
        rows = [[r["op"], f"{r['above_numpy_us']['median']:.2f}", stat(r["recording_us"])]
                for r in data["rows"]]
        size = data["args"]["size"]
        out.append(f"np {n}, {size} x {size} float64 per rank: microseconds per call "
                   f"(medians; recording's range over repetitions)\n\n"
                   + table(["operation", "no grad: above NumPy", "grad: recording adds"],
                           rows))
    return "\n".join(out)


def plan_ranking(results: dict) -> str:
    """Per transport: how often the time model's choice measured slower than the
    fastest candidate plan, by tensor size (make plan-ranking)."""
    runs = [(kind[len("plan_ranking_"):], n, data)
            for (kind, n, torch), data in sorted(results.items())
            if kind.startswith("plan_ranking_")]
    if not runs:
        return ""
    sizes = sorted({r["bytes"] for _, _, d in runs for r in d["records"]})
    rows = []
    for label, n, data in runs:
        cells = []
        for b in sizes:
            got = [r for r in data["records"] if r["bytes"] == b]
            cells.append(f"{sum(r['mismatch'] for r in got)} / {len(got)}" if got else "")
        bad = sum(r["mismatch"] for r in data["records"])
        rows.append([label, n, *cells, f"{bad} / {len(data['records'])}"])
    tol = runs[0][2].get("tolerance", 0.10)
    return (f"Transitions (every 1-D one and every (2, 2) pair with more than one candidate "
            f"plan) whose chosen plan measured more than {tol:.0%} slower than the fastest "
            f"candidate, by tensor size\n\n"
            + table(["transport", "np", *[size(b) for b in sizes], "all"], rows)
            + "".join(node_blind(label, n, data) for label, n, data in runs))


def node_blind(label: str, n: int, data: dict) -> str:
    """For a run across hosts (plan_ranking.py --link hosts), by size: the moves
    whose node-aware plan differs from the one the same costs give with every rank
    on one node, and the measured time of that node-blind plan over the node-aware
    one (geometric mean, lowest and highest)."""
    if data.get("link") != "hosts":
        return ""
    by_size = {}
    for r in data["records"]:
        aware = next((c for c in r["candidates"] if c["chosen"]), None)
        blind = next((c for c in r["candidates"] if c.get("node_blind")), None)
        if aware and blind and aware is not blind:
            by_size.setdefault(r["bytes"], []).append(blind["measured_s"] / aware["measured_s"])
    rows = []
    for b in sorted({r["bytes"] for r in data["records"]}):
        got = by_size.get(b, [])
        if not got:
            rows.append([size(b), 0, "", ""])
            continue
        mean = math.exp(sum(math.log(x) for x in got) / len(got))
        rows.append([size(b), len(got), f"{mean:.2f} [{min(got):.2f}..{max(got):.2f}]",
                     f"{sum(x > 1 for x in got)} / {len(got)}"])
    return (f"\n{label}, np {n}: {data.get('note', '')}. Moves whose plan changes when the "
            f"planner knows the nodes, and the measured time of the plan it would make "
            f"with every rank on one node over the node-aware plan (above 1: the "
            f"node-aware plan was faster)\n\n"
            + table(["size", "plans changed", "node-blind / node-aware", "node-aware faster"],
                    rows))


def simulate_plans(results: dict) -> str:
    """The planner on paper at the study's largest mesh (benchmarks/simulate_plans.py):
    per common move, the plan and how many times longer torch's per-mesh-dim steps
    and the same planner blind to the nodes would take, by the time model."""
    data = results.get(("simulate_plans", 1, False))
    if data is None:
        return ""
    recs = data["records"]
    ranks = max(r["ranks"] for r in recs)
    per_node = max(r["per_node"] for r in recs if r["ranks"] == ranks)
    sizes = sorted({r["bytes"] for r in recs})
    top = sizes[-1]
    rows = []
    moves = [(tuple(r["mesh"]), r["move"]) for r in recs
             if r["ranks"] == ranks and r["per_node"] == per_node and r["bytes"] == top]
    for mesh, move in moves:
        at = {r["bytes"]: r for r in recs if r["ranks"] == ranks and r["per_node"] == per_node
              and tuple(r["mesh"]) == mesh and r["move"] == move}
        big = at[top]

        def times(key, b):
            r = at[b]
            return f"{r[key] / r['predicted_s']:.3g}" if r.get(key) else "-"

        t = big["predicted_s"]
        rows.append([str(mesh), move, f"`{big['plan']}`",
                     f"{t:.3g} s" if t >= 1 else f"{t * 1e3:.3g} ms",
                     *[times("torch_s", b) for b in sizes],
                     *[times("node_blind_s", b) for b in (sizes[0], top)]])
    worst = max(r["planning_s"] for r in recs) * 1e3
    return (f"{ranks:,} ranks on nodes of {per_node}, float64; time model: {data['link']}. "
            f"Modelled time of torch's per-mesh-dim steps, and of the plan made as if "
            f"every rank shared one node, over mpitensor's plan (above 1: slower than "
            f"mpitensor's); the plan is the one for {size(top)}. Every mesh of "
            f"{min(r['ranks'] for r in recs):,} to {ranks:,} ranks, nodes of "
            f"{min(r['per_node'] for r in recs)} and {per_node}, in "
            f"`simulate_plans-np1.json`; the slowest plan took {worst:.0f} ms to make.\n\n"
            + table(["mesh", "move", "plan", "time",
                     *[f"torch's steps, {size(b)}" for b in sizes],
                     *[f"node-blind, {size(b)}" for b in (sizes[0], top)]], rows))


def vs_heat(results: dict) -> str:
    """Heat's time over mpitensor's per operation and size (benchmarks/vs_heat.py),
    and the sizes where a library's result differed from NumPy's."""
    out = []
    for n, torch, data in runs_of(results, "vs_heat"):
        points = data["points"]
        sizes = sorted({p["bytes"] for p in points})
        rows = []
        for op in dict.fromkeys(p["op"] for p in points):
            by_size = {p["bytes"]: p for p in points if p["op"] == op}
            wrong = [f"{lib} at {size(b)}" for b, p in sorted(by_size.items())
                     for lib, key in (("mpitensor", "mt_right"), ("Heat", "heat_right"))
                     if not p[key]]
            rows.append([f"`{op}`", next(iter(by_size.values()))["result"],
                         *(stat(by_size[b]["heat_over_mt"]) if b in by_size else ""
                           for b in sizes),
                         "wrong: " + ", ".join(wrong) if wrong else "right"])
        m = data["machine"]
        out.append(f"np {n}, Heat {m.get('heat', '?')} on torch {m.get('torch', '?')}: time "
                   f"of Heat / time of mpitensor (above 1: mpitensor is faster), by float64 "
                   f"input per rank; results against NumPy's\n\n"
                   + table(["operation", "result brought to", *map(size, sizes), "results"],
                           rows))
    return "\n".join(out)


def io(results: dict) -> str:
    """Per size and row count (benchmarks/io.py): mpitensor's bandwidth over Heat's
    and over raw pwrite/pread of the same bytes, saves and loads; one table with no
    syncs on either side and, when the run has them, one of synced saves."""
    plain = [("mt_h5_save/heat_h5_save", "HDF5 save / Heat"),
             ("mt_h5_load/heat_h5_load", "HDF5 load / Heat"),
             ("mt_zarr_save/heat_zarr_save", "Zarr save / Heat"),
             ("mt_zarr_load/heat_zarr_load", "Zarr load / Heat"),
             ("mt_h5_save/raw_write", "HDF5 save / pwrite"),
             ("mt_npy_save/raw_write", ".npy save / pwrite"),
             ("mt_h5_load/raw_read", "HDF5 load / pread"),
             ("mt_npy_load/raw_read", ".npy load / pread")]
    synced = [("mt_h5_save_durable/heat_h5_save_durable", "HDF5 save / Heat"),
              ("mt_zarr_save_durable/heat_zarr_save_durable", "Zarr save / Heat"),
              ("mt_h5_save_durable/raw_write_durable", "HDF5 save / pwrite"),
              ("mt_npy_save_durable/raw_write_durable", ".npy save / pwrite")]
    out = []
    for n, torch, data in runs_of(results, "io"):
        heat = data["machine"].get("heat")
        head = (f"np {n}{f', Heat {heat}' if heat else ', without Heat'}: bandwidth of "
                f"mpitensor over the other side's (above 1: mpitensor is faster)")
        for cols, syncs in (
                (plain, "no syncs on either side; pwrite makes a new file as numpy.save "
                        "does"),
                (synced, "saves durable on both sides: ours durable=True; Heat's save "
                         "and pwrite followed by fsync of the files and their directory")):
            shown = [(k, name) for k, name in cols
                     if any(k in pt["ratios"] for pt in data["points"])]
            if not shown:
                continue
            rows = [[size(pt["mib_per_rank"] * 2**20),
                     f"{pt['rows']} ({'even' if pt['rows'] % n == 0 else 'uneven'})",
                     *(stat(pt["ratios"][k]) if k in pt["ratios"] else "" for k, _ in shown)]
                    for pt in data["points"]]
            out.append(f"{head}, {syncs}\n\n"
                       + table(["float64 per rank", "rows", *(name for _, name in shown)],
                               rows))
    return "\n".join(out)


def linalg(results: dict) -> str:
    """Per call and shape (benchmarks/linalg.py): mpitensor's time, and the other
    side's time over it (Heat's, one-process NumPy's), with each side's error."""
    out = []
    for n, torch, data in runs_of(results, "linalg"):
        rows = []
        for section, points in data["sections"].items():
            for pt in points:
                speed = pt["mt_speedup"]
                err = pt.get("error", {})
                rows.append([
                    pt["op"], " x ".join(map(str, pt["shape"])), section,
                    f"{pt['seconds']['mt']['median'] * 1e3:.0f} ms",
                    stat(speed["heat"]) if "heat" in speed else "",
                    stat(speed["numpy"]) if "numpy" in speed else "",
                    stat(pt["mt_over_plain"]) if "mt_over_plain" in pt else "",
                    f"{err['mt']:.1e}" if "mt" in err else "",
                    f"{err['heat']:.1e}" if "heat" in err else ""])
        heat = data["machine"].get("heat")
        out.append(f"np {n}{f', Heat {heat}' if heat else ''}, float64, `[Shard(0)]`: "
                   f"the other side's time over mpitensor's (above 1: mpitensor is "
                   f"faster), median [min..max], and mpitensor's time over a plain C "
                   f"program's calling the same ScaLAPACK routine on the same grid and "
                   f"block-cyclic descriptors (below 1.10: within the bound of 10%; "
                   f"solve's is pXgetrf and pXgetrs against mpitensor's own LU); "
                   f"errors: qr's ||A - QR|| / ||A||, svd's "
                   f"singular values' against NumPy's over the largest, solve's "
                   f"backward error, eigh's eigenvalues against NumPy's over the largest\n\n"
                   + table(["call", "shape", "engine", "mpitensor", "Heat / mt",
                            "NumPy (1 process) / mt", "mt / plain C", "error (mt)",
                            "error (Heat)"], rows))
    return "\n".join(out)


def sklearn_fit(results: dict) -> str:
    """Per estimator (benchmarks/sklearn_fit.py): scikit-learn's fit on sharded rows
    against the same fit on the whole array in one process with every core's BLAS
    threads, timed one after the other in one run."""
    out = []
    for n, torch, data in runs_of(results, "sklearn_fit"):
        rows = [[r["estimator"], f"{r['rows']:,} x {r['cols']}",
                 f"{r['mpitensor_s']['median'] * 1e3:.0f} ms",
                 f"{r['numpy_s']['median'] * 1e3:.0f} ms", stat(r["speedup"]),
                 ", ".join(r["wrong"]) or "same"] for r in data["rows"]]
        out.append(f"np {n}, one BLAS thread a rank, against one process with {n} BLAS "
                   f"threads: the one process's time over mpitensor's (above 1: "
                   f"mpitensor is faster), median [min..max]\n\n"
                   + table(["estimator", "data", "mpitensor", "one process",
                            "one process / mt", "fitted attributes"], rows))
    return "\n".join(out)


# benchmarks/agree.py's calls: (what, the agreed call, the call without its agreement).
_AGREED = (("one agreement (`_comm.agree`)", "agree", "raw"),
           ("`np.sum(dt, axis=1)`, a program's", "np_sum", None),
           ("`dt.sum(axis=1)`, a program's", "method_sum", None),
           ("`np.cumsum(dt, axis=1)`", "np_cumsum", "local_cumsum"),
           ("`dt.cumsum(axis=1)`", "method_cumsum", "local_cumsum"),
           ("`rep[3]` of a Replicate DTensor", "index", "local_index"),
           ("`rep[3] = 1.0`", "index_write", "local_write"),
           ("`dt[1:5]` of a sharded DTensor (rides in its exchange)", "index_exchange", None))


def agree(results: dict) -> str:
    """What a program's agreed calls cost (benchmarks/agree.py): the agreement
    beside a raw all-reduce of the same three integers, and calls beside NumPy's on
    the local block (the difference is the whole dispatch, the agreement included),
    timed interleaved in one run."""
    out = []
    for n, torch, data in runs_of(results, "agree"):
        per = data["per_call_us"]
        rows = [[what, stat(per[key]), stat(per[base]) if base else "",
                 f"+{per[key]['median'] - per[base]['median']:.2f}" if base else ""]
                for what, key, base in _AGREED if key in per]
        out.append(f"np {n}, microseconds per call, median [min..max]\n\n"
                   + table(["call", "agreed", "the raw all-reduce, or NumPy on the local "
                            "block", "difference"], rows))
    return "\n".join(out)


def call_cost(results: dict) -> str:
    """A program's NumPy call on a small DTensor over the same call on its local
    block, the agreement included (benchmarks/call_cost.py), beside another commit
    timed in the same sitting."""
    out = []
    for n, torch, data in runs_of(results, "call_cost"):
        base = data["machine"].get("base_commit")
        rows = [[f"`{r['call']}`", stat(r["this"])] + ([stat(r["base"])] if base else [])
                for r in data["rows"]]
        out.append(f"np {n}, microseconds over NumPy's call on the local block, median "
                   f"[min..max] over rounds\n\n"
                   + table(["call", "this commit"] + ([f"commit `{base}`"] if base else []),
                           rows))
    return "\n".join(out)


def call_instructions(results: dict) -> str:
    """The instructions of the same calls over NumPy's on the local block, counted
    by callgrind at np 1 (benchmarks/call_instructions.py), beside another commit."""
    out = []
    for n, torch, data in runs_of(results, "call_instructions"):
        base = data["machine"].get("base_commit")
        rows = [[f"`{r['call']}`", f"{r['numpy']:,}", f"{r['this']:,}"]
                + ([f"{r['base']:,}"] if base else []) for r in data["rows"]]
        out.append(f"np {n}, instructions per call\n\n"
                   + table(["call", "NumPy on the block", "over NumPy, this commit"]
                           + ([f"over NumPy, commit `{base}`"] if base else []), rows))
    return "\n".join(out)


def dispatch_base(results: dict) -> str:
    """The calls and programs a change of the dispatch is judged by, beside another
    commit timed in the same sitting (benchmarks/dispatch.py --base)."""
    out = []
    for n, torch, data in runs_of(results, "dispatch_base"):
        base = data["machine"]["base_commit"]
        head = ["", "this commit", f"commit `{base}`"]
        for key, unit in (("us", "microseconds over NumPy's call on the local block"),
                          ("ms", "milliseconds")):
            rows = [[f"`{r['call']}`" if key == "us" else r["call"], stat(r["this"]),
                     stat(r["base"])] for r in data[key]]
            out.append(f"np {n}, {unit}, median [min..max] over {data['rounds']} rounds\n\n"
                       + table(head, rows))
    return "\n".join(out)


TABLES = {"agree": agree, "call_cost": call_cost, "call_instructions": call_instructions,
          "dispatch_base": dispatch_base, "sklearn_fit": sklearn_fit,
          "redistribute": redistribute, "dispatch": dispatch,
          "tensor_parallel": tensor_parallel, "checkpoint": checkpoint,
          "context_parallel": context_parallel, "debug": debug, "train": train, "autograd": autograd,
          "plan_ranking": plan_ranking, "simulate_plans": simulate_plans, "vs_heat": vs_heat,
          "transport": transport, "io": io, "linalg": linalg}


def figures(name: str, cpu: str, results: dict, plots: str) -> str:
    """Image lines for the plots of ``name``'s results on ``cpu`` that exist in ``plots``."""
    lines = []
    for kind, n, torch in sorted(results):
        base = f"{kind}-np{n}{'-torch' if torch else ''}.png"
        if kind == name and os.path.exists(os.path.join(plots, cpu, base)):
            lines.append(f"![{kind} at np {n}{' with torch' if torch else ''}]"
                         f"(img/perf/{cpu}/{base})")
    return "\n" + "\n\n".join(lines) + "\n" if lines else ""


def shown(name: str, results: dict) -> dict:
    """The results of one CPU that table ``name`` shows. Redistributions with more
    ranks than cores are left out: which ranks share a core decides their figures,
    so they are kept in benchmarks/results as a regression watch only."""
    return {(kind, n, torch): data for (kind, n, torch), data in results.items()
            if (kind == name or kind.startswith(name + "_"))
            and not (kind == "redistribute" and n > data["machine"]["cores"])}


def render(page: str, results: dict, plots: str = PLOTS) -> str:
    """``page`` with every marked table made from ``results`` (load()'s), a section
    per kind of CPU, and the plots of ``plots`` that belong to them."""
    def fill(m):
        name = m.group(2)
        if name not in TABLES:
            raise ValueError(f"a page marks an unknown table {name!r}")
        parts = []
        for cpu, rs in sorted(results.items()):
            rs = shown(name, rs)
            text = TABLES[name](rs) if rs else ""
            if text.strip():
                parts.append(where(rs) + "\n\n" + text + figures(name, cpu, rs, plots))
        text = "\n".join(parts) or (f"No committed results of `benchmarks/{name}.py` yet: "
                                     f"run `make bench`, which rewrites this table.\n")
        return m.group(1) + text + m.group(4)

    return MARKER.sub(fill, page)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--page", action="append", help="a page to fill (default: all)")
    ap.add_argument("--plots", default=PLOTS)
    ap.add_argument("--check", action="store_true", help="only compare, exit 1 on a difference")
    args = ap.parse_args()
    results, status = load(args.results), 0
    for path in args.page or PAGES:
        with open(path) as f:
            page = f.read()
        new = render(page, results, args.plots)
        if args.check:
            if new != page:
                print(f"{path} differs from the tables of {args.results}: run "
                      f"python benchmarks/tables.py", file=sys.stderr)
                status = 1
            continue
        with open(path, "w") as f:
            f.write(new)
        print(f"wrote the tables of {path}")
    return status

if __name__ == "__main__":
    sys.exit(main())
