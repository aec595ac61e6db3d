"""Reduce-scatter (Partial(sum) -> Shard(0)) of int8 with element counts around
2**31, where MPI's int counts end: the total of the counts just below and just
above INT_MAX (each block far below it), and one block above it.

Marked `large` and skipped unless MT_LARGE=1 (MT_LARGE=2 adds the per-block case):
at np 2 the total cases take about 4 GiB per rank, the per-block case about 9 GiB.
Run them alone, e.g. `MT_LARGE=1 tests/run_mpi_pytest.sh 2 tests/python/test_large_counts.py`.
The rounds decision itself is tested in `make test` by tests/core/test_counts.c."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import DTensor, Partial, Shard, init_device_mesh

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
LARGE = int(os.environ.get("MT_LARGE", "0") or 0)
CHUNK = 1 << 24
INT_MAX = 2**31 - 1

pytestmark = [pytest.mark.large,
              pytest.mark.skipif(LARGE < 1, reason="moves gigabytes: set MT_LARGE=1")]


def pattern(start: int, stop: int) -> np.ndarray:
    """Rank-independent int8 values of global elements [start, stop)."""
    return (np.arange(start, stop, dtype=np.int64) % 251 - 125).astype(np.int8)


def reduce_scatter(n: int) -> list[str]:
    """Every rank holds the whole `n`-element pattern as a Partial(sum); each must
    get W times its chunk (wrapping as int8 does). Returns what went wrong."""
    mesh = init_device_mesh("cpu", (W,))
    local = np.empty(n, np.int8)
    for at in range(0, n, CHUNK):
        local[at:min(at + CHUNK, n)] = pattern(at, min(at + CHUNK, n))
    dt = DTensor.from_local(local, mesh, [Partial("sum")], shape=(n,), stride=(1,))
    del local
    problems = []
    try:
        out = dt.redistribute(mesh, [Shard(0)]).to_local()
    except Exception as e:  # noqa: BLE001 - reported after the last collective
        out, problems = None, [f"{n}: {type(e).__name__}: {e}"]
    del dt
    gc.collect()
    if out is not None:
        size = -(-n // W)
        start = min(COMM.Get_rank() * size, n)
        if out.shape != (min(size, n - start),):
            problems.append(f"{n}: shape {out.shape}")
        for at in range(0, out.size, CHUNK):
            stop = min(at + CHUNK, out.size)
            want = (pattern(start + at, start + stop).astype(np.int64) * W).astype(np.int8)
            if not np.array_equal(out[at:stop], want):
                problems.append(f"{n}: wrong values in [{start + at}, {start + stop})")
                break
    del out
    gc.collect()
    return problems


@pytest.mark.skipif(W < 2, reason="a reduce-scatter needs two ranks")
@pytest.mark.parametrize("n", [INT_MAX, 2**31 + 16], ids=["total_at_int_max",
                                                          "total_above_int_max"])
def test_total_around_int_max(n):
    assert reduce_scatter(n) == []


@pytest.mark.skipif(W != 2 or LARGE < 2, reason="about 9 GiB per rank: MT_LARGE=2 at np 2")
def test_one_block_above_int_max():
    assert reduce_scatter(2 * (2**31 + 16)) == []
