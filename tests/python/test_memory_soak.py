"""A long job over shapes that never repeat keeps its memory flat.

50,000 operations (redistributes between every pair of placements, elementwise
operations, reductions, indexing, on 1-D and, at 4 ranks, 2-D meshes) over distinct
shapes, and among them redistributes whose outputs grow past glibc's mmap threshold,
as a growing sequence length makes. Every cache stays within its bound
(docs/reliability.md#memory), and resident memory minus the block pool's cached
bytes (bounded on its own: eight blocks, 512 MiB) stops growing once the caches are
full: the second half of the run adds less than SLACK. Before, the pool's blocks
came from malloc and left glibc's heap holding freed memory it could not reuse:
the second half added tens of MiB, and 30,000 growing shapes hundreds.
"""

import gc
import os
import time

import numpy as np
import psutil
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, _comm
from mpitensor._ops._indexing import _INDEX_KEYS

W = MPI.COMM_WORLD.Get_size()
pytestmark = [
    # The caches are per rank and the same at every size: 2 ranks, and 4 for the
    # 2-D mesh; 1 is test_cache_bounds.py's.
    pytest.mark.skipif(W not in (2, 4), reason="runs at 2 and 4 ranks"),
    pytest.mark.skipif(bool(os.environ.get("MT_SANITIZED")),
                       reason="RSS is meaningless under AddressSanitizer"),
]

OPERATIONS = 50_000
PER_ROUND = 5         # operations of one round (see one_round)
SLACK = 6 << 20       # what the second half may add (allocator noise)
CACHES = 40 << 20     # what every cache of a mesh may hold, full (see the docs)


def resident() -> int:
    """Resident bytes, less what the block pool keeps for reuse."""
    gc.collect()
    return psutil.Process().memory_info().rss - _comm.pool_cached_bytes()


PLACEMENTS = ([Shard(0)], [Shard(1)], [Replicate()])


def one_round(mesh, mesh2, i: int) -> None:
    """Five operations on shapes no earlier round used: most stay local (a
    redistribute that cuts a replicated tensor, elementwise, a reduction,
    indexing along a dim that is not sharded), every other round one is a
    collective: an all-gather whose output grows from 128 KiB on (by 128 bytes a
    rank each time), or an all-to-all."""
    a, b = 1 + i % 97, 2 + (i // 97) % 131
    pl = PLACEMENTS[i % 3]
    x = mt.DTensor.from_local(np.ones((a + W * (i % 3), b)), mesh, [Replicate()])
    y = x.redistribute(mesh, pl)                                # 1: a local cut, a plan
    (y * 2.0).sum(0)                                            # 2, 3: ops
    y[:, :1] if pl[0] == Shard(0) else y[:1]                    # 4: indexing
    if i % 4 == 0:
        rows = W * (2048 + 2 * (i // 4))
        big = mt.DTensor.from_local(np.ones((rows // W, 8)), mesh, [Shard(0)])
        big.redistribute(mesh, [Replicate()])                   # 5: an all-gather
    elif i % 4 == 2:
        y.redistribute(mesh, PLACEMENTS[(i // 3) % 3])          # 5: a collective
    elif mesh2 is not None:
        u = mt.DTensor.from_local(np.ones((a, b + 1)), mesh2, [Replicate(), Replicate()])
        np.negative(u.redistribute(mesh2, [pl[0], Shard(0)]))   # 5: a cut and an op
    else:
        np.negative(y)                                          # 5: an op


@pytest.mark.timeout(600)
def test_50000_operations_over_distinct_shapes_keep_memory_flat():
    mesh = mt.init_device_mesh("cpu", (W,))
    mesh2 = mt.init_device_mesh("cpu", (2, W // 2)) if W % 2 == 0 and W > 2 else None
    rounds = OPERATIONS // PER_ROUND
    start, began = resident(), time.monotonic()
    for i in range(rounds // 2):
        one_round(mesh, mesh2, i)
    middle = resident()
    for i in range(rounds // 2, rounds):
        one_round(mesh, mesh2, i)
    end = resident()
    seconds = time.monotonic() - began
    for m in (mesh, mesh2) if mesh2 is not None else (mesh,):
        stats = m._dispatch_stats()
        assert stats["decisions"] <= stats["decision_limit"], stats
        assert stats["plans"] <= stats["plan_limit"], stats
        assert stats["layouts"] <= stats["layout_limit"], stats
        assert len(m._index_keys) <= _INDEX_KEYS
    meshes = 1 if mesh2 is None else 2
    assert _comm.pool_cached_bytes() <= 512 << 20
    assert end - middle < SLACK, (
        f"the second half of the run grew resident memory by {(end - middle) >> 20} MiB "
        f"(the first by {(middle - start) >> 20} MiB; {seconds:.0f} s)")
    assert end - start < meshes * CACHES, (end - start) >> 20


@pytest.mark.skipif(W != 2, reason="the op-id table is per process: 2 ranks suffice")
@pytest.mark.timeout(300)
def test_reshapes_to_distinct_shapes_keep_memory_flat():
    mesh = mt.init_device_mesh("cpu", (W,))
    start = resident()
    for i in range(30_000):
        if i == 15_000:
            middle = resident()
        x = mt.DTensor.from_local(np.ones((2, 3 + i)), mesh, [Replicate()])
        x.reshape(6 + 2 * i)
    end = resident()
    assert end - middle < SLACK / 4, ((middle - start) >> 20, (end - middle) >> 20)
