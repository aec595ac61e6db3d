"""A 3 x 2 x 2 mesh of 12 ranks, which the suite's 1 to 4 ranks and the 8-rank
job cannot make: a mesh dim of three ranks beside two of two, so that a matrix
cut on one mesh dim is replicated over four groups of ranks, and a grid fitted
to the matrix leaves replica groups of uneven positions.

Every ``Replicate`` result must be the same bytes on every rank whose
coordinates differ only on mesh dims where it is ``Replicate``, whichever engine
computed it (ScaLAPACK on a grid of two mesh dims with a replica group on the
third, TSQR's tree, LAPACK on one rank, NumPy on the replicated matrix, a
reduction's all-reduce), and its values NumPy's. The job draws random
placements for linear algebra and reductions, with the case the issue found
first (the singular values of a 76 x 19 matrix cut by columns on the first mesh
dim, which four replica groups computed apart).

The job is launched from the np=1 run only (as test_eight_ranks.py's): a job
started from inside a multi-rank job would share its ranks' cores and Open MPI
environment. ``MT_REPLICA_MESHES`` (e.g. ``2x2x2,3x3x2,3x3x3``) runs the same job
on other 3-D meshes, one job each.
"""

import os
import sys

import pytest

from mpi_helpers import run_job

pytestmark = pytest.mark.np(1)

JOB = """
import random
import sys
import warnings

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard

comm = MPI.COMM_WORLD
shape3 = tuple(int(n) for n in sys.argv[1].split("x"))
mesh = mt.init_device_mesh("cpu", shape3)
coord = tuple(mesh.get_coordinate())
problems = []
warnings.simplefilter("ignore")


def same_bytes(what, x):
    # The ranks whose coordinates differ only where x is Replicate hold one block.
    key = tuple(c for c, p in zip(coord, x.placements) if not isinstance(p, Replicate))
    partial = any(p.is_partial() for p in x.placements)
    seen = {}
    for k, data in comm.allgather((key, None if partial else x.to_local().tobytes())):
        seen.setdefault(k, set()).add(data)
    if any(len(v) > 1 for v in seen.values()):
        problems.append(f"{what}: replicas hold different bytes")


def close(what, got, want, tol=1e-8):
    got = np.asarray(got.full_tensor() if hasattr(got, "full_tensor") else got)
    want = np.asarray(want)
    if got.shape != want.shape or not np.allclose(got, want, rtol=tol,
                                                  atol=tol * max(np.abs(want).max(initial=1), 1),
                                                  equal_nan=True):
        problems.append(f"{what}: differs from NumPy")


def results(out):
    return [x for x in (out if isinstance(out, tuple) else (out,)) if hasattr(x, "placements")]


def run(what, f, x, X, compare=True):
    try:
        got = f(x)
    except Exception as e:  # the same error everywhere, or NumPy's
        try:
            f(X)
        except Exception:
            return
        problems.append(f"{what}: {type(e).__name__}: {e}")
        return
    for i, r in enumerate(results(got)):
        same_bytes(f"{what} result {i}", r)
    if compare:
        want = f(X)
        for i, (g, w) in enumerate(zip(got if isinstance(got, tuple) else (got,),
                                       want if isinstance(want, tuple) else (want,))):
            close(f"{what} result {i}", g, w)


rng = random.Random(int(np.prod(shape3)))


def placements(ndim):
    return [rng.choice([Replicate()] + [Shard(d) for d in range(ndim)]) for _ in shape3]


cases = [((76, 19), [Shard(1), Replicate(), Replicate()])]
for _ in range(7):
    cases.append((rng.choice([(76, 19), (19, 40), (12, 12), (9, 9), (30, 6), (5, 5)]),
                  placements(2)))
for t, (shape, pls) in enumerate(cases):
    A = np.random.default_rng(t).standard_normal(shape)
    a = mt.distribute_tensor(A, mesh, pls)
    where = f"{shape} {pls}"
    b = np.arange(1.0, shape[0] + 1)
    rb = mt.distribute_tensor(b, mesh, [Replicate()] * 3)
    other = lambda x: b if isinstance(x, np.ndarray) else rb
    calls = {
        "svdvals": lambda x: np.linalg.svd(x, compute_uv=False),
        "svd": lambda x: np.linalg.svd(x, full_matrices=False)[1],
        "qr r": lambda x: np.abs(np.linalg.qr(x)[1]),
        "lstsq": lambda x: np.linalg.lstsq(x, other(x))[0],
        "norm fro": lambda x: np.linalg.norm(x),
        "norm 2": lambda x: np.linalg.norm(x, 2),
        "norm nuc": lambda x: np.linalg.norm(x, "nuc"),
        "norm 1": lambda x: np.linalg.norm(x, 1),
        "norm inf": lambda x: np.linalg.norm(x, np.inf),
        "norm of rows": lambda x: np.linalg.norm(x, axis=1),
        "matrix_rank": lambda x: np.linalg.matrix_rank(x),
        "pinv": lambda x: np.linalg.pinv(x),
        "gram": lambda x: x.T @ x,
        "sum": lambda x: np.sum(x, axis=0),
        "whole sum": lambda x: np.sum(x),
        "mean": lambda x: np.mean(x, axis=1),
        "std": lambda x: np.std(x, axis=0),
        "var": lambda x: np.var(x),
        "max": lambda x: np.max(x, axis=0),
        "prod": lambda x: np.prod(x[:4], axis=1),
        "median": lambda x: np.median(x, axis=0),
        "percentile": lambda x: np.percentile(x, 30.0),
        "argmax": lambda x: np.argmax(x, axis=1),
        "dot": lambda x: np.dot(x[:, 0], x[:, -1]),
    }
    if shape[0] == shape[1]:
        n = shape[0]
        S = A @ A.T + n * np.eye(n)
        s = mt.distribute_tensor(S, mesh, pls)
        for name, f in {"inv": np.linalg.inv, "det": np.linalg.det,
                        "slogdet": lambda x: np.linalg.slogdet(x)[1],
                        "eigvalsh": np.linalg.eigvalsh,
                        "eigh": lambda x: np.linalg.eigh(x)[0],
                        "cholesky": np.linalg.cholesky, "cond": np.linalg.cond,
                        "solve": lambda x: np.linalg.solve(x, other(x)),
                        "matrix_power": lambda x: np.linalg.matrix_power(x, 3)}.items():
            run(f"{name} {where}", f, s, S)
    for name, f in calls.items():
        run(f"{name} {where}", f, a, A)

every = comm.allgather(problems)
if comm.rank == 0:
    for rank, found in enumerate(every):
        for what in found:
            print(f"rank {rank}: {what}")
    raise SystemExit(1 if any(every) else 0)
"""

MESHES = os.environ.get("MT_REPLICA_MESHES", "3x2x2").split(",")


@pytest.mark.parametrize("mesh", MESHES)
def test_replicate_results_are_the_same_bytes_on_a_3d_mesh(tmp_path, mesh):
    script = tmp_path / "replicas.py"
    script.write_text(JOB)
    ranks = 1
    for n in mesh.split("x"):
        ranks *= int(n)
    cmd = ["mpiexec", "--oversubscribe", "-n", str(ranks), sys.executable, str(script), mesh]
    run = run_job(cmd, timeout=40 + 5 * ranks)
    assert run.returncode == 0, run.stdout + run.stderr
