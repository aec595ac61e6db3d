#!/usr/bin/env python
"""``mpitensor.save`` / ``mpitensor.load`` of a sharded DTensor against
``numpy.save`` / ``numpy.load`` of the same bytes from one process, in the same run.

Run under MPI (see benchmarks/README.md)::

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 4 .venv/bin/python \
        benchmarks/checkpoint.py [--sizes 64MiB,256MiB,1GiB] [--dir /tmp]

For each size (of the whole float32 array, 1024 columns) and layout on a 1-D mesh
over all ranks (``S0``: Shard(0), each rank's box one run of the file; ``S1``:
Shard(1), boxes interleave row by row, so mt.save exchanges them in memory into
row slabs, chunk by chunk while the previous chunk is written, and mt.load reads
row slabs and exchanges them back; up to --s1-max) it times, interleaved:

* ``mt_save``  every rank: ``mt.save(dt, path)`` (MPI-IO, temporary name + rename);
* ``np_save``  rank 0 alone: ``numpy.save(path, a)`` of the whole array;
* ``mt_load``  every rank: ``mt.load(path, mesh, [layout])``, its own box only;
* ``np_load``  rank 0 alone: ``numpy.load(path)`` of the whole file;
* ``px_save``  (S0 only) every rank: ``os.pwrite`` of its box into a file that
               exists with its header: the ceiling of N writers of one file on
               this file system, with no MPI and no rename.

Each save writes a new file (the old one is removed first, untimed), so both sides
allocate their blocks; no fsync on either side, so both measure writes into the page
cache and reads from it (the machine has far more memory than the files; each file
is read once, untimed, before its timed load, because a freshly written file is not
always still in the cache). While rank
0 runs NumPy the other ranks wait asleep, not spinning, so NumPy gets a whole core.
Each timing starts after a barrier and ends when the last rank is done. A
repetition runs both saves, then both loads, in an order that alternates.

Reported per point: the median bandwidth of each side with its [min..max], and the
ratio mt/np of bandwidths (median and [min..max] over repetitions; the target is
>= 0.8). For the largest size it also records what each rank read and wrote during
mt_load / mt_save (``rchar`` / ``wchar`` of /proc/self/io): each rank moves about
1/N of the file. Results go to benchmarks/results/<cpu>/checkpoint-np{N}.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Shard

from _common import machine, machine_line, result_path, write_result  # benchmarks/ is sys.path[0]

MiB = 1024 * 1024
COLS = 1024
COMM = MPI.COMM_WORLD


def parse_bytes(text: str) -> int:
    t = text.strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1024, "m": MiB, "g": 1024 * MiB}.get(t[-1:], 1)
    return int(float(t.rstrip("kmg")) * mult)


def fmt_bytes(n: int) -> str:
    return f"{n // (1024 * MiB)} GiB" if n >= 1024 * MiB else f"{n // MiB} MiB"


def idle_barrier() -> None:
    """A barrier that sleeps instead of spinning, so a rank working alone (NumPy on
    rank 0) is not slowed by the others polling on a shared core."""
    req = COMM.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def timed(fn, everyone: bool) -> float:
    """Seconds from a common start until the last rank is done with fn()."""
    idle_barrier()
    t0 = time.perf_counter()
    if everyone or COMM.rank == 0:
        fn()
    mine = time.perf_counter() - t0
    idle_barrier()
    return COMM.allreduce(mine, op=MPI.MAX)


def io_counters() -> tuple[int, int]:
    """(rchar, wchar) of this process: bytes passed to read and write calls."""
    with open("/proc/self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def remove(path: str) -> None:
    if COMM.rank == 0 and os.path.exists(path):
        os.remove(path)
    idle_barrier()


def make_dtensor(mesh, nbytes: int, layout: str):
    """The DTensor of a float32 (rows, COLS) array of values 0, 1, 2, ... built
    from each rank's shard, and on rank 0 the whole array for NumPy."""
    rows, n = nbytes // 4 // COLS, COMM.size
    # Integers computed exactly in int64, then cast the same way on every side.
    full = (np.arange(rows * COLS).astype(np.float32).reshape(rows, COLS)
            if COMM.rank == 0 else None)
    r = COMM.rank
    if layout == "S0":
        local = np.arange(r * rows // n * COLS, (r + 1) * rows // n * COLS)
        return DTensor.from_local(local.astype(np.float32).reshape(rows // n, COLS), mesh,
                                  [Shard(0)]), full
    cols = np.arange(r * COLS // n, (r + 1) * COLS // n)
    local = (np.arange(rows)[:, None] * COLS + cols).astype(np.float32)
    return DTensor.from_local(local, mesh, [Shard(1)]), full


def verify(dt, full, mesh, path: str, layout: str) -> None:
    """Once per point: the file is what numpy.save writes and loads back exactly."""
    mt.save(dt, path, durable=False)
    ok = True
    if COMM.rank == 0:
        ok = np.array_equal(np.load(path), full)
    back = mt.load(path, mesh, [Shard(0 if layout == "S0" else 1)])
    ok = ok and np.array_equal(back.to_local(), dt.to_local())
    if not COMM.allreduce(ok, op=MPI.LAND):
        raise SystemExit(f"verification failed for {path}")


def run_point(mesh, nbytes: int, layout: str, reps: int, directory: str) -> dict:
    dt, full = make_dtensor(mesh, nbytes, layout)
    pl = [Shard(0 if layout == "S0" else 1)]
    mt_path, np_path = (os.path.join(directory, f"bench-{k}.npy") for k in ("mt", "np"))
    verify(dt, full, mesh, mt_path, layout)
    if COMM.rank == 0:
        np.save(np_path, full)
    px_path = os.path.join(directory, "bench-px.npy")
    ops = {
        "mt_save": (lambda: mt.save(dt, mt_path, durable=False), True, mt_path),
        "np_save": (lambda: np.save(np_path, full), False, np_path),
        "mt_load": (lambda: mt.load(mt_path, mesh, pl), True, None),
        "np_load": (lambda: np.load(np_path), False, None),
    }
    if layout == "S0":
        ops["px_save"] = (lambda: pwrite_share(px_path, dt), True, px_path)
    times = {k: [] for k in ops}
    moved = {}
    for rep in range(reps):
        saves = [k for k in ("mt_save", "np_save", "px_save") if k in ops]
        for group in (saves, ["mt_load", "np_load"]):
            for name in group[rep % len(group):] + group[:rep % len(group)]:
                fn, everyone, target = ops[name]
                if target is not None:
                    remove(target)
                    if name == "px_save":
                        create_with_header(target, dt)
                elif name in ("mt_load", "np_load"):
                    warm(mt_path if name == "mt_load" else np_path)
                before = io_counters()
                times[name].append(timed(fn, everyone))
                after = io_counters()
                moved[name] = (after[0] - before[0], after[1] - before[1])
    return summarize(nbytes, layout, times, moved)


def warm(path: str) -> None:
    """Read the file once, untimed: on this VM the first read of a freshly written
    GiB file often comes from the disk (about 0.4 GB/s) and later ones from the page
    cache (about 3.7 GB/s), for NumPy's file and ours alike, so without this the
    1 GiB load ratios flipped between 0.13 and 5 with the cache, not the code."""
    if COMM.rank == 0:
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(16 << 20)
            while f.readinto(buf):
                pass
    COMM.Barrier()


def create_with_header(path: str, dt) -> None:
    """Untimed, for px_save: the file with its .npy header, made by rank 0."""
    if COMM.rank == 0:
        with open(path, "wb") as f:
            f.write(npy_header(dt))
    idle_barrier()


def npy_header(dt) -> bytes:
    from mpitensor.checkpoint import _npy

    return _npy.encode(dt.shape, dt.dtype)


def pwrite_share(path: str, dt) -> None:
    """The ceiling of N writers of one file without MPI: every rank pwrite()s its
    contiguous Shard(0) box at its offset (the file and header exist already)."""
    local = dt.to_local()
    offset = len(npy_header(dt)) + COMM.rank * local.nbytes
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, local.data, offset)
    finally:
        os.close(fd)


def summarize(nbytes: int, layout: str, times: dict, moved: dict) -> dict:
    def stats(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    out = {"bytes": nbytes, "layout": layout}
    for op in ("save", "load"):
        mt_t, np_t = times[f"mt_{op}"], times[f"np_{op}"]
        out[op] = {
            "mt_GBps": stats([nbytes / t / 1e9 for t in mt_t]),
            "np_GBps": stats([nbytes / t / 1e9 for t in np_t]),
            # Per repetition: NumPy's time over mpitensor's = bandwidth mt / np.
            "ratio": stats([n / m for m, n in zip(mt_t, np_t)]),
        }
    if "px_save" in times:
        px = times["px_save"]
        out["save"]["pwrite_GBps"] = stats([nbytes / t / 1e9 for t in px])
        out["save"]["pwrite_ratio"] = stats([n / p for p, n in zip(px, times["np_save"])])
    read = COMM.gather(moved["mt_load"][0])
    wrote = COMM.gather(moved["mt_save"][1])
    out["per_rank_read_bytes"], out["per_rank_written_bytes"] = read, wrote
    return out


def report(results: list, n: int) -> None:
    print(f"\nmpitensor.save/load vs numpy.save/load of the same bytes, np={n} "
          f"(GB/s: median [min..max]; ratio = mt/np bandwidth, target >= 0.8)")
    head = f"{'size':>8} {'layout':>6} {'op':>5} {'mt GB/s':>22} {'numpy GB/s':>22} {'ratio':>20}"
    print(head)
    print("(px: N ranks pwrite() their S0 boxes into one file, no MPI: the file "
          "system's ceiling for N writers)")
    for r in results:
        for op in ("save", "load"):
            s = r[op]

            def fmt(d, w=22):
                return f"{d['median']:.2f} [{d['min']:.2f}..{d['max']:.2f}]".rjust(w)

            print(f"{fmt_bytes(r['bytes']):>8} {r['layout']:>6} {op:>5} {fmt(s['mt_GBps'])} "
                  f"{fmt(s['np_GBps'])} {fmt(s['ratio'], 20)}")
            if "pwrite_GBps" in s:
                print(f"{'':>8} {'':>6} {'px':>5} {fmt(s['pwrite_GBps'])} {'':>22} "
                      f"{fmt(s['pwrite_ratio'], 20)}")
    big = max(results, key=lambda r: r["bytes"])
    share = lambda v: ", ".join(f"{b / big['bytes']:.3f}" for b in v)  # noqa: E731
    print(f"\nat {fmt_bytes(big['bytes'])} {big['layout']}: fraction of the file each rank "
          f"read in mt_load: {share(big['per_rank_read_bytes'])}; wrote in mt_save: "
          f"{share(big['per_rank_written_bytes'])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64MiB,256MiB,1GiB")
    ap.add_argument("--layouts", default="S0,S1")
    ap.add_argument("--s1-max", default="1GiB", help="largest size timed for S1")
    ap.add_argument("--reps", type=int, default=9, help="repetitions up to 256 MiB")
    ap.add_argument("--reps-large", type=int, default=5, help="repetitions above")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    args = ap.parse_args()
    directory = COMM.bcast(tempfile.mkdtemp(prefix="mt-bench-ckpt-", dir=args.dir)
                           if COMM.rank == 0 else None)
    mesh = mt.init_device_mesh("cpu", (COMM.size,))
    info = machine(COMM)
    if COMM.rank == 0:
        print(machine_line(info), flush=True)
    results = []
    try:
        for nbytes in (parse_bytes(s) for s in args.sizes.split(",")):
            for layout in args.layouts.split(","):
                if layout == "S1" and nbytes > parse_bytes(args.s1_max):
                    continue
                reps = args.reps if nbytes <= 256 * MiB else args.reps_large
                results.append(run_point(mesh, nbytes, layout, reps, directory))
                if COMM.rank == 0:
                    print(f"done {fmt_bytes(nbytes)} {layout}", file=sys.stderr, flush=True)
    finally:
        idle_barrier()
        if COMM.rank == 0:
            for f in os.listdir(directory):
                os.remove(os.path.join(directory, f))
            os.rmdir(directory)
    if COMM.rank == 0:
        report(results, COMM.size)
        out = result_path(f"checkpoint-np{COMM.size}.json")
        write_result(out, {"machine": info, "args": vars(args), "results": results})
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
