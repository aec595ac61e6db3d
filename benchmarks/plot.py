"""Plots of the benchmarks' JSON results: one PNG per result file.

    .venv/bin/python benchmarks/plot.py [benchmarks/results] [--out benchmarks/results/plots]

Reads every `CPU/*.json` the benchmarks wrote into the results directory (files of
benchmarks it does not know are skipped with a note) and draws what each holds:

* `redistribute-np{N}[-torch].json`: mt / raw MPI time per transition against the
  local size per rank (median, bars over the per-repetition interquartile range), and with
  torch, how many times slower torch DTensor is than mpitensor;
* `dispatch-np{N}[-torch].json`: the per-operation overhead over NumPy at the
  smallest size (cached C path, Python entry, cache miss; torch's over its local
  tensors where timed);
* `tensor_parallel-np{N}[-torch].json`: speed-up of the tensor-parallel forward
  over one process against hidden size;
* `checkpoint-np{N}.json`: save/load bandwidth of mpitensor over NumPy's;
* `context_parallel-np{N}.json`: ring attention's speed-up and peak memory per rank
  against one rank;
* `debug-np{N}.json`: what collective checks cost (on / off).

Every plotted figure is a ratio of two variants timed interleaved in the same run,
or a difference of such times, never an absolute time on its own: on a shared
machine absolute times drift between runs while side-by-side ratios hold.
"""

import argparse
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def kib(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def err(center: float, lo: float, hi: float):
    """Error-bar extents [[below], [above]] from a median and its range."""
    return [[max(center - lo, 0.0)], [max(hi - center, 0.0)]]


def subtitle(machine: dict) -> str:
    """Where and when a figure was measured (a result's machine record), for its title."""
    return (f"{machine['cpu']}, np {machine['np']} on {machine['cores']} cores, commit "
            f"{machine['commit']}, {machine['date'][:16].replace('T', ' ')} UTC")


def plot_redistribute(data: dict, path: str) -> str:
    points = data["points"]
    torch = any("torch_over_mt" in p["summary"] for p in points)
    fig, axes = plt.subplots(1, 2 if torch else 1, figsize=(12 if torch else 7, 4.5),
                             squeeze=False)
    ax = axes[0][0]
    names = list(dict.fromkeys(p["transition"] for p in points))
    for i, name in enumerate(names):
        pts = [p for p in points if p["transition"] == name]
        x = [p["bytes"] for p in pts]
        # shifted a little per transition so that the bars of one size stay apart
        x = [b * 1.08 ** (i - len(names) / 2) for b in x]
        y = [p["summary"]["ratio"] for p in pts]
        # the interquartile range of the per-repetition ratio: min..max is dominated
        # by single descheduled repetitions on a busy machine (it is in the JSON)
        lo_key, hi_key = (("ratio_p25", "ratio_p75") if "ratio_p25" in pts[0]["summary"]
                          else ("ratio_min", "ratio_max"))
        lo = [max(yy - p["summary"][lo_key], 0) for yy, p in zip(y, pts)]
        hi = [max(p["summary"][hi_key] - yy, 0) for yy, p in zip(y, pts)]
        ax.errorbar(x, y, yerr=[lo, hi], fmt="o-", ms=3, capsize=2, lw=1,
                    color=f"C{i}", label=f"{name} ({pts[0]['raw']})", alpha=0.85)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("local input per rank (bytes)")
    ax.set_ylabel("time mpitensor / raw MPI (median, IQR)")
    ax.set_title("redistribute vs the raw collective")
    ax.legend(fontsize=7)
    if torch:
        ax = axes[0][1]
        for i, name in enumerate(names):
            pts = [p for p in points if p["transition"] == name
                   and "torch_over_mt" in p["summary"]]
            if not pts:
                continue
            s = [p["summary"] for p in pts]
            y = [x["torch_over_mt"] for x in s]
            ax.errorbar([p["bytes"] for p in pts], y,
                        yerr=[[max(a - x["torch_over_mt_min"], 0) for a, x in zip(y, s)],
                              [max(x["torch_over_mt_max"] - a, 0) for a, x in zip(y, s)]],
                        fmt="o-", ms=3, capsize=2, lw=1, color=f"C{i}", label=name)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("local input per rank (bytes)")
        ax.set_ylabel("time torch DTensor (gloo) / mpitensor")
        ax.set_title(f"torch {data.get('torch_version', '')} vs mpitensor")
        ax.legend(fontsize=7)
    fig.suptitle(subtitle(data["machine"]), fontsize=9)
    return save(fig, path)


def plot_dispatch(data: dict, path: str) -> str:
    rows = data["results"]
    # Only the smallest size: above it the op's own jitter (ms at 2048) swamps a
    # sub-microsecond overhead, which the benchmark reports as "timing UNRESOLVED".
    sizes = [min(r["n"] for r in rows)]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4.5), squeeze=False)
    series = [("overhead_us", "mpitensor (cached, C path)"),
              ("traced_overhead_us", "mpitensor, traced (CommDebugMode)"),
              ("miss_overhead_us", "mpitensor, cache miss"),
              ("torch_overhead_us", "torch DTensor (cached)"),
              ("torch_miss_overhead_us", "torch DTensor, cache miss")]
    for ax, n in zip(axes[0], sizes):
        sel = [r for r in rows if r["n"] == n]
        present = [(k, lab) for k, lab in series if any(k in r for r in sel)]
        width = 0.8 / max(len(present), 1)
        for j, (key, label) in enumerate(present):
            for i, r in enumerate(sel):
                if key not in r:
                    continue
                s = r[key]
                # an overhead can come out negative in the noise; the log axis needs > 0
                med = max(s["median"], 0.01)
                ax.bar(i + j * width, med, width, color=f"C{j}",
                       yerr=err(med, max(s.get("q1", s["min"]), 0.01), s.get("q3", s["max"])),
                       capsize=2, label=label if i == 0 else None)
        ax.set_xticks([i + width * (len(present) - 1) / 2 for i in range(len(sel))])
        ax.set_xticklabels([r["op"] for r in sel])
        ax.set_yscale("log")
        ax.set_ylabel("time over NumPy on the local arrays (us; median, IQR)")
        ax.set_title(f"dispatch overhead, global {n} x {n} float64")
        ax.legend(fontsize=7)
    fig.suptitle(subtitle(data["machine"]), fontsize=9)
    return save(fig, path)


