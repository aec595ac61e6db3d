"""The same program written for torch DTensor and for mpitensor, line by line.

    mpiexec -n 4 python examples/porting_from_torch.py   # torch: torchrun --nproc-per-node 4
    python examples/porting_from_torch.py

Each mpitensor line is preceded by the torch line it replaces (`# torch:`). What
differs: arrays are NumPy (default dtype float64, not float32); `dt.size` is the
element count as in NumPy (torch's `dt.size()` is the shape: use `dt.shape`);
dims are `axis=` (torch: `dim=`); there is no autograd; the launcher is `mpiexec`
and the process group is MPI.COMM_WORLD (no `init_process_group`); the device is
"cpu". Everything else -- mesh, placements, the three ways to make a DTensor,
redistribute, full_tensor, CommDebugMode, seeded random -- reads the same.
"""

# torch: import torch
# torch: import torch.distributed as dist
import numpy as np
from mpi4py import MPI

# torch: from torch.distributed.device_mesh import init_device_mesh
# torch: from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
# torch: from torch.distributed.tensor.debug import CommDebugMode
# torch: from torch.testing import assert_close
import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.debug import CommDebugMode
from mpitensor.testing import assert_close

# torch: dist.init_process_group("gloo"); rank, world = dist.get_rank(), dist.get_world_size()
rank, world = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def say(*args):
    if rank == 0:
        print(*args)


# torch: mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))

# 1. distribute a global tensor (the same on every rank)
# torch: full = torch.arange(24, dtype=torch.float64).reshape(8, 3)
full = np.arange(24, dtype=np.float64).reshape(8, 3)
# torch: a = distribute_tensor(full, mesh, [Shard(0)])
a = distribute_tensor(full, mesh, [Shard(0)])

# 2. wrap each rank's own piece
# torch: local = torch.full((2, 3), float(rank), dtype=torch.float64)
local = np.full((2, 3), float(rank))
# torch: b = DTensor.from_local(local, mesh, [Shard(0)])
b = DTensor.from_local(local, mesh, [Shard(0)])

# 3. factories, seeded: the same global values whatever the mesh
# torch: torch.manual_seed(0); c = torch.distributed.tensor.randn(8, 3, device_mesh=mesh, placements=[Shard(0)])
mt.manual_seed(0)
c = mt.randn(8, 3, device_mesh=mesh, placements=[Shard(0)])

# torch: say(a.shape, a.size(), a.to_local().shape, a.placements)
say("global shape", a.shape, "| elements", a.size, "| local", a.to_local().shape, "|", a.placements)
# torch: assert b.shape == torch.Size([2 * world, 3])
assert b.shape == (2 * world, 3)

# Operations: torch ops on DTensors <-> NumPy functions and operators on DTensors.
# torch: d = torch.relu(a @ c.T).sum(dim=0)
d = np.maximum(a @ c.T, 0.0).sum(axis=0)
say("relu(a @ c.T).sum(axis=0):", d.placements)

# Redistribute, and count what it cost.
# torch: with CommDebugMode() as comm_mode:
# torch:     r = a.redistribute(mesh, [Replicate()])
# torch: say(comm_mode.get_comm_counts())   # {all_gather_into_tensor: 1}
with CommDebugMode() as comm_mode:
    r = a.redistribute(mesh, [Replicate()])
say("Shard(0) -> Replicate:", dict(comm_mode.get_comm_counts()) or "no communication (one rank)")

# Partial values: each rank holds a summand; Replicate reduces them (an all-reduce).
# torch: p = DTensor.from_local(torch.ones(3, dtype=torch.float64), mesh, [Partial()])
p = DTensor.from_local(np.ones(3), mesh, [Partial()])
# torch: total = p.full_tensor()
total = p.full_tensor()
# torch: assert torch.equal(total, torch.full((3,), float(world), dtype=torch.float64))
assert np.array_equal(total, np.full(3, float(world)))

# The whole array on every rank.
# torch: assert torch.equal(r.to_local(), full) and torch.equal(a.full_tensor(), full)
assert np.array_equal(r.to_local(), full) and np.array_equal(a.full_tensor(), full)
# torch: ref = torch.relu(full @ c.full_tensor().T).sum(dim=0)
ref = np.maximum(full @ c.full_tensor().T, 0.0).sum(axis=0)
# torch: assert_close(d.full_tensor(), ref)
assert_close(d, ref)  # compares shard by shard, no gather; collective
say("all checks passed on", world, "rank(s)")
# torch: dist.destroy_process_group()   (mpitensor: MPI finalizes at exit)
