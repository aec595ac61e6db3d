"""A 2 x 2 x 2 mesh, which the suite's 1 to 4 ranks cannot make.

Some rules only meet on three mesh dims of more than one rank: a redistribution
whose only plan within torch's bytes is torch's own steps (it cuts before it
reduce-scatters), and a scan along an axis cut by two mesh dims while the third
cuts another dim unevenly (the lanes' totals differ in shape from group to group).
One test starts its own 8-rank job (oversubscribed) and checks each against
NumPy, with a sample of random redistributions with Partials, and of operations
and a matmul's gradients on random placements.

The job is launched from the np=1 run only: a job started from inside a
multi-rank job would share its ranks' cores and Open MPI environment.
"""

import subprocess
import sys

import pytest
from mpi4py import MPI

from mpi_helpers import fresh_job_env

pytestmark = pytest.mark.skipif(MPI.COMM_WORLD.Get_size() != 1,
                                reason="starts its own mpiexec job; np=1 only")

JOB = """
import random
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode

mesh = mt.init_device_mesh("cpu", (2, 2, 2))
coord = mesh.get_coordinate()
problems = []


def strides(shape):
    return tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))


def partial_of(X, placements):
    # X held whole by the first rank of every Partial mesh dim, zeros elsewhere.
    plain = [Replicate() if p.is_partial() else p for p in placements]
    local = mt.distribute_tensor(X, mesh, plain).to_local()
    first = all(coord[m] == 0 for m, p in enumerate(placements) if p.is_partial())
    return mt.DTensor.from_local(local if first else np.zeros_like(local), mesh,
                                 placements, shape=X.shape, stride=strides(X.shape))


def check(what, got, want):
    if not np.allclose(np.asarray(got.full_tensor()), want):
        problems.append(what)


# Torch's steps, the only plan within their bytes: cut dim 2, reduce-scatter
# half the data, then swap dims.
X = np.arange(8 * 6 * 4 * 10, dtype=np.float64).reshape(8, 6, 4, 10)
x = partial_of(X, [Shard(3), Partial(), Replicate()])
with CommDebugMode() as comm:
    y = x.redistribute(mesh, [Shard(0), Shard(1), Shard(2)])
check("cut-first redistribution", y, X)
if comm.get_comm_counts() != {"reduce_scatter_tensor": 1, "all_to_all_single": 1}:
    problems.append(f"cut-first redistribution's collectives {comm.get_comm_counts()}")

# Scans along an axis cut by mesh dims 0 and 2, dim 2 (size 5) cut 3 + 2 by mesh
# dim 1.
A = np.random.default_rng(0).standard_normal((2, 8, 5))
a = mt.distribute_tensor(A, mesh, [Shard(0), Shard(2), Shard(0)])
for ax in range(3):
    check(f"cumsum axis {ax}", np.cumsum(a, axis=ax), np.cumsum(A, axis=ax))
    check(f"cumprod axis {ax}", np.cumprod(a, axis=ax), np.cumprod(A, axis=ax))

# Random redistributions, Partials in the source.
rng = random.Random(0)
shape = (4, 6, 2, 5)
X = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
for _ in range(40):
    src = [rng.choice([Replicate(), Partial(), Shard(rng.randrange(4))]) for _ in range(3)]
    dst = [rng.choice([Replicate(), Shard(rng.randrange(4))]) for _ in range(3)]
    check(f"{src} -> {dst}", partial_of(X, src).redistribute(mesh, dst), X)

# Operations and their gradients on random placements, uneven shards included.
for t in range(10):
    def placements(ndim):
        return [rng.choice([Replicate(), Shard(rng.randrange(ndim))]) for _ in range(3)]
    n, k, m = (rng.choice([2, 3, 5, 8]) for _ in range(3))
    A = np.random.default_rng(t).standard_normal((n, k, m))
    B = np.random.default_rng(t + 1).standard_normal((n, k, m))
    a = mt.distribute_tensor(A, mesh, placements(3))
    b = mt.distribute_tensor(B, mesh, placements(3))
    ax = rng.randrange(3)
    where = f"{a.placements} {b.placements} axis {ax}"
    check(f"add {where}", a + b, A + B)
    check(f"sum {where}", (a * b).sum(axis=ax), (A * B).sum(axis=ax))
    check(f"max {where}", np.max(a, axis=ax), np.max(A, axis=ax))
    M = np.random.default_rng(t).standard_normal((n, k))
    N = np.random.default_rng(t + 1).standard_normal((k, m))
    p = mt.distribute_tensor(M, mesh, placements(2))
    q = mt.distribute_tensor(N, mesh, placements(2))
    Y = M @ N
    check(f"matmul {p.placements} {q.placements}", p @ q, Y)
    p.requires_grad_(True)
    q.requires_grad_(True)
    y = p @ q
    (np.tanh(y) * y).sum().backward()
    G = np.tanh(Y) + Y * (1 - np.tanh(Y) ** 2)
    check(f"matmul's gradient of the left {p.placements} {q.placements}", p.grad, G @ N.T)
    check(f"matmul's gradient of the right {p.placements} {q.placements}", q.grad, M.T @ G)

every = MPI.COMM_WORLD.allgather(problems)
if MPI.COMM_WORLD.rank == 0:
    for rank, found in enumerate(every):
        for what in found:
            print(f"rank {rank}: {what}")
    raise SystemExit(1 if any(every) else 0)
"""


def test_a_2x2x2_mesh_agrees_with_numpy(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    cmd = ["mpiexec", "--oversubscribe", "-n", "8", sys.executable, str(script)]
    run = subprocess.run(cmd, env=fresh_job_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