def plot_tensor_parallel(data: dict, path: str) -> str:
    rows = data["rows"]
    torch = any("torch_over_tp" in r for r in rows)
    fig, axes = plt.subplots(1, 2 if torch else 1, figsize=(11 if torch else 6, 4.5),
                             squeeze=False)
    models = list(dict.fromkeys(r["model"] for r in rows))
    for key, ax, ylabel in [("speedup", axes[0][0], "speed-up one process / tensor parallel"),
                            ("torch_over_tp", axes[0][-1], "time torch TP / mpitensor TP")]:
        if key == "torch_over_tp" and not torch:
            break
        for i, m in enumerate(models):
            sel = [r for r in rows if r["model"] == m and key in r]
            y = [r[key]["median"] for r in sel]
            ax.errorbar([r["hidden"] for r in sel], y,
                        yerr=[[max(a - r[key]["min"], 0) for a, r in zip(y, sel)],
                              [max(r[key]["max"] - a, 0) for a, r in zip(y, sel)]],
                        fmt="o-", capsize=3, color=f"C{i}", label=m)
        ax.axhline(1.0, color="k", lw=0.8)
        if key == "speedup":
            target = data.get("targets", {}).get("speedup_np2_hidden_ge_2048")
            if target and data["machine"]["np"] == 2:
                ax.axhline(target, color="gray", ls="--", lw=0.8, label=f"target {target}x")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("hidden size (512 tokens, float32)")
        ax.set_ylabel(ylabel + " (median, min..max)")
        ax.legend(fontsize=8)
    axes[0][0].set_title("tensor-parallel forward (Megatron plan)")
    fig.suptitle(subtitle(data["machine"]), fontsize=9)
    return save(fig, path)


