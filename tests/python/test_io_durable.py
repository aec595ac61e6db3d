"""``mt.save(..., durable=False)`` skips the syncs (issue 46, item 5), as numpy.save
makes none; ``durable=True`` (the default) syncs a Zarr store's chunks, metadata
and directories before it is swapped in, and a dataset added to an HDF5 file
before save returns. An LD_PRELOAD spy (test_checkpoint_safety.SPY) logs every
fsync of a 2-rank job started from the np=1 run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from mpi4py import MPI

from mpi_helpers import fresh_job_env
from test_checkpoint_safety import SPY

N = MPI.COMM_WORLD.Get_size()

JOB = """
import os, sys
import h5py
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard

folder, durable = sys.argv[1], sys.argv[2] == "1"
mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
x = mt.distribute_tensor(np.arange(24.0).reshape(6, 4) + 1, mesh, [Shard(0)])
mt.save(x, os.path.join(folder, "x.zarr"), durable=durable)
mt.save(x, os.path.join(folder, "x.zarr"), durable=durable)  # replacing a store
if MPI.COMM_WORLD.Get_rank() == 0:
    with h5py.File(os.path.join(folder, "f.h5"), "w") as f:
        f.create_dataset("a", data=np.arange(3))
    os.mkdir(os.path.join(folder, "n"))
MPI.COMM_WORLD.Barrier()
mt.save(x, os.path.join(folder, "f.h5"), dataset="x", mode="a", durable=durable)
mt.save({"w": x}, os.path.join(folder, "sd"), durable=durable)
mt.save(x, os.path.join(folder, "n", "x.npy"), durable=durable)
"""


def spied_syncs(tmp_path, durable: bool) -> list:
    """The paths that a 2-rank job of JOB synced or started writing back."""
    spy = tmp_path / "spy.so"
    (tmp_path / "spy.c").write_text(SPY)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(spy),
                    str(tmp_path / "spy.c"), "-ldl"], check=True)
    (tmp_path / "job.py").write_text(JOB)
    folder = os.path.realpath(tmp_path / "out")
    os.mkdir(folder)
    log = tmp_path / "log"
    cmd = ["mpiexec", "--oversubscribe", "-n", "2", "-x", f"LD_PRELOAD={spy}", "-x",
           f"MT_SPY_LOG={log}", sys.executable, str(tmp_path / "job.py"), folder,
           "1" if durable else "0"]
    run = subprocess.run(cmd, env=fresh_job_env(), capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    events = [line.split(" ", 2)[1:] for line in log.read_text().splitlines()] \
        if log.exists() else []
    # a started write-back (sync_file_range) counts as a sync: numpy.save starts none
    return [os.path.relpath(args, folder) for what, args in events
            if what in ("fsync", "sync_file_range")]


needs_a_job = [pytest.mark.skipif(N != 1, reason="starts its own mpiexec job; np=1 only"),
               pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")]


@needs_a_job[0]
@needs_a_job[1]
def test_durable_saves_sync_what_they_write(tmp_path):
    synced = spied_syncs(tmp_path, True)
    chunks = [s for s in synced if ".tmp/c/" in s and s.startswith("x.zarr.")]
    assert len(chunks) >= 2, synced  # both ranks' chunks, in both saves
    assert any(s.startswith("x.zarr.") and s.endswith("zarr.json") for s in synced), synced
    assert "." in synced, synced  # the folder, after the store's rename
    assert "f.h5" in synced, synced
    assert any(s.startswith("sd/index.json.") for s in synced), synced


@needs_a_job[0]
@needs_a_job[1]
def test_saves_that_are_not_durable_sync_nothing_that_python_writes(tmp_path):
    synced = spied_syncs(tmp_path, False)
    # the core's: the .npy file and the entry (and their folders)
    ours = [s for s in synced if not s.startswith(("n/", "sd/w")) and s not in ("n", "sd")]
    assert ours == [], synced


@needs_a_job[0]
@needs_a_job[1]
def test_a_npy_save_that_is_not_durable_syncs_nothing(tmp_path):
    assert spied_syncs(tmp_path, False) == []
