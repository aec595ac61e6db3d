"""Every kind of redistribution, with the MPI collective it runs and its bytes.

    mpiexec -n 4 python examples/redistribute_tour.py
    python examples/redistribute_tour.py          # one rank: nothing to exchange

Each row of the table is one `dt.redistribute(mesh, dst)`; CommDebugMode counts the
MPI calls the C executor really made and the bytes each rank sent to other ranks
(summed over ranks here). Shard -> Replicate is an all-gather, Shard -> Shard an
all-to-all, Replicate -> Shard a local slice, Partial -> Replicate an all-reduce,
Partial -> Shard a reduce-scatter; a change on a 2-D mesh that torch would run as a
gather and a cut is one all-to-all in which each element moves once.
"""

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode

comm = MPI.COMM_WORLD
rank, nranks = comm.Get_rank(), comm.Get_size()
ROWS, COLS = 12, 8  # float64: 768 bytes in all


def start(mesh, placements):
    """The same global array under `placements`; a Partial holds an equal share
    of the values on each rank of its mesh dim."""
    g = np.arange(ROWS * COLS, dtype=np.float64).reshape(ROWS, COLS)
    plain = [Replicate() if p.is_partial() else p for p in placements]
    dt = mt.distribute_tensor(g, mesh, plain)
    if plain == list(placements):
        return g, dt
    share = dt.to_local() / np.prod([mesh.size(d) for d, p in enumerate(placements)
                                     if p.is_partial()])
    return g, mt.DTensor.from_local(share, mesh, placements, shape=g.shape, stride=(COLS, 1))


def row(mesh, src, dst):
    """One transition: (calls, total bytes over all ranks), checked against NumPy."""
    g, dt = start(mesh, src)
    with CommDebugMode() as mode:
        out = dt.redistribute(mesh, dst)
    calls = dict(mode.get_comm_counts())
    sent = comm.allreduce(sum(mode.get_comm_bytes().values()))
    assert np.allclose(out.full_tensor(), g), (src, dst)
    return calls, sent


def fmt(placements):
    return "[" + ", ".join(str(p) for p in placements) + "]"


def table(title, mesh, cases):
    lines = [f"\n{title}", f"  {'from':<15} {'to':<15} {'MPI calls (per rank)':<36} bytes sent, all ranks"]
    for src, dst in cases:
        calls, sent = row(mesh, src, dst)
        what = ", ".join(f"{n} x{c}" for n, c in calls.items()) or "none (local)"
        lines.append(f"  {fmt(src):<15} {fmt(dst):<15} {what:<36} {sent}")
    if rank == 0:
        print("\n".join(lines))


S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
mesh = mt.init_device_mesh("cpu", (nranks,))
if rank == 0:
    print(f"A {ROWS}x{COLS} float64 array ({ROWS * COLS * 8} bytes) on {nranks} rank(s)")
table("1-D mesh of every rank", mesh, [
    ([S0], [R]),     # all-gather
    ([S0], [S1]),    # all-to-all
    ([R], [S0]),     # each rank keeps its slice: no communication
    ([P], [R]),      # all-reduce
    ([P], [S0]),     # reduce-scatter
    ([S0], [S0]),    # nothing to do
])
if nranks == 4:
    mesh2 = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    table("2-D (2, 2) mesh", mesh2, [
        ([S0, S1], [R, R]),     # all-gather on each mesh dim
        ([S0, S1], [S1, S0]),   # one all-to-all over the mesh, each element moves once
        ([S0, R], [R, S0]),     # rows move from the dp dim to the tp dim
        ([P, S1], [R, S1]),     # all-reduce over dp only
        ([R, R], [S0, S1]),     # local slices
    ])