def plot_checkpoint(data: dict, path: str) -> str:
    res = data["results"]
    labels, meds, los, his, colors = [], [], [], [], []
    for r in res:
        for k, op in enumerate(("save", "load")):
            s = r[op]["ratio"]
            labels.append(f"{op}\n{r['layout']} {kib(r['bytes'])}")
            meds.append(s["median"])
            los.append(max(s["median"] - s["min"], 0))
            his.append(max(s["max"] - s["median"], 0))
            colors.append(f"C{k}")
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(labels)), 4.5))
    ax.bar(range(len(labels)), meds, color=colors, yerr=[los, his], capsize=3)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.8, color="gray", ls="--", lw=0.8, label="target 0.8")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("bandwidth mpitensor / numpy (median, min..max)")
    ax.set_title("mt.save / mt.load vs numpy.save / numpy.load of the same bytes")
    ax.legend(fontsize=8)
    fig.suptitle(subtitle(data["machine"]), fontsize=9)
    return save(fig, path)


def plot_context_parallel(data: dict, path: str) -> str:
    summ, mem = data["summary"], data["peak_bytes_per_rank"]
    names = [k for k in summ if k != "np1"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.2))
    y = [summ[k]["speedup_median"] for k in names]
    a1.bar(names, y, color="C0",
           yerr=[[max(v - summ[k]["speedup_min"], 0) for v, k in zip(y, names)],
                 [max(summ[k]["speedup_max"] - v, 0) for v, k in zip(y, names)]], capsize=3)
    a1.axhline(1.0, color="k", lw=0.8)
    a1.set_ylabel("speed-up over one rank (median, min..max)")
    a1.set_title("ring attention: time")
    a2.bar(["np1"] + names, [mem[k] / mem["np1"] for k in ["np1"] + names], color="C1")
    a2.set_ylabel("peak memory per rank / one rank's")
    a2.set_title("ring attention: peak memory per rank")
    args = data.get("args", {})
    fig.suptitle(f"{subtitle(data['machine'])}; seq {args.get('seq')}, "
                 f"{args.get('heads')} heads x {args.get('dim')}, {args.get('dtype')}",
                 fontsize=9)
    return save(fig, path)


def plot_debug(data: dict, path: str) -> str:
    rows = [r for r in data["rows"] if r["case"] == "checks"]
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    y = [r["ratio"]["median"] for r in rows]
    ax.bar([f"{r['n']} x {r['n']}" for r in rows], y, color="C0",
           yerr=[[max(v - r["ratio"]["min"], 0) for v, r in zip(y, rows)],
                 [max(r["ratio"]["max"] - v, 0) for v, r in zip(y, rows)]], capsize=3)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("time with collective checks / without")
    ax.set_title("set_collective_checks(True): S0 -> R all-gather")
    fig.suptitle(subtitle(data["machine"]), fontsize=9)
    return save(fig, path)


def save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


PLOTTERS = {"redistribute": plot_redistribute, "dispatch": plot_dispatch,
            "tensor_parallel": plot_tensor_parallel, "checkpoint": plot_checkpoint,
            "context_parallel": plot_context_parallel, "debug": plot_debug}


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default=os.path.join(here, "results"))
    ap.add_argument("--out", default=None, help="directory for the PNGs (default "
                    "RESULTS/plots)")
    args = ap.parse_args()
    out = args.out or os.path.join(args.results, "plots")
    status = 0
    # One folder of results per kind of CPU (benchmarks/_common.result_path), and
    # the same folder of plots.
    for path in sorted(glob.glob(os.path.join(args.results, "*", "*.json"))):
        base = os.path.splitext(os.path.basename(path))[0]
        kind = base.split("-np")[0]
        if kind not in PLOTTERS:
            print(f"skipped {path}: no plot for {kind!r}")
            continue
        with open(path) as f:
            data = json.load(f)
        folder = os.path.join(out, os.path.basename(os.path.dirname(path)))
        os.makedirs(folder, exist_ok=True)
        try:
            png = PLOTTERS[kind](data, os.path.join(folder, base + ".png"))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            # a result file from an older version of its benchmark: say so, go on
            print(f"could not plot {path}: {type(e).__name__}: {e}", file=sys.stderr)
            status = 1
            continue
        print(f"wrote {png}")
    return status


if __name__ == "__main__":
    sys.exit(main())
