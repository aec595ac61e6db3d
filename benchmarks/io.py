#!/usr/bin/env python
"""Saving and loading sharded arrays: mpitensor against Heat 1.8 (HDF5, Zarr) and
against raw ``os.pwrite``/``os.pread`` of each rank's block (contiguous HDF5 and
``.npy``), side by side in the same processes.

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 2 .venv/bin/python \
        benchmarks/io.py [--mib 64,256] [--reps 5] [--dir /tmp] [--quick]

For each size (MiB of float64 per rank, 512 columns) and row count (divisible by
the ranks, and one more row, so the shards are uneven), it times, interleaved:

* ``mt_h5_save``/``heat_h5_save``: ``mt.save(x, f, dataset="x")`` against
  ``ht.save_hdf5``; ``mt_h5_load``/``heat_h5_load``: ``mt.load(..., [Shard(0)])``
  against ``ht.load_hdf5(split=0)``;
* ``mt_zarr_save``/``heat_zarr_save``, ``mt_zarr_load``/``heat_zarr_load`` likewise;
* ``mt_npy_save``/``mt_npy_load`` and ``raw_write``/``raw_read``: every rank
  ``pwrite``s (``pread``s) its own rows at their offset in one existing file, the
  ceiling of N writers of one file here, with no metadata and no rename.

Both sides sync nothing (``durable=False``: Heat syncs nothing either). Before each
timed load, the file's pages are dropped from the page cache (``fsync`` and
``posix_fadvise(DONTNEED)`` on every file of the store), so loads read the device.
Each timing starts after a barrier and ends when the last rank is done. Reported:
medians of the bandwidth of the whole array with [min..max], and the ratios
mt/Heat and mt/raw (above 1: mpitensor is faster). Heat is optional; without it
only the raw comparisons run. Writes benchmarks/results/<cpu>/io-np{N}.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard

from _common import (machine, machine_line, result_path,  # benchmarks/ is sys.path[0]
                     time_interleaved, write_result)

MiB = 1024 * 1024
COLS = 512
COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()


def _heat():
    """Heat with torch on one thread per rank, or None (not installed, or a
    torch/torchvision pair that fails to load: see benchmarks/README.md)."""
    try:
        import heat
        import torch
    except Exception:  # noqa: BLE001 - an optional peer
        return None
    torch.set_num_threads(1)
    return heat


def _drop_cache(path: str) -> None:
    """Every rank drops the pages of every file under ``path`` (its own node's
    cache); collective."""
    files = [path] if os.path.isfile(path) else [
        os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    COMM.Barrier()


def _remove(path: str) -> None:
    if RANK == 0:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    COMM.Barrier()


def point(ht, folder: str, rows: int, reps: int) -> dict:
    mesh = mt.init_device_mesh("cpu", (N,))
    glob = np.random.default_rng(0).standard_normal((rows, COLS))
    x = mt.distribute_tensor(glob, mesh, [Shard(0)])
    local = np.ascontiguousarray(x.to_local())
    row0 = sum(COMM.allgather(local.shape[0])[:RANK])
    path = {"h5": "x.h5", "zarr": "x.zarr", "npy": "x.npy", "raw": "x.raw",
            "hh5": "heat.h5", "hzarr": "heat.zarr"}
    path = {k: os.path.join(folder, v) for k, v in path.items()}
    raw_bytes = rows * COLS * 8
    if RANK == 0:
        with open(path["raw"], "wb") as f:
            f.truncate(raw_bytes)
    COMM.Barrier()

    def raw_write():
        fd = os.open(path["raw"], os.O_WRONLY)
        os.pwrite(fd, memoryview(local).cast("B"), row0 * COLS * 8)
        os.close(fd)

    def raw_read():
        out = np.empty_like(local)
        fd = os.open(path["raw"], os.O_RDONLY)
        os.preadv(fd, [memoryview(out).cast("B")], row0 * COLS * 8)
        os.close(fd)

    saves = {
        "mt_h5_save": lambda: mt.save(x, path["h5"], dataset="x", durable=False),
        "mt_zarr_save": lambda: mt.save(x, path["zarr"], durable=False),
        "mt_npy_save": lambda: mt.save(x, path["npy"], durable=False),
        "raw_write": raw_write,
    }
    loads = {
        "mt_h5_load": (path["h5"], lambda: mt.load(path["h5"], mesh, [Shard(0)], dataset="x")),
        "mt_zarr_load": (path["zarr"], lambda: mt.load(path["zarr"], mesh, [Shard(0)])),
        "mt_npy_load": (path["npy"], lambda: mt.load(path["npy"], mesh, [Shard(0)])),
        "raw_read": (path["raw"], raw_read),
    }
    if ht is not None:
        hx = ht.array(local, is_split=0)
        saves["heat_h5_save"] = lambda: ht.save_hdf5(hx, path["hh5"], "x", mode="w")
        saves["heat_zarr_save"] = lambda: ht.save_zarr(hx, path["hzarr"], overwrite=True)
        loads["heat_h5_load"] = (path["hh5"], lambda: ht.load_hdf5(path["hh5"], "x", split=0))
        loads["heat_zarr_load"] = (path["hzarr"], lambda: ht.load_zarr(path["hzarr"], split=0))
    times = time_interleaved(COMM, saves, reps, 1)
    # The loads, each after its file's pages are dropped (untimed).
    for name, (p, _) in loads.items():
        times[name] = []
    for _ in range(reps):
        for name, (p, fn) in loads.items():
            _drop_cache(p)
            times[name].extend(time_interleaved(COMM, {name: fn}, 1, 0)[name])
    for p in path.values():
        _remove(p)
    return {k: [raw_bytes / t / MiB for t in v] for k, v in times.items()}  # MiB/s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="64,256", help="MiB of float64 per rank, comma list")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary"
                    " folder under /tmp)")
    ap.add_argument("--quick", action="store_true", help="4 MiB per rank, 2 repetitions")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.mib, args.reps = "4", 2
    ht = _heat()
    folder = COMM.bcast(tempfile.mkdtemp(dir=args.dir) if RANK == 0 else None)
    info = machine(COMM)
    if ht is not None:
        info["heat"] = ht.__version__
    points = []
    try:
        for mib in [int(s) for s in args.mib.split(",")]:
            even = mib * MiB // (8 * COLS) * N
            for rows in (even, even + 1):
                bw = point(ht, folder, rows, args.reps)
                points.append({"mib_per_rank": mib, "rows": rows, "MiB_per_s": bw})
                if RANK == 0:
                    _print(mib, rows, bw)
    finally:
        if RANK == 0:
            shutil.rmtree(folder, ignore_errors=True)
    if RANK == 0:
        print(machine_line(info) + ("" if ht else "; Heat not installed"))
        path = args.out or result_path(f"io-np{N}.json")
        write_result(path, {"machine": info, "args": vars(args), "points": points})
        print(f"wrote {path}")


def _print(mib: int, rows: int, bw: dict) -> None:
    med = {k: statistics.median(v) for k, v in bw.items()}
    print(f"{mib} MiB/rank, {rows} rows (MiB/s of the whole array, median [min..max]):")
    for k, v in bw.items():
        print(f"  {k:15s} {med[k]:9.0f} [{min(v):.0f}..{max(v):.0f}]")
    pairs = [("mt_h5_save", "heat_h5_save"), ("mt_h5_load", "heat_h5_load"),
             ("mt_zarr_save", "heat_zarr_save"), ("mt_zarr_load", "heat_zarr_load"),
             ("mt_npy_save", "raw_write"), ("mt_h5_save", "raw_write"),
             ("mt_npy_load", "raw_read"), ("mt_h5_load", "raw_read")]
    for a, b in pairs:
        if a in med and b in med:
            print(f"  {a}/{b}: {med[a] / med[b]:.2f}x")


if __name__ == "__main__":
    main()
