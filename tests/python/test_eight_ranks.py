"""A 2 x 2 x 2 mesh, which the suite's 1 to 4 ranks cannot make.

Some rules only meet on three mesh dims of more than one rank: a redistribution
whose only plan within torch's bytes is torch's own steps (it cuts before it
reduce-scatters), and a scan along an axis cut by two mesh dims while the third
cuts another dim unevenly (the lanes' totals differ in shape from group to group).
One test starts its own 8-rank job (oversubscribed) and checks each against
NumPy, with a sample of random redistributions with Partials, and of operations
and a matmul's gradients on random placements. So too the backward of max and
min of a Partial cut by two mesh dims, whose forward and comparison sum the parts
by different plans, in different orders; gradients of a few compositions on
random placements with Partials against central differences; checkpoints
saved from Partials and loaded into other placements, in each format; and moves
between random strided layouts, whose common plain forms span three mesh dims.

The job is launched from the np=1 run only: a job started from inside a
multi-rank job would share its ranks' cores and Open MPI environment.
"""

import sys

import pytest

from mpi_helpers import run_job

pytestmark = pytest.mark.np(1)

JOB = """
import os
import random
import sys
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

# max and min of a Partial over mesh dims 0 and 2: their backward compares the
# elements with the result, so it must not sum the parts in another order than the
# forward did (all-reduces there, reduce-scatters for the comparison), or no
# element equals the result and the gradient is inf and NaN.
parts = np.random.default_rng(5).standard_normal((2, 2, 7, 5))
Y = parts.sum(axis=(0, 1))
local = mt.distribute_tensor(parts[coord[0], coord[2]], mesh, [Replicate(), Shard(0), Replicate()],
                             src_data_rank=None).to_local()
for pick in (np.max, np.min):
    y = mt.DTensor.from_local(local, mesh, [Partial(), Shard(0), Partial()], shape=Y.shape,
                              stride=(5, 1)).requires_grad_(True)
    with np.errstate(divide="ignore", invalid="ignore"):
        pick(y, axis=1).sum().backward()
    check(f"{pick.__name__}'s gradient of a Partial", y.grad, Y == pick(Y, axis=1, keepdims=True))


def numeric_grad(f, arrays, i, eps=1e-6):
    g = np.zeros_like(arrays[i])
    for idx in np.ndindex(g.shape):
        vals = []
        for step in (eps, -eps):
            moved = [a.copy() for a in arrays]
            moved[i][idx] += step
            vals.append(float(np.sum(f(*moved))))
        g[idx] = (vals[0] - vals[1]) / (2 * eps)
    return g


def softmax(a, ax):
    e = np.exp(a - np.max(a, axis=ax, keepdims=True))
    return e / np.sum(e, axis=ax, keepdims=True)


# Backward through compositions on random placements with Partials, uneven
# shapes, against central differences of the same program on the full arrays.
programs = {
    "softmax": lambda a, b, ax: softmax(a * b, ax) * b,
    "mean and max": lambda a, b, ax: np.mean(a, axis=ax) * np.max(b, axis=ax),
    "slices": lambda a, b, ax: a[1:, :, ::2] * np.exp(b[:-1, :, ::2]),
    "transpose and reshape": lambda a, b, ax: np.transpose(a, (2, 0, 1)).reshape(a.shape[2], -1)
    @ b.reshape(-1, a.shape[2]),
    "whole sum": lambda a, b, ax: np.sum(a * a) * b,
}
for name, f in programs.items():
    shape = tuple(rng.choice([2, 3, 5]) for _ in range(3))
    ax = rng.randrange(3)
    arrays = [np.random.default_rng(j).standard_normal(shape) for j in range(2)]
    pls = [[rng.choice([Replicate(), Partial(), Shard(rng.randrange(3))]) for _ in range(3)]
           for _ in arrays]
    leaves = [partial_of(x, p).requires_grad_(True) for x, p in zip(arrays, pls)]
    f(*leaves, ax).sum().backward()
    for i, leaf in enumerate(leaves):
        check(f"{name}'s gradient {i} {shape} {pls} axis {ax}", leaf.grad,
              numeric_grad(lambda *xs: f(*xs, ax), arrays, i))

# Checkpoints of Partials saved from random placements and loaded into others, in
# each format, uneven shapes included.
folder = MPI.COMM_WORLD.bcast(sys.argv[1] if MPI.COMM_WORLD.rank == 0 else None)
for t, suffix in enumerate(["npy", "h5", "zarr"] * 2):
    shape = tuple(rng.choice([1, 3, 5, 8]) for _ in range(3))
    X = np.random.default_rng(t).standard_normal(shape)
    src = [rng.choice([Replicate(), Partial(), Shard(rng.randrange(3))]) for _ in range(3)]
    dst = [rng.choice([Replicate(), Shard(rng.randrange(3))]) for _ in range(3)]
    path = os.path.join(folder, f"x{t}.{suffix}")
    kw = {"dataset": "x"} if suffix == "h5" else {}
    mt.save(partial_of(X, src), path, durable=False, **kw)
    got = mt.load(path, mesh, dst, **kw)
    check(f"{suffix} saved from {src} loaded into {dst} {shape}", got, X)
    if got.to_local().shape != mt.distribute_tensor(X, mesh, dst).to_local().shape:
        problems.append(f"{suffix} loaded into {dst} {shape}: local shape {got.to_local().shape}")

# Moves from, to and between strided layouts (torch's _StridedShard) on three
# mesh dims: each rank's local array is torch's, cut by its definition here.
from mpitensor.placement_types import _StridedShard


def torch_local(X, placements, at=coord):
    a = X
    for m, p in enumerate(placements):
        if isinstance(p, _StridedShard):
            a = np.concatenate([np.array_split(q, 2, axis=p.dim)[at[m]]
                                for q in np.split(a, p.split_factor, axis=p.dim)], p.dim)
        elif isinstance(p, Shard):
            a = np.array_split(a, 2, axis=p.dim)[at[m]]
    return a


def torch_defined(X, placements):
    # On every rank alike: each split divides the dim where it applies.
    try:
        for at in np.ndindex(2, 2, 2):
            torch_local(X, placements, at)
    except ValueError:
        return False
    return True


def strided_layout(shape):
    return [rng.choice([Replicate(), Shard(d), _StridedShard(d, split_factor=2),
                        _StridedShard(d, split_factor=4)])
            for d in (rng.randrange(len(shape)) for _ in range(3))]


moved = 0
for _ in range(60):
    shape = rng.choice([(8, 8), (16, 4), (4, 8, 2)])
    a, b = strided_layout(shape), strided_layout(shape)
    X = np.arange(float(np.prod(shape))).reshape(shape)
    if not (torch_defined(X, a) and torch_defined(X, b)):
        continue
    try:
        x = mt.DTensor.from_local(torch_local(X, a), mesh, a, shape=shape,
                                  stride=strides(shape))
        y = x.redistribute(mesh, b)
    except ValueError:  # no plain form (a cut after an uneven one), everywhere alike
        continue
    moved += 1
    if not np.array_equal(y.to_local(), torch_local(X, b)):
        problems.append(f"strided move {a} -> {b} of {shape}")
if moved < 30:
    problems.append(f"only {moved} strided moves ran")

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
    (tmp_path / "files").mkdir()
    cmd = ["mpiexec", "--oversubscribe", "-n", "8", sys.executable, str(script),
           str(tmp_path / "files")]
    run = run_job(cmd, timeout=100)
    assert run.returncode == 0, run.stdout + run.stderr


# Linear algebra's results on random placements of a 2 x 2 x 2 mesh: each
# result's local bytes are the same on every rank whose coordinates differ only on
# mesh dims where the result is Replicate, whichever engine ran (ScaLAPACK's grid
# on two mesh dims with a replica group on the third, TSQR, one rank's LAPACK, the
# replicated matrix's NumPy), and the values are NumPy's.
LINALG_JOB = """
import random
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Replicate, Shard

