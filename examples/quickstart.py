"""mpitensor in one page: a mesh, placements, and who holds what.

Run it on 4 processes (`make demo` does this):

    mpiexec -n 4 python examples/quickstart.py

or as a single process, which is a mesh of one rank:

    python examples/quickstart.py
"""

import numpy as np
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard

comm = MPI.COMM_WORLD
rank, nranks = comm.Get_rank(), comm.Get_size()


def say(title, line):
    """Print one line per rank, in rank order, from rank 0 (collective)."""
    lines = comm.gather(line, root=0)
    if rank == 0:
        print(f"\n{title}")
        for r, text in enumerate(lines):
            print(f"  rank {r}: {text}")


# A 1-D mesh over every rank. Shard(0) cuts dim 0 like numpy.array_split with
# ceil-sized chunks (torch.chunk): 10 rows on 4 ranks are 3, 3, 3 and 1 rows.
mesh = mt.init_device_mesh("cpu", (nranks,), mesh_dim_names=("x",))
if rank == 0:
    print(f"mpitensor {mt.__version__} on {nranks} rank(s): {mesh}")

a = mt.zeros(10, 4, device_mesh=mesh, placements=[Shard(0)])
shape, offset = mt.compute_local_shape_and_global_offset(a.shape, mesh, a.placements)
rows = f"rows {offset[0]}..{offset[0] + shape[0] - 1}" if shape[0] else "no rows"
say(f"zeros(10, 4) with placements [Shard(0)] (global shape {a.shape}):",
    f"local shape {a.to_local().shape}, {rows}")

# from_local: every rank brings its own piece; the global shape follows.
local = np.full((2, 3), float(rank))
b = mt.DTensor.from_local(local, mesh, [Shard(0)])
say(f"from_local of a (2, 3) block per rank, [Shard(0)] -> global {b.shape}:",
    f"{b.to_local().tolist()}")

# Random numbers depend only on the seed and each element's global index, so the
# same seed gives the same global tensor on any mesh and any placement.
mt.manual_seed(2024)
r = mt.rand(8, device_mesh=mesh, placements=[Shard(0)])
one = mt.init_device_mesh("cpu", (1,), comm=MPI.COMM_SELF)
mt.manual_seed(2024)
whole = mt.rand(8, device_mesh=one, placements=[Replicate()]).to_local()
shape, offset = mt.compute_local_shape_and_global_offset(r.shape, mesh, r.placements)
same = np.array_equal(r.to_local(), whole[offset[0]:offset[0] + shape[0]]) if shape[0] else True
say("rand(8) sharded over the mesh vs the same seed drawn on one rank:",
    f"{np.round(r.to_local(), 3).tolist()}  identical to the one-rank draw: {same}")

# A 2-D mesh when there are 4 ranks: [Shard(0), Shard(1)] gives each rank a tile.
if nranks == 4:
    mesh2 = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    t = mt.ones(5, 7, device_mesh=mesh2, placements=[Shard(0), Shard(1)])
    shape, offset = mt.compute_local_shape_and_global_offset(t.shape, mesh2, t.placements)
    say("ones(5, 7) on a (2, 2) mesh with [Shard(0), Shard(1)]:",
        f"coordinate {mesh2.get_coordinate()}, rows {offset[0]}..{offset[0] + shape[0] - 1},"
        f" cols {offset[1]}..{offset[1] + shape[1] - 1}, tp group {mesh2['tp'].mesh.tolist()}")

# Redistribution: the same global array, laid out anew. Shard(0) -> Shard(1) is one
# all-to-all; CommDebugMode counts the MPI calls that really ran and their bytes.
from mpitensor.debug import CommDebugMode  # noqa: E402

g = np.arange(6 * 4, dtype=np.int64).reshape(6, 4)
rows = mt.distribute_tensor(g, mesh, [Shard(0)])
with CommDebugMode() as comm_mode:
    cols = rows.redistribute(mesh, [Shard(1)])
say(f"distribute_tensor(6x4 arange, [Shard(0)]).redistribute([Shard(1)]), "
    f"calls {dict(comm_mode.get_comm_counts()) or 'none (one rank)'}:",
    f"columns {cols.to_local().tolist()}, sent {sum(comm_mode.get_comm_bytes().values())} bytes")
full = cols.full_tensor()
if rank == 0:
    print(f"\nfull_tensor() on every rank equals the original: {np.array_equal(full, g)}")
