"""A mesh whose communicator is gone raises instead of crashing.

`mesh.get_group().Free()` hands MPI back a communicator the mesh owns, and after
`MPI.Finalize()` no communicator works: a collective on either was a SIGSEGV
inside MPI. The mesh now checks before each collective (two loads) and every
call that would communicate raises a RuntimeError saying why; meshes that were
not touched go on working.
"""

import sys
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor
from mpi_helpers import outcome, run_job, same_everywhere

COMM = MPI.COMM_WORLD
W = COMM.Get_size()


def communicating_calls(mesh, x):
    """Calls that communicate on `mesh` (x: a DTensor sharded on its first dim)."""
    rep = [Replicate()] * mesh.ndim
    return {
        "full_tensor": lambda: x.full_tensor(),
        "redistribute": lambda: x.redistribute(mesh, rep),
        "async": lambda: x.redistribute(mesh, rep, async_op=True).wait(),
        "distribute_tensor": lambda: distribute_tensor(np.ones((4, 4)), mesh, rep),
        "from_local_check": lambda: mt.DTensor.from_local(np.ones(3), mesh, rep,
                                                          run_check=True),
        "agree": lambda: mt._comm.agree(mesh, True, 0, "x"),
    }


@pytest.mark.parametrize("shape", [(W,), (1, W)], ids=["1d", "2d"])
def test_a_freed_group_raises_on_every_call_that_communicates(shape):
    mesh = mt.init_device_mesh("cpu", shape, mesh_dim_names=("a", "b")[:len(shape)])
    other = mt.init_device_mesh("cpu", (W,))
    x = distribute_tensor(np.arange(8.0 * W).reshape(4 * W, 2), mesh,
                          [Shard(0)] + [Replicate()] * (len(shape) - 1))
    sub = mesh[mesh.mesh_dim_names[-1]]
    mesh.get_group(len(shape) - 1).Free()
    for name, call in list(communicating_calls(mesh, x).items()) + [
            ("slice", lambda: distribute_tensor(np.ones(4), sub, [Replicate()]))]:
        got = same_everywhere(outcome(call))
        assert got is not None and got[0] == "RuntimeError", (name, got)
        assert "was freed outside mpitensor (mesh.get_group().Free()?)" in got[1], got
    # Local work goes on, and a mesh that was not touched still communicates.
    assert x.to_local().shape == ((4 if len(shape) == 1 else 4 * W), 2)
    y = distribute_tensor(np.arange(4.0 * W), other, [Shard(0)])
    assert np.array_equal(y.full_tensor(), np.arange(4.0 * W))


FINALIZED = """
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Replicate, Shard

mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
x = mt.distribute_tensor(np.ones((8, 2)), mesh, [Shard(0)])
MPI.Finalize()
for call in (x.full_tensor, lambda: x.redistribute(mesh, [Replicate()]),
             lambda: mt._comm.agree(mesh, True, 0, "x")):
    try:
        call()
        print("returned", flush=True)
    except RuntimeError as e:
        print("raised:", e, flush=True)
"""


@pytest.mark.np(1)
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.timeout(120)
def test_a_mesh_used_after_mpi_finalize_raises(tmp_path, ranks):
    script = tmp_path / "finalized.py"
    script.write_text(FINALIZED)
    started = time.monotonic()
    proc = run_job(["mpiexec", "--oversubscribe", "-n", str(ranks), sys.executable,
                    str(script)], timeout=90)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode} after " \
        f"{time.monotonic() - started:.0f}s:\n{out[-3000:]}"
    # (the ranks' lines may interleave: count what each message ends with)
    assert out.count("can no longer communicate") == 3 * ranks, out[-3000:]
    assert "returned" not in out and "MPI has been finalized" in out, out[-3000:]
