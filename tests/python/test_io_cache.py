"""A save releases the clean cached pages of the file it replaces (a Zarr save,
of each chunk file it replaces) before writing its own (mt_io_release_cache),
so that the new pages reuse them, as numpy.save's truncation of the old file
lets its writes do: in a virtual machine that hands long-free memory back to its
host, the first write into such memory faults in the host and costs many times
the copy. The replaced file stays whole on the device, and dirty pages stay put:
dropping them would start their write-back. Whether a page is cached is read
with cachestat, which only looks: a read that misses starts read-ahead even when
told not to wait (preadv's RWF_NOWAIT), and on a fast disk that read-ahead can
finish before the call returns, so a dropped page read as cached.
"""

from __future__ import annotations

import ctypes
import os
import platform
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard, init_device_mesh
from mpi_helpers import Problems

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
SHAPE = (32 * N, 1024)



class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in
                ("cached", "dirty", "writeback", "evicted", "recently_evicted")]


# cachestat's number on x86-64 and in the generic table (arm64, riscv64)
_CACHESTAT = 451 if platform.machine() in ("x86_64", "aarch64", "riscv64") else None
_LIBC = ctypes.CDLL(None, use_errno=True)


def cached(fd: int) -> bool:
    """Whether the first page of ``fd``'s file is in the page cache: cachestat's
    count, or, on a kernel without it, a read that refuses to wait (a miss then
    starts the page's read-ahead, so only one rank of a node asks about a shared
    file)."""
    if _CACHESTAT is not None and platform.system() == "Linux":
        stat = _Stat()
        if _LIBC.syscall(_CACHESTAT, fd, ctypes.byref(_Range(0, 4096)),
                         ctypes.byref(stat), 0) == 0:
            return stat.cached > 0
    try:
        return os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT) > 0
    except BlockingIOError:
        return False


def read_all(fd: int) -> bytes:
    """The whole file, read through ``fd`` (so it is cached)."""
    out, at = [], 0
    while chunk := os.pread(fd, 1 << 20, at):
        out.append(chunk)
        at += len(chunk)
    return b"".join(out)


@pytest.fixture(scope="module")
def releases(tmp) -> bool:
    """Whether a save can release a file's cache here: a kernel with cachestat
    (Linux 6.5, where the core knows its number) and a file system whose clean
    pages fadvise drops (not tmpfs). Read on the first rank, tried for up to a
    second: on a busy machine the kernel can keep a just-written clean page for a
    while, which would read as "never drops"."""
    def probe() -> bool:
        release = tuple(int(v) for v in platform.release().split("-")[0].split(".")[:2])
        if (platform.system() != "Linux" or release < (6, 5)
                or platform.machine() not in ("x86_64", "aarch64", "riscv64")):
            return False
        path = os.path.join(tmp, "probe")
        with open(path, "wb") as f:
            f.write(b"x" * 8192)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(path, os.O_RDONLY)
        try:
            for _ in range(20):
                read_all(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                if not cached(fd):
                    return True
                time.sleep(0.05)
            return False
        finally:
            os.close(fd)
    return COMM.bcast(probe() if RANK == 0 else None)


def versions(k: int):
    mesh = init_device_mesh("cpu", (N,))
    return mt.distribute_tensor(np.full(SHAPE, float(k)), mesh, [Shard(0)])


def everywhere(p: Problems) -> list:
    """Collective: every rank's failed expectations, the same on every rank."""
    return [f"rank {r}: {w}" for r, ws in enumerate(COMM.allgather(list(p))) for w in ws]


def replaced(path: str, save_old, save_new, releases, asks: bool) -> list:
    """Collective. ``save_old``, then ``save_new`` over it while each rank holds
    the old file at ``path`` open, and the ranks that ``asks`` whether its pages
    are cached: what went wrong, on every rank."""
    p = Problems()
    save_old()
    fd = os.open(path, os.O_RDONLY)  # the old file, which outlives its name
    try:
        before = read_all(fd)
        COMM.Barrier()
        p.expect(not asks or cached(fd), "the file just read is not cached")
        COMM.Barrier()
        save_new()
        if asks:
            p.expect(cached(fd) != releases, "the replaced file's pages " + (
                "stayed cached" if releases else "were dropped where nothing drops them"))
        COMM.Barrier()  # the ranks of a node share its cache, which the read refills
        p.expect(read_all(fd) == before, "the replaced file changed")
    finally:
        os.close(fd)
    return everywhere(p)


def settled(run, tries: int = 5) -> list:
    """Collective. ``run()``'s problems (the same on every rank), run again up to
    ``tries`` times while it has some, a moment apart: the kernel cannot drop a
    clean page that it holds for a moment (one reclaim has taken off its list),
    which nothing the save does can prevent. A save that never releases fails
    every try."""
    for attempt in range(tries):
        if attempt:
            time.sleep(0.1)
        found = run()
        if not found:
            break
    return found


@pytest.mark.parametrize("suffix", [".npy", ".h5"])
def test_a_save_releases_the_clean_cache_of_the_file_it_replaces(tmp, releases, suffix):
    path = os.path.join(tmp, f"clean{suffix}")
    extra = {"dataset": "x"} if suffix == ".h5" else {}
    # the first save is durable: its pages are clean
    assert settled(lambda: replaced(path, lambda: mt.save(versions(1), path, **extra),
                                    lambda: mt.save(versions(2), path, **extra), releases,
                                    RANK == 0)) == []
    mesh = init_device_mesh("cpu", (N,))
    back = mt.load(path, mesh, [Shard(0)], **extra).to_local()
    assert COMM.allreduce(int(not np.all(back == 2.0))) == 0


@pytest.mark.parametrize("suffix", [".npy", ".h5"])
def test_a_save_leaves_the_dirty_cache_of_the_file_it_replaces(tmp, suffix):
    path = os.path.join(tmp, f"dirty{suffix}")
    extra = {"dataset": "x"} if suffix == ".h5" else {}
    # neither save syncs: the first one's pages are dirty when the second starts
    assert replaced(path, lambda: mt.save(versions(1), path, durable=False, **extra),
                    lambda: mt.save(versions(2), path, durable=False, **extra),
                    False, RANK == 0) == []


def test_a_zarr_save_releases_the_clean_cache_of_the_chunks_it_replaces(tmp, releases):
    path = os.path.join(tmp, "clean.zarr")
    # chunks follow the shards: rank r writes the chunk file c.r.0
    chunk = os.path.join(path, f"c.{RANK}.0")
    assert settled(lambda: replaced(chunk, lambda: mt.save(versions(1), path),
                                    lambda: mt.save(versions(2), path), releases, True)) == []
    mesh = init_device_mesh("cpu", (N,))
    back = mt.load(path, mesh, [Shard(0)]).to_local()
    assert COMM.allreduce(int(not np.all(back == 2.0))) == 0
