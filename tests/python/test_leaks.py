"""Long jobs do not leak: 100,000 small redistributes and ops (20,000 rounds of two
redistributes and three ops) and 1,000 mesh creations leave resident memory, the live MPI communicators (counted in C) and the
reference counts of every input where they were.

A leak of a few dozen bytes per call adds up to megabytes over 100,000 calls, far
above the allocator's noise once the first rounds have warmed it up. These run at
np 2 only: the C paths are the same at every size, and at np 2 each call is cheap.
"""

import gc
import os
import sys

import numpy as np
import psutil
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor, init_device_mesh, _comm
from mpi_helpers import all_ranks

N = MPI.COMM_WORLD.Get_size()
pytestmark = [
    pytest.mark.skipif(N != 2, reason="long-job leak checks run at np 2"),
    # ASan keeps freed memory in quarantine, so resident memory grows by design.
    pytest.mark.skipif(bool(os.environ.get("MT_SANITIZED")),
                       reason="RSS is meaningless under AddressSanitizer"),
]

ROUNDS = 10
ROUND = 2_000           # iterations of one_call (5 library calls) per round
CALLS = ROUNDS * ROUND * 5
SLACK_BYTES = 2 << 20   # a leak of 21 bytes a call (2.1 MB in all) fails the test


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def refcounts(*objs):
    return [sys.getrefcount(o) for o in objs]


@pytest.mark.timeout(900)
def test_redistributes_and_ops_keep_memory_and_refcounts_flat():
    mesh = init_device_mesh("cpu", (N, 1))
    shard, rep = [Shard(0), Replicate()], [Replicate(), Replicate()]
    dt = distribute_tensor(np.arange(16.0).reshape(8, 2), mesh, shard)
    local = dt.to_local()
    watched = (dt, local, mesh, shard, rep)

    def one_call():  # 2 redistributes and 3 ops
        r = dt.redistribute(mesh, rep)   # an all-gather
        s = r.redistribute(mesh, shard)  # a local cut
        y = np.multiply(dt, 2.0) + s
        return np.sum(y).full_tensor()   # a Partial(sum), reduced by all-reduce

    before = refcounts(*watched)
    one_call()
    after_one = refcounts(*watched)
    for _ in range(ROUND):  # warm-up: caches, pools, interned objects
        one_call()
    base_rss, base_comms = rss(), _comm.comm_live_count()
    samples = []
    for _ in range(ROUNDS):
        for _ in range(ROUND):
            value = one_call()
        samples.append(rss())
    growth = samples[-1] - base_rss
    ok = (before == after_one == refcounts(*watched)
          and _comm.comm_live_count() == base_comms
          and growth < SLACK_BYTES
          and CALLS == 100_000 and float(value) == 3 * float(np.arange(16.0).sum()))
    assert all_ranks(ok), (before, after_one, refcounts(*watched), base_comms,
                           _comm.comm_live_count(), growth, samples)


@pytest.mark.timeout(900)
def test_mesh_creations_free_their_communicators():
    comm = MPI.COMM_WORLD
    gc.collect()
    base_comms = _comm.comm_live_count()
    refs = refcounts(comm)

    def one_mesh(i):
        mesh = init_device_mesh("cpu", (N, 1), mesh_dim_names=("dp", "tp"))
        sub = mesh["tp"] if i % 2 else mesh["dp"]
        assert sub.size() in (1, N)
        flat = mt.DeviceMesh("cpu", list(range(N)))
        return flat.size()

    for i in range(100):  # warm-up
        one_mesh(i)
    gc.collect()
    base_rss = rss()
    for i in range(1000):
        one_mesh(i)
    gc.collect()
    growth = rss() - base_rss
    ok = (_comm.comm_live_count() == base_comms and refcounts(comm) == refs
          and growth < SLACK_BYTES)
    assert all_ranks(ok), (base_comms, _comm.comm_live_count(), refs, refcounts(comm), growth)
