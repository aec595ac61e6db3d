"""NumPy code on sharded arrays: each operation runs on the local shards, and its
output placements follow from the inputs' (as torch ops do on DTensors).

    mpiexec -n 4 python examples/numpy_ops.py
    python examples/numpy_ops.py

Every result is checked against plain NumPy on the whole arrays with
mpitensor.testing.assert_close, which compares shard by shard (no gathering) and
fails on every rank together.
"""

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from mpitensor.nn.functional import softmax
from mpitensor.testing import assert_close

rank, nranks = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
mesh = mt.init_device_mesh("cpu", (nranks,))
rng = np.random.default_rng(0)  # the same global arrays on every rank
X, W1, W2 = rng.standard_normal((16, 8)), rng.standard_normal((8, 12)), rng.standard_normal((12, 4))


def show(what, dt, expected):
    """Checks `dt` against NumPy's `expected` and prints its placements (collective)."""
    assert_close(dt, expected)
    if rank == 0:
        print(f"  {what:<48} -> {str(list(dt.placements)):<18} shape {dt.shape}")


if rank == 0:
    print(f"on {nranks} rank(s); every line is checked against NumPy")

# Data parallel: rows of x are sharded, the weights are replicated. Everything
# row-wise stays local and stays Shard(0); a reduction over rows ends Partial.
x = mt.distribute_tensor(X, mesh, [Shard(0)])
w1 = mt.distribute_tensor(W1, mesh, [Replicate()])
if rank == 0:
    print("\nrows sharded, weights replicated:")
h = x @ w1
show("h = x @ w1", h, X @ W1)
a = np.maximum(h, 0.0)
show("a = np.maximum(h, 0)", a, np.maximum(X @ W1, 0))
p = softmax(a, axis=1)
ref = np.exp(np.maximum(X @ W1, 0))
ref /= ref.sum(axis=1, keepdims=True)
show("p = softmax(a, axis=1)", p, ref)
show("np.sum(p, axis=0)  (a sum over sharded rows)", np.sum(p, axis=0), ref.sum(axis=0))
show("p.argmax(axis=1)", p.argmax(axis=1), ref.argmax(axis=1))
show("np.where(a > 1, a, 0)", np.where(a > 1, a, 0.0), np.where(np.maximum(X @ W1, 0) > 1, np.maximum(X @ W1, 0), 0))

# Tensor parallel by hand (what mpitensor.parallel will automate): columns of w1 and
# rows of w2 are sharded, so x @ w1 is sharded by columns and the second matmul
# contracts the sharded dim: each rank holds a partial sum until it is reduced.
xr = mt.distribute_tensor(X, mesh, [Replicate()])
w1c = mt.distribute_tensor(W1, mesh, [Shard(1)])
w2r = mt.distribute_tensor(W2, mesh, [Shard(0)])
if rank == 0:
    print("\nMegatron-style: w1 sharded by columns, w2 by rows:")
with CommDebugMode() as mode:
    hc = np.maximum(xr @ w1c, 0.0)
    y = hc @ w2r
show("hc = np.maximum(x @ w1c, 0)", hc, np.maximum(X @ W1, 0))
show("y = hc @ w2r", y, np.maximum(X @ W1, 0) @ W2)
if rank == 0:
    print(f"  communication so far: {dict(mode.get_comm_counts()) or 'none'}"
          " (the Partial is reduced only when it is needed)")
yr = y.redistribute(mesh, [Replicate()])
show("y.redistribute([Replicate()])  (one all-reduce)", yr, np.maximum(X @ W1, 0) @ W2)

if rank == 0:
    print("\nmore operations:")
show("np.einsum('ij,jk->ik', x, w1)", np.einsum("ij,jk->ik", x, w1), X @ W1)
show("x.T", x.T, X.T)
show("np.concatenate([x, x], axis=1)", np.concatenate([x, x], axis=1), np.concatenate([X, X], axis=1))
show("np.clip(x, -1, 1).mean(axis=0)", np.clip(x, -1, 1).mean(axis=0), np.clip(X, -1, 1).mean(axis=0))
show("(x * 2 + 1).astype(np.float32)", (x * 2 + 1).astype(np.float32), (X * 2 + 1).astype(np.float32))

# An operation mpitensor does not implement is a TypeError, never a silent gather.
try:
    np.sort(x, axis=0)
except TypeError as e:
    if rank == 0:
        print(f"\nnp.sort(x) is not implemented for DTensors: TypeError: {str(e)[:90]}...")