comm = MPI.COMM_WORLD
mesh = mt.init_device_mesh("cpu", (2, 2, 2))
coord = tuple(mesh.get_coordinate())
problems = []


def same_bytes(what, x):
    key = tuple(c for c, p in zip(coord, x.placements) if not isinstance(p, Replicate))
    seen = {}
    for k, data in comm.allgather((key, x.to_local().tobytes())):
        seen.setdefault(k, set()).add(data)
    if any(len(v) > 1 for v in seen.values()):
        problems.append(f"{what}: replicas hold different bytes")


def close(what, got, want, tol=1e-8):
    got = np.asarray(got.full_tensor() if hasattr(got, "full_tensor") else got)
    if got.shape != np.shape(want) or not np.allclose(got, want, rtol=tol,
                                                      atol=tol * np.abs(want).max(initial=1)):
        problems.append(f"{what}: differs from NumPy")


def results(out):
    return [x for x in (out if isinstance(out, tuple) else (out,)) if hasattr(x, "placements")]


rng = random.Random(1)
cases = [((76, 19), [Shard(1), Replicate(), Replicate()])]
for _ in range(14):
    shape = rng.choice([(76, 19), (19, 40), (12, 12), (9, 9), (24, 6), (16, 16), (3, 3)])
    cases.append((shape, [rng.choice([Replicate(), Shard(0), Shard(1)]) for _ in range(3)]))
