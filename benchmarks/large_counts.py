"""Element counts above 2**31: redistributions whose MPI counts overflow an int.

Run at np 2 (needs about 6 GiB of memory per rank):

    mpiexec -n 2 .venv/bin/python benchmarks/large_counts.py

Each rank's shard holds 2**31 + 2**20 int8 elements, more than MPI's int counts
can name, so the executor must switch to derived units (all-gather, scatter) or
rounds (all-reduce). Values are checked chunk by chunk against their formula, so
no second full-size array is needed. Not part of `make test`: it moves gigabytes.
"""

import time

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard

from _common import machine, machine_line  # benchmarks/ is sys.path[0]

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
SHARD = 2**31 + 2**20
N = SHARD * size
CHUNK = 1 << 28


def pattern(start: int, stop: int) -> np.ndarray:
    return (np.arange(start, stop, dtype=np.int64) % 251).astype(np.int8)


def check(array: np.ndarray, offset: int, what: str) -> None:
    ok = True
    for at in range(0, array.size, CHUNK):
        stop = min(at + CHUNK, array.size)
        ok &= np.array_equal(array[at:stop], pattern(offset + at, offset + stop))
    ok = comm.allreduce(ok, op=MPI.LAND)
    if rank == 0:
        print(f"{what}: {'ok' if ok else 'WRONG'}", flush=True)
    assert ok, what


def timed(what, fn):
    comm.Barrier()
    t = time.perf_counter()
    out = fn()
    comm.Barrier()
    if rank == 0:
        print(f"{what}: {time.perf_counter() - t:.2f} s", flush=True)
    return out


if rank == 0:
    print(machine_line(machine(comm)), flush=True)
mesh = mt.init_device_mesh("cpu", (size,))
full = np.empty(N, np.int8)
for at in range(0, N, CHUNK):
    full[at:min(at + CHUNK, N)] = pattern(at, min(at + CHUNK, N))
dt = timed(f"distribute_tensor of {N} int8 ([Shard(0)], scatter of {SHARD} per rank)",
           lambda: mt.distribute_tensor(full, mesh, [Shard(0)]))
del full
check(dt.to_local(), rank * SHARD, "scattered shard")
out = timed("Shard(0) -> Replicate (all-gather)", lambda: dt.redistribute(mesh, [Replicate()]))
check(out.to_local(), 0, "gathered tensor")
del out
local = dt.to_local()
part = mt.DTensor.from_local(np.where(rank == 0, local, np.int8(0)).astype(np.int8), mesh,
                             [Partial("sum")], shape=(SHARD,), stride=(1,))
del dt, local
red = timed("Partial(sum) -> Replicate (all-reduce in rounds)",
            lambda: part.redistribute(mesh, [Replicate()]))
check(red.to_local(), 0, "reduced tensor")
del red, part
# Partial(sum) -> Shard(0): every rank holds the whole global tensor as a partial sum
# (rank 0 the values, the others zeros); each member's block exceeds an int.
whole = np.zeros(N, np.int8)
if rank == 0:
    for at in range(0, N, CHUNK):
        whole[at:min(at + CHUNK, N)] = pattern(at, min(at + CHUNK, N))
part = mt.DTensor.from_local(whole, mesh, [Partial("sum")])
del whole
scat = timed("Partial(sum) -> Shard(0) (reduce-scatter in rounds)",
             lambda: part.redistribute(mesh, [Shard(0)]))
check(scat.to_local(), rank * SHARD, "reduce-scattered shard")
