"""Shared by the benchmarks: torch.distributed on gloo over loopback (ranks and world
size from MPI) for the side-by-side torch comparisons, the machine facts every
result records and prints (machine, machine_line), the interleaved timing of
variants with its summaries, and the writing of a result (write_result). The
peak-memory probe is mpitensor.debug.peak_rss_growth, which the tests use too."""

import datetime
import json
import os
import platform
import random
import re
import statistics
import time

import numpy as np
from mpi4py import MPI


def init_gloo(comm):
    """Initialises torch.distributed (gloo) on the ranks of `comm` and returns
    (torch, torch.distributed, a 1-D torch DeviceMesh over all ranks). Collective."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from mpitensor.testing import init_torch_gloo

    dist = init_torch_gloo(comm)
    return torch, dist, init_device_mesh("cpu", (comm.size,))


def page_aligned(shape, dtype="f8") -> np.ndarray:
    """An uninitialised array that starts on a page boundary.

    Where an array starts decides how fast MPI moves it: Open MPI's shared-memory
    transport copies large messages in the kernel, whose copy on AMD Zen cores
    runs several times slower when the destination sits 8 to 24 bytes past the
    source modulo 64, and NumPy's large arrays start wherever malloc puts them
    (the heap or a fresh mapping), which changes from run to run. A baseline on
    page-aligned buffers is the raw collective at its best, every run.

    Example: ``page_aligned((4, 8)).ctypes.data % 4096 == 0``.
    """
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(n + 4096, dtype=np.uint8)
    start = -raw.ctypes.data % 4096
    return raw[start:start + n].view(dtype).reshape(shape)


def per_call_us(fn, calls: int) -> float:
    """Microseconds per call of ``fn()`` over ``calls`` calls in a row."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or "unknown"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cpu_key(model: str) -> str:
    """The folder of ``model``'s results under benchmarks/results: its words in lower
    case without trademarks or filler. Figures hold for one kind of CPU only, so each
    kind keeps its own results and docs/performance.md shows them side by side.

    Example: ``cpu_key("Intel(R) Xeon(R) Processor") == "intel-xeon"``.
    """
    words = re.sub(r"\((r|tm)\)|\b(processor|cpu)\b|@.*", " ", model.lower()).split()
    return "-".join(re.sub(r"[^a-z0-9]+", "-", w).strip("-") for w in words) or "unknown"


def result_path(name: str) -> str:
    """Where a benchmark writes its JSON ``name`` (e.g. "redistribute-np2.json") by
    default: benchmarks/results/<this CPU's cpu_key>/name, the folder made."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                          cpu_key(cpu_model()))
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)


def machine(comm) -> dict:
    """What every result records of where and when it ran: the CPU model, the
    machine's core count, the MPI library (Open MPI's version line), NumPy, Python,
    the ranks, the commit (git_revision) and the date (UTC). A benchmark's JSON
    holds these keys in its "machine" record, and its output starts with
    machine_line() of them: figures differ by CPU and by commit, so a result without
    them cannot be compared."""
    return {"np": comm.size, "cpu": cpu_model(), "cores": os.cpu_count(),
            "mpi": MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0],
            "numpy": np.__version__, "python": platform.python_version(),
            "commit": git_revision(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def machine_line(info: dict) -> str:
    """The header line of a benchmark's output, from machine()'s keys."""
    return (f"machine: {info['cpu']}, {info['cores']} cores; {info['mpi']}; "
            f"NumPy {info['numpy']}; Python {info['python']}; np={info['np']}; "
            f"commit {info['commit']}")


def write_result(path: str, result: dict) -> None:
    """Writes a benchmark's result to ``path`` as JSON, one line per top-level key
    and per record of a list of records (a point, a row), so that a result reads and
    diffs line by line. A result holds its "machine" record and summaries only
    (per point a median and its spread, e.g. summary()), never every repetition's
    time: results are committed, and the tables of docs/performance.md are made
    from them (benchmarks/tables.py).

    Example: ``write_result(result_path("agree-np2.json"), {"machine": info, "rows": rows})``.
    """
    def value(v):
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            return "[\n" + ",\n".join("  " + json.dumps(x) for x in v) + "\n ]"
        return json.dumps(v)

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {value(v)}" for k, v in result.items())
                + "\n}\n")


def git_revision(repo: str) -> str:
    """The short HEAD of `repo`, with "+dirty" when csrc/ or python/ have changes
    ("unknown" without git)."""
    import subprocess

    try:
        rev = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "csrc", "python"],
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"
    return (rev or "unknown") + ("+dirty" if dirty else "")


def time_interleaved(comm, variants, reps, warmup, clock=time.perf_counter, before=None):
    """Seconds of each variant (name -> function) over ``reps`` repetitions after
    ``warmup``: each repetition runs every variant once after a Barrier, in an order
    shuffled anew each time, alike on every rank (so none always runs after the
    same one and inherits its dirty pages or caches), and each time is the max over
    the ranks of ``comm``. ``clock`` may be time.thread_time
    for work that never waits on another rank: the CPU time it took, which a busy
    machine's scheduler does not stretch. ``before``, when given, runs untimed
    before every variant (on every rank, then a Barrier): writes that must not
    inherit the write-back of the variant before them pass a sync here.
    Collective."""
    names = list(variants)
    times = {k: [] for k in names}
    for r in range(-warmup, reps):
        order = list(names)
        random.Random(r).shuffle(order)
        for k in order:
            if before is not None:
                before()
            comm.Barrier()
            t0 = clock()
            variants[k]()
            dt = clock() - t0
            if r >= 0:
                times[k].append(dt)
    out = {}
    for k, v in times.items():
        buf = np.array(v)
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
        out[k] = buf.tolist()
    return out


def summary(values):
    """Median, min and max of a list of numbers."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratio(a, b):
    """:func:`summary` of the repetition-by-repetition ratios a / b."""
    return summary([x / y for x, y in zip(a, b)])
