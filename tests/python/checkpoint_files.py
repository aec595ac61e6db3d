"""Checkpoints written by a separate 4-rank job, for the tests that load them at
whatever size the suite runs (1..4): "saved by 4 ranks, loaded by M ranks".

Run as a script (``mpiexec -n 4 python checkpoint_files.py DIR``) it writes the
files of WRITTEN into DIR; the tests import the same global arrays to compare.
`run_writer` launches that job from inside a running MPI job.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np


def global_array(shape, dtype, salt: int = 0) -> np.ndarray:
    """A deterministic array with distinct values (as far as the dtype allows)."""
    n = int(np.prod(shape, dtype=np.int64))
    base = np.arange(n, dtype=np.int64) * 7 + salt
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        out = base % 3 == 0
    elif dtype.kind == "c":
        out = (base + 1j * (base % 11)).astype(dtype)
    elif dtype.kind == "f":
        out = (base / 4 - 3).astype(dtype)
    else:
        out = (base % min(np.iinfo(dtype).max, 2**62)).astype(dtype)
    return out.reshape(shape)


# name -> (global shape, dtype, mesh shape, placements as (kind, dim) pairs)
WRITTEN = {
    "grid_f32": ((7, 5), "float32", (2, 2), (("S", 0), ("S", 1))),
    "rows_i16": ((10, 3), "int16", (4,), (("S", 0),)),
    "repl_c128": ((3, 4), "complex128", (2, 2), (("R", 0), ("S", 0))),
    "cube_u8": ((3, 4, 5), "uint8", (4,), (("S", 2),)),
    "partial_f64": ((6, 2), "float64", (4,), (("P", 0),)),
}


def placements_of(pairs):
    from mpitensor import Partial, Replicate, Shard

    return [Shard(d) if k == "S" else Replicate() if k == "R" else Partial()
            for k, d in pairs]


def write_all(directory: str) -> None:
    """Collective on COMM_WORLD (4 ranks). Every file of WRITTEN, and a state_dict."""
    import mpitensor as mt
    from mpitensor import DTensor, Partial

    for name, (shape, dtype, mesh_shape, pairs) in WRITTEN.items():
        mesh = mt.init_device_mesh("cpu", mesh_shape)
        pl = placements_of(pairs)
        g = global_array(shape, dtype)
        if isinstance(pl[0], Partial):
            # Four partial values that sum to g.
            local = g / 4 if mesh.get_rank() else g - 3 * (g / 4)
            dt = DTensor.from_local(local, mesh, pl)
        else:
            dt = mt.distribute_tensor(g, mesh, pl)
        mt.save(dt, os.path.join(directory, name + ".npy"))
    mt.save(state_dict(mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))),
            os.path.join(directory, "state"))


def state_dict(mesh) -> dict:
    """A hand-built state_dict like an nn.Module's on a (dp, tp) mesh."""
    import mpitensor as mt
    from mpitensor import Replicate, Shard

    def dist(shape, dtype, pl, salt):
        return mt.distribute_tensor(global_array(shape, dtype, salt), mesh, pl)

    return {
        "embed.weight": dist((11, 6), "float32", [Replicate(), Shard(0)], 1),
        "layers.0.attn.wq.weight": dist((6, 6), "float32", [Shard(0), Shard(1)], 2),
        "layers.0.mlp.w1.bias": dist((9,), "float64", [Replicate(), Shard(0)], 3),
        "layers.0.norm.weight": dist((6,), "float16", [Replicate(), Replicate()], 4),
        "step": np.array(123, dtype=np.int64),
        "odd/name with space": np.arange(4, dtype=np.int32),
    }


def run_writer(comm, directory: str) -> str | None:
    """Collective on ``comm``: rank 0 runs the 4-rank writer job; the others wait
    without spinning. Returns None, or the job's output when it failed."""
    failure = None
    if comm.Get_rank() == 0:
        # Imported here: the writer job runs this file as a script, without pytest.
        from mpi_helpers import run_job
        cmd = ["mpiexec", "--oversubscribe", "-n", "4", sys.executable, "-m", "mpi4py",
               os.path.abspath(__file__), directory]
        try:
            out = run_job(cmd, 100)
        except AssertionError as e:  # the other ranks wait for this rank's verdict
            failure = str(e)[-6000:]
        else:
            if out.returncode != 0:
                failure = (f"exit {out.returncode}\n{out.stdout[-2000:]}\n"
                           f"{out.stderr[-4000:]}")
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.02)
    return comm.bcast(failure, root=0)


if __name__ == "__main__":
    write_all(sys.argv[1])
