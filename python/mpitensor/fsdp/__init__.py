"""Fully sharded data parallelism, as torch.distributed.fsdp's ``fully_shard``
(FSDP2), on DTensors: parameters sharded on dim 0 over the data-parallel mesh,
gathered one module group at a time for its forward and backward, gradients
reduce-scattered back, optionally in lower precision (``MixedPrecisionPolicy``).
On a 2-D ``(replicate, shard)`` mesh it is torch's HSDP: sharded within each
replica group, replicated across them. Composes with tensor parallelism over a
``dp`` mesh sliced from a 2-D ``(dp, tp)`` mesh (see docs/training.md).

Example (``mpiexec -n 4``)::

    >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    >>> model = parallelize_module(model, mesh["tp"], plan)
    >>> for block in model.layers:
    ...     fully_shard(block, mesh=mesh["dp"])
    >>> fully_shard(model, mesh=mesh["dp"])
"""

from __future__ import annotations

from ._fully_shard import FSDPModule, UnshardHandle, fully_shard
from ._mesh_dims import DataParallelMeshDims
from ._mixed_precision import MixedPrecisionPolicy
from ._offload import CPUOffloadPolicy, OffloadPolicy
from ._two_d import enable_2d_with_fsdp, is_2d_enabled

__all__ = ["fully_shard", "FSDPModule", "UnshardHandle", "DataParallelMeshDims",
           "MixedPrecisionPolicy",
           "OffloadPolicy", "CPUOffloadPolicy",
           "enable_2d_with_fsdp", "is_2d_enabled"]
