"""A file replaced while it is being loaded: each rank used to open the
path on its own, so a load during another job's ``os.replace`` (or ``mt.save``)
could give one rank rows of the old file and another rank rows of the new one.
Every rank now reads the file it opened, the ranks agree that they opened the
same one, and a load gives one version on every rank or raises OSError on every
rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import zarr
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard, init_device_mesh
from mpitensor.checkpoint import _io, _zarr
from mpi_helpers import Problems

COMM = MPI.COMM_WORLD
N = COMM.Get_size()
RANK = COMM.Get_rank()
SHAPE = (64 * N, 1024)  # float64 rows, so each rank's read takes a while



def version(k: int) -> np.ndarray:
    return np.full(SHAPE, float(k))


def replace_on_first(write) -> None:
    """Collective: rank 0 writes a new version beside ``path`` and renames it over
    the path, between two barriers."""
    COMM.Barrier()
    if RANK == 0:
        write()
    COMM.Barrier()


@pytest.mark.parametrize("suffix", [".npy", ".h5"])
def test_a_load_reads_the_version_it_opened(tmp, suffix, monkeypatch):
    """The file is replaced after the ranks opened it and before they read: every
    rank reads the version it opened (the new one is another inode)."""
    path = os.path.join(tmp, f"pinned{suffix}")
    mesh = init_device_mesh("cpu", (N,))
    extra = {"dataset": "x"} if suffix == ".h5" else {}
    mt.save(mt.distribute_tensor(version(1), mesh, [Shard(0)]), path, **extra)
    real = mt.checkpoint._io.io_load

    def replaced_first(*args):
        replace_on_first(lambda: (np.save(path + ".new.npy", version(2)),
                                  os.replace(path + ".new.npy", path)))
        return real(*args)

    monkeypatch.setattr(mt.checkpoint._io, "io_load", replaced_first)
    back = mt.load(path, mesh, [Shard(0)], **extra)
    monkeypatch.undo()
    assert COMM.allreduce(int(not np.all(back.to_local() == 1.0))) == 0, \
        "some rank read the file that replaced the one it opened"


@pytest.mark.skipif(N < 2, reason="one rank reads one file")
def test_ranks_that_opened_different_versions_raise_everywhere(tmp, monkeypatch):
    """The path is replaced between the first rank's look (it opened the old
    file) and the other ranks' opens: every rank raises OSError, none returns
    rows of two files."""
    path = os.path.join(tmp, "split.npy")
    mesh = init_device_mesh("cpu", (N,))
    mt.save(mt.distribute_tensor(version(1), mesh, [Shard(0)]), path)
    real = mt.checkpoint._tensor.header_of

    def replaced_between(*args):
        replace_on_first(lambda: (np.save(path + ".new.npy", version(2)),
                                  os.replace(path + ".new.npy", path)))
        return real(*args)

    monkeypatch.setattr(mt.checkpoint._tensor, "header_of", replaced_between)
    try:
        mt.load(path, mesh, [Shard(0)])
        mine = None
    except Exception as e:  # noqa: BLE001 - compared across ranks
        mine = (type(e).__name__, str(e))
    monkeypatch.undo()
    seen = COMM.allgather(mine)
    assert all(s == seen[0] for s in seen) and seen[0] is not None \
        and seen[0][0] == "OSError" and "replaced" in seen[0][1], seen


def test_a_zarr_store_removed_under_a_load_raises_everywhere(tmp, monkeypatch):
    """mt.save swaps a new store in and removes the old one, its zarr.json first:
    a load still reading the old one (whose chunks may be gone, which Zarr would
    read as the fill value) raises OSError on every rank instead."""
    path = os.path.join(tmp, "store.zarr")
    mesh = init_device_mesh("cpu", (N,))
    mt.save(mt.distribute_tensor(version(1), mesh, [Shard(0)]), path)
    real = _zarr.ZarrReader.read

    def swapped_first(self, *args):
        def swap():
            new = path + ".new"
            a = zarr.create_array(new, shape=SHAPE, dtype="f8", chunks=(64, 1024))
            a[...] = version(2)
            assert _io.exchange(new, path)
            _zarr._drop_metadata(new)
            shutil.rmtree(new)
        replace_on_first(swap)
        return real(self, *args)

    monkeypatch.setattr(_zarr.ZarrReader, "read", swapped_first)
    try:
        mt.load(path, mesh, [Shard(0)])
        mine = None
    except Exception as e:  # noqa: BLE001 - compared across ranks
        mine = (type(e).__name__, str(e))
    monkeypatch.undo()
    seen = COMM.allgather(mine)
    assert all(s == seen[0] for s in seen) and seen[0] is not None \
        and seen[0][0] == "OSError" and "replaced" in seen[0][1], seen


REPLACER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    path, shape, seconds = sys.argv[1], eval(sys.argv[2]), float(sys.argv[3])
    end, k = time.time() + seconds, 2
    while time.time() < end:
        np.save(path + ".next.npy", np.full(shape, float(k)))
        os.replace(path + ".next.npy", path)
        k += 1
""")


@pytest.mark.skipif(N < 2, reason="one rank reads one file")
def test_loads_while_another_process_replaces_the_file(tmp):
    """Another process replaces the file over and over (os.replace of a new
    version) while the job loads it: each load gives one version on every rank,
    or an OSError on every rank."""
    path = os.path.join(tmp, "raced.npy")
    mesh = init_device_mesh("cpu", (N,))
    mt.save(mt.distribute_tensor(version(1), mesh, [Shard(0)]), path)
    seconds = 4.0
    proc = None
    if RANK == 0:
        proc = subprocess.Popen([sys.executable, "-c", REPLACER, path, repr(SHAPE),
                                 str(seconds)])
    COMM.Barrier()
    p, loads, refused = Problems(), 0, 0
    end = COMM.bcast(time.time() + seconds - 0.5 if RANK == 0 else None)
    while COMM.bcast(time.time() < end if RANK == 0 else None):
        try:
            local = mt.load(path, mesh, [Shard(0)]).to_local()
            mine = ("ok", tuple(np.unique(local)))
        except OSError as e:
            mine = ("OSError", str(e))
        seen = COMM.allgather(mine)
        loads += 1
        if seen[0][0] == "OSError":
            refused += 1
            p.expect(all(s == seen[0] for s in seen), f"load {loads}: {seen}")
        else:
            versions = {v for s in seen for v in s[1]} if all(s[0] == "ok" for s in seen) \
                else None
            p.expect(versions is not None and len(versions) == 1,
                     f"load {loads}: ranks read {seen}")
    if proc is not None:
        proc.wait()
    COMM.Barrier()
    assert p == [], p[:5]
    assert loads - refused > 0, f"all {loads} loads refused"