for t, (shape, pls) in enumerate(cases):
    A = np.random.default_rng(t).standard_normal(shape)
    a = mt.distribute_tensor(A, mesh, pls)
    where = f"{shape} {pls}"
    calls = {"svdvals": (lambda x: np.linalg.svd(x, compute_uv=False),),
             "svd": (lambda x: np.linalg.svd(x, full_matrices=False),),
             "qr": (np.linalg.qr,)}
    b = np.arange(1.0, shape[0] + 1)
    calls["lstsq"] = (lambda x: np.linalg.lstsq(x, b if isinstance(x, np.ndarray) else
                                                mt.distribute_tensor(b, mesh, [Replicate()] * 3)),)
    if shape[0] == shape[1]:
        n = shape[0]
        S = A @ A.T + n * np.eye(n)
        s = mt.distribute_tensor(S, mesh, pls)
        calls.update({"inv": (np.linalg.inv,), "det": (np.linalg.det,),
                      "slogdet": (np.linalg.slogdet,), "eigvalsh": (np.linalg.eigvalsh, S, s),
                      "eigh": (np.linalg.eigh, S, s), "cholesky": (np.linalg.cholesky, S, s),
                      "solve": (lambda x: np.linalg.solve(x, b if isinstance(x, np.ndarray) else
                                mt.distribute_tensor(b, mesh, [Replicate()] * 3)),)})
    for name, (f, *args) in calls.items():
        X, x = args if args else (A, a)
        got = f(x)
        for i, r in enumerate(results(got)):
            same_bytes(f"{name} result {i} of {where}", r)
        want = f(X)
        if name in ("svdvals", "eigvalsh", "inv", "det", "cholesky", "solve"):
            close(f"{name} {where}", got, want)
        elif name in ("slogdet",):
            close(f"{name} {where}", got[1], want[1])
        elif name in ("svd", "eigh"):
            close(f"{name} values {where}", got[1 if name == "svd" else 0],
                  want[1 if name == "svd" else 0])
        elif name == "lstsq":
            close(f"{name} {where}", got[0], want[0])
            if type(got[2]) is not type(want[2]) or got[2] != want[2]:
                problems.append(f"lstsq rank {got[2]!r} of {where}")

every = comm.allgather(problems)
if comm.rank == 0:
    for rank, found in enumerate(every):
        for what in found:
            print(f"rank {rank}: {what}")
    raise SystemExit(1 if any(every) else 0)
"""


def test_linear_algebra_replicas_hold_the_same_bytes(tmp_path):
    script = tmp_path / "linalg.py"
    script.write_text(LINALG_JOB)
    cmd = ["mpiexec", "--oversubscribe", "-n", "8", sys.executable, str(script)]
    run = run_job(cmd, timeout=100)
    assert run.returncode == 0, run.stdout + run.stderr
