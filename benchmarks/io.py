#!/usr/bin/env python
"""Saving and loading sharded arrays: mpitensor against Heat 1.8 (HDF5, Zarr) and
against raw ``os.pwrite``/``os.pread`` of each rank's block (contiguous HDF5 and
``.npy``), side by side in the same processes.

    OPENBLAS_NUM_THREADS=1 mpiexec --oversubscribe -n 2 .venv/bin/python \
        benchmarks/io.py [--mib 64] [--reps 3] [--rows even,uneven] \
        [--formats npy,h5,zarr] [--budget 240] [--dir /tmp] [--quick] [--replacing]

For each size (MiB of float64 per rank, 512 columns) and row count (divisible by
the ranks, and one more row, so the shards are uneven), it times, interleaved:

* ``mt_h5_save``/``heat_h5_save``: ``mt.save(x, f, dataset="x")`` against
  ``ht.save_hdf5``; ``mt_h5_load``/``heat_h5_load``: ``mt.load(..., [Shard(0)])``
  against ``ht.load_hdf5(split=0)``;
* ``mt_zarr_save``/``heat_zarr_save``, ``mt_zarr_load``/``heat_zarr_load`` likewise;
* ``mt_npy_save``/``mt_npy_load`` against ``raw_write``/``raw_read``. ``raw_write``
  makes a new file as ``numpy.save`` does: the first rank opens the path with
  ``O_TRUNC`` (the previous file's pages and blocks are freed, new ones allocated
  as the bytes land), then every rank ``pwrite``s its rows at their offset. That
  is the least a save of new bytes costs; it promises nothing (a reader may see
  a half-written file, a failed write leaves one), where a save writes under a
  temporary name and swaps it in. Rewriting the pages of a file that already
  holds them would cost only a memory copy, which no save can be.

``mt_zarr_save_replacing``/``mt_zarr_save_new``: a Zarr save over a store of many
small chunks (of REPLACED_CHUNK bytes, as many files as a large array's store
has), against the same save where no store is: what replacing a store costs
beyond writing one (its files removed). Before each, untimed, the old store is
written (or removed) and written back. Not durable. ``--replacing`` times these
two alone.

Every save, on both sides, replaces the file of the previous repetition. Each is
timed twice, with the same durability on both sides: syncing nothing (ours
``durable=False``, as Heat and ``numpy.save``), and durable, under the names
ending in ``_durable``: ours ``durable=True``; Heat's save followed by an
``fsync`` of every file it wrote (each rank a share of them) and of every
directory that names one; ``raw_write`` followed by each rank's ``fsync`` of the
file and the first rank's of its directory. The syncs are timed, inside the
save. Before each timed save, every page an earlier variant left dirty is
written back, untimed (``sync``), so that no save pays for the one before it.
Before each timed load, the file's pages are dropped from the page cache (``fsync`` and
``posix_fadvise(DONTNEED)`` on every file of the store), so loads read the
device. Each timing starts after a barrier and ends when the last rank is done.

A run stops starting new points once ``--budget`` seconds have passed (the point
under way finishes); the JSON says which points ran. A variant whose first run
takes longer than ``--slow`` seconds runs that once (Heat's Zarr save of uneven
rows writes one chunk file per row); the JSON lists those per point. Printed: medians of the
bandwidth of the whole array with [min..max], and the ratios mt/Heat and mt/raw
(above 1: mpitensor is faster), each the median of the repetition-by-repetition
ratio. Heat is optional; without it only the raw comparisons run. Writes
benchmarks/results/<cpu>/io-np{N}.json (summaries only, as every benchmark).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard
from mpitensor.checkpoint import _zarr

from _common import (machine, machine_line, ratio, result_path,  # benchmarks/ is sys.path[0]
                     summary, time_interleaved, write_result)

MiB = 1024 * 1024
COLS = 512
COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
FORMATS = ("npy", "h5", "zarr")
# (mpitensor, its reference) pairs whose per-repetition ratios are reported
PAIRS = [("mt_h5_save", "heat_h5_save"), ("mt_h5_load", "heat_h5_load"),
         ("mt_zarr_save", "heat_zarr_save"), ("mt_zarr_load", "heat_zarr_load"),
         ("mt_npy_save", "raw_write"), ("mt_h5_save", "raw_write"),
         ("mt_npy_load", "raw_read"), ("mt_h5_load", "raw_read"),
         ("mt_h5_save_durable", "heat_h5_save_durable"),
         ("mt_zarr_save_durable", "heat_zarr_save_durable"),
         ("mt_npy_save_durable", "raw_write_durable"),
         ("mt_zarr_save_replacing", "mt_zarr_save_new"),
         ("mt_h5_save_durable", "raw_write_durable")]
# Bytes of a chunk of the store that mt_zarr_save_replacing replaces.
REPLACED_CHUNK = 64 << 10


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


def _written_back() -> None:
    """What earlier saves left dirty is written back on every rank's node;
    collective."""
    os.sync()
    COMM.Barrier()


def _fsync(path: str, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durably(save, path: str):
    """``save`` followed by what makes its result durable, as a durable save of
    ours does: every file under ``path`` synced (rank r the r-th of every N, so
    the ranks share the work, and on one node the first sync of a file writes
    it all) and then every directory that names one, the parent included; the
    ranks meet after the syncs, so the save returns durable everywhere.
    Collective."""
    def run():
        save()
        COMM.Barrier()  # every rank's bytes are in before any sync
        if os.path.isdir(path):
            folders = [d for d, _, _ in os.walk(path)]
            files = sorted(os.path.join(d, f) for d in folders for f in os.listdir(d)
                           if not os.path.isdir(os.path.join(d, f)))
        else:
            folders, files = [], [path]
        for f in files[RANK::N]:
            _fsync(f)
        for d in sorted(folders + [os.path.dirname(path)])[RANK::N]:
            _fsync(d, os.O_DIRECTORY)
        COMM.Barrier()
    return run


def _remove(path: str) -> None:
    if RANK == 0:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
    COMM.Barrier()


def _raw(path: str, local: np.ndarray, at: int):
    """The raw write and read of this rank's rows at byte ``at`` of ``path``, and
    the write made durable (each rank syncs what it wrote, then the first rank
    the directory, which names the file)."""
    data = memoryview(local).cast("B")

    def write(durable=False):
        if RANK == 0:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666))
        COMM.Barrier()  # the file is new before any rank writes into it
        fd = os.open(path, os.O_WRONLY)
        try:
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], at + done)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if durable:
            COMM.Barrier()
            if RANK == 0:
                _fsync(os.path.dirname(path), os.O_DIRECTORY)
            COMM.Barrier()

    def read():
        out = np.empty_like(local)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.preadv(fd, [memoryview(out).cast("B")], at)
        finally:
            os.close(fd)

    return write, lambda: write(True), read


def variants(ht, folder: str, x, mesh, formats) -> tuple[dict, dict]:
    """(saves, loads): name -> function, and name -> (file, function)."""
    local = np.ascontiguousarray(x.to_local())
    row0 = sum(COMM.allgather(local.shape[0])[:RANK])
    path = {k: os.path.join(folder, v) for k, v in
            {"h5": "x.h5", "zarr": "x.zarr", "npy": "x.npy", "raw": "x.raw",
             "hh5": "heat.h5", "hzarr": "heat.zarr"}.items()}
    # the durable saves' files, apart, so that each variant replaces its own
    synced = {k: os.path.join(folder, "synced-" + os.path.basename(v))
              for k, v in path.items()}
    saves, loads = {}, {}
    if "h5" in formats:
        saves["mt_h5_save"] = lambda: mt.save(x, path["h5"], dataset="x", durable=False)
        saves["mt_h5_save_durable"] = lambda: mt.save(x, synced["h5"], dataset="x")
        loads["mt_h5_load"] = (path["h5"], lambda: mt.load(path["h5"], mesh, [Shard(0)],
                                                           dataset="x"))
    if "zarr" in formats:
        saves["mt_zarr_save"] = lambda: mt.save(x, path["zarr"], durable=False)
        saves["mt_zarr_save_durable"] = lambda: mt.save(x, synced["zarr"])
        loads["mt_zarr_load"] = (path["zarr"], lambda: mt.load(path["zarr"], mesh,
                                                               [Shard(0)]))
    if "npy" in formats or "h5" in formats:
        raw_write, _, raw_read = _raw(path["raw"], local, row0 * COLS * 8)
        saves["raw_write"], loads["raw_read"] = raw_write, (path["raw"], raw_read)
        saves["raw_write_durable"] = _raw(synced["raw"], local, row0 * COLS * 8)[1]
    if "npy" in formats:
        saves["mt_npy_save"] = lambda: mt.save(x, path["npy"], durable=False)
        saves["mt_npy_save_durable"] = lambda: mt.save(x, synced["npy"])
        loads["mt_npy_load"] = (path["npy"], lambda: mt.load(path["npy"], mesh,
                                                             [Shard(0)]))
    if ht is not None:
        hx = ht.array(local, is_split=0)
        if "h5" in formats:
            saves["heat_h5_save"] = lambda: ht.save_hdf5(hx, path["hh5"], "x", mode="w")
            saves["heat_h5_save_durable"] = _durably(
                lambda: ht.save_hdf5(hx, synced["hh5"], "x", mode="w"), synced["hh5"])
            loads["heat_h5_load"] = (path["hh5"], lambda: ht.load_hdf5(path["hh5"], "x",
                                                                       split=0))
        if "zarr" in formats:
            saves["heat_zarr_save"] = lambda: ht.save_zarr(hx, path["hzarr"],
                                                           overwrite=True)
            saves["heat_zarr_save_durable"] = _durably(
                lambda: ht.save_zarr(hx, synced["hzarr"], overwrite=True), synced["hzarr"])
            loads["heat_zarr_load"] = (path["hzarr"], lambda: ht.load_zarr(path["hzarr"],
                                                                           split=0))
    return saves, loads


def _old_store(path: str, x, chunk_bytes: int) -> None:
    """The store that a timed save replaces: ``x`` in chunks of ``chunk_bytes``
    at most, written back; or, for chunk_bytes 0, none. Collective."""
    _remove(path)
    if chunk_bytes:
        saved, _zarr.CHUNK_BYTES = _zarr.CHUNK_BYTES, chunk_bytes
        try:
            mt.save(x, path, durable=False)
        finally:
            _zarr.CHUNK_BYTES = saved
    _written_back()


def replacing(folder: str, x, reps: int) -> dict:
    """Seconds of mt_zarr_save_replacing and mt_zarr_save_new, interleaved."""
    path = os.path.join(folder, "replaced.zarr")
    olds = {"mt_zarr_save_replacing": REPLACED_CHUNK, "mt_zarr_save_new": 0}
    times = {k: [] for k in olds}

    def save():
        mt.save(x, path, durable=False)

    for _ in range(reps):
        for name, chunk in olds.items():
            _old_store(path, x, chunk)
            times[name].extend(time_interleaved(COMM, {name: save}, 1, 0)[name])
    _remove(path)
    return times


def point(ht, folder: str, rows: int, reps: int, formats, slow: float,
          replacing_only: bool = False) -> dict:
    """Seconds of every variant at ``rows`` rows, ``reps`` repetitions each, but
    one for a variant whose first run took more than ``slow`` seconds (Heat's Zarr
    of uneven rows: one chunk file per row); of the replacing pair alone when
    ``replacing_only``."""
    mesh = mt.init_device_mesh("cpu", (N,))
    x = mt.distribute_tensor(np.random.default_rng(0).standard_normal((rows, COLS)), mesh,
                             [Shard(0)])
    if replacing_only:
        return replacing(folder, x, reps)
    saves, loads = variants(ht, folder, x, mesh, formats)
    # A first round, which the others repeat, then replacing a file in every save.
    first = time_interleaved(COMM, saves, 1, 0, before=_written_back)
    once = {k for k, v in first.items() if v[0] > slow}
    times = time_interleaved(COMM, {k: f for k, f in saves.items() if k not in once},
                             reps, 0, before=_written_back)
    times.update({k: first[k] for k in once})
    for name in loads:
        times[name] = []
    for _ in range(reps):
        for name, (p, fn) in loads.items():
            if times[name] and times[name][0] > slow:
                continue
            _drop_cache(p)  # untimed
            times[name].extend(time_interleaved(COMM, {name: fn}, 1, 0)[name])
    if "zarr" in formats:
        times.update(replacing(folder, x, reps))
    for p in COMM.bcast(sorted(os.listdir(folder)) if RANK == 0 else None):
        _remove(os.path.join(folder, p))
    return times


def _summaries(nbytes: int, times: dict) -> dict:
    """MiB/s of the whole array per variant, and the pairs' ratios (of bandwidths,
    repetition by repetition), as summaries."""
    bw = {k: [nbytes / t / MiB for t in v] for k, v in times.items()}
    out = {"MiB_per_s": {k: summary(v) for k, v in bw.items()}, "ratios": {},
           "once": sorted(k for k, v in times.items() if len(v) == 1)}
    for a, b in PAIRS:
        if a in bw and b in bw:
            out["ratios"][f"{a}/{b}"] = ratio(bw[a], bw[b])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="64", help="MiB of float64 per rank, comma list")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", default="even,uneven",
                    help="even (divisible by the ranks), uneven (one more row), or both")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help=f"comma list of {', '.join(FORMATS)}")
    ap.add_argument("--budget", type=float, default=240,
                    help="seconds after which no new point starts")
    ap.add_argument("--slow", type=float, default=10,
                    help="seconds of a first run past which a variant runs once")
    ap.add_argument("--dir", default=None, help="where the files go (default: a temporary"
                    " folder under /tmp)")
    ap.add_argument("--quick", action="store_true", help="4 MiB per rank, 2 repetitions")
    ap.add_argument("--replacing", action="store_true",
                    help="time only mt_zarr_save_replacing against mt_zarr_save_new")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.quick:
        args.mib, args.reps = "4", 2
    formats = [f for f in args.formats.split(",") if f]
    kinds = [k for k in args.rows.split(",") if k]
    if set(formats) - set(FORMATS) or not formats or set(kinds) - {"even", "uneven"}:
        ap.error("--formats takes npy, h5, zarr; --rows takes even, uneven")
    ht = _heat()
    folder = COMM.bcast(tempfile.mkdtemp(dir=args.dir) if RANK == 0 else None)
    info = machine(COMM)
    if ht is not None:
        info["heat"] = ht.__version__
    points, skipped, start = [], [], time.monotonic()
    try:
        for mib in [int(s) for s in args.mib.split(",")]:
            even = mib * MiB // (8 * COLS) * N
            for kind in kinds:
                rows = even + (kind == "uneven")
                # rank 0's clock decides, so every rank stops at the same point
                if COMM.bcast(time.monotonic() - start > args.budget):
                    skipped.append({"mib_per_rank": mib, "rows": rows})
                    continue
                times = point(ht, folder, rows, args.reps, formats, args.slow,
                              args.replacing)
                res = _summaries(rows * COLS * 8, times)
                points.append({"mib_per_rank": mib, "rows": rows, **res})
                if RANK == 0:
                    _print(mib, rows, res)
    finally:
        if RANK == 0:
            shutil.rmtree(folder, ignore_errors=True)
    if RANK == 0:
        seconds = time.monotonic() - start
        print(machine_line(info) + ("" if ht else "; Heat not installed")
              + f"; {seconds:.0f} s" + (f"; {len(skipped)} points past the budget"
                                        if skipped else ""))
        path = args.out or result_path(f"io-np{N}.json")
        write_result(path, {"machine": info, "args": vars(args), "points": points,
                            "past_budget": skipped})
        print(f"wrote {path}")


def _print(mib: int, rows: int, res: dict) -> None:
    print(f"{mib} MiB/rank, {rows} rows (MiB/s of the whole array, median [min..max]):")
    for k, s in res["MiB_per_s"].items():
        print(f"  {k:22s} {s['median']:9.0f} [{s['min']:.0f}..{s['max']:.0f}]")
    for k, s in res["ratios"].items():
        print(f"  {k}: {s['median']:.2f}x [{s['min']:.2f}..{s['max']:.2f}]")


if __name__ == "__main__":
    main()
