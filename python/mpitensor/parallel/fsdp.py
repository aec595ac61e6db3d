"""2-D parallelism: tensor parallelism inside data-parallel replicas.

After :func:`enable_2d_with_fsdp`, :func:`~mpitensor.parallel.parallelize_module`
accepts a 2-D ``(dp, tp)`` mesh: the plan shards the module over the ``tp`` dim
exactly as on ``mesh["tp"]``, and every parameter then lives on the 2-D mesh,
Replicate over ``dp`` (each data-parallel replica holds the same tensor-parallel
shards). :func:`shard_over_dp` additionally shards them over ``dp`` (FSDP's
layout): a module's parameters are all-gathered over ``dp`` just before its
forward and dropped after it. Activations stay per replica: each ``dp`` group runs
its own batch through its ``tp`` group.
"""

from __future__ import annotations

from .._dtensor import DTensor
from .._dtensor_spec import contiguous_strides
from ..placement_types import Replicate, Shard

__all__ = ["enable_2d_with_fsdp", "is_2d_enabled", "shard_over_dp"]

_enabled = [False]


def enable_2d_with_fsdp() -> bool:
    """Let parallelize_module take a 2-D (dp, tp) mesh (see the module docstring).
    Returns True, as torch's. Local.

    Example (``mpiexec -n 4``)::

        >>> enable_2d_with_fsdp()
        >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        >>> mlp = parallelize_module(mlp, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        >>> mlp.w1.weight.placements
        (Replicate(), Shard(dim=0))
    """
    _enabled[0] = True
    return True


def is_2d_enabled() -> bool:
    return _enabled[0]


def tp_dim_of(mesh) -> int:
    """The tensor-parallel dim of a 2-D mesh: the one named "tp", else the last."""
    names = mesh.mesh_dim_names
    return names.index("tp") if names and "tp" in names else mesh.ndim - 1


def parallelize_2d(module, mesh, plan, src_data_rank, parallelize_1d):
    """parallelize_module on a 2-D mesh: the plan over the tp dim, then every
    parameter lifted onto the 2-D mesh, Replicate over dp. Collective."""
    if mesh.ndim != 2:
        raise ValueError(f"2-D parallelism takes a 2-D (dp, tp) mesh, got {mesh.ndim}-D")
    tp = tp_dim_of(mesh)
    tp_mesh = mesh._slice([tp])
    module = parallelize_1d(module, tp_mesh, plan, src_data_rank=src_data_rank)
    for m in module.modules():
        lifted = {}
        for name, p in list(m._parameters.items()):
            if isinstance(p, DTensor) and p.device_mesh == tp_mesh:
                pl = [Replicate(), Replicate()]
                pl[tp] = p.placements[0]
                m._parameters[name] = _on(p.to_local(), mesh, pl, p.shape)
                lifted[name] = p.placements[0]
        if lifted:
            _install(m, mesh, tp, tp_mesh, lifted)
    return module


def _on(local, mesh, placements, shape):
    return DTensor.from_local(local, mesh, placements, shape=tuple(shape),
                              stride=contiguous_strides(tuple(shape)))


def _install(module, mesh, tp, tp_mesh, lifted):
    """Hooks that hand the forward tp-mesh parameters (gathered over dp when they
    are sharded there) and put the 2-D ones back afterwards."""
    stored = {}
    dp = 1 - tp

    def lower(mod, args):
        for name, tp_pl in lifted.items():
            p = mod._parameters[name]
            stored[name] = p
            if not p.placements[dp].is_replicate():
                pl = list(p.placements)
                pl[dp] = Replicate()
                p = p.redistribute(mesh, pl)  # FSDP's unshard: all-gather over dp
            mod._parameters[name] = _on(p.to_local(), tp_mesh, [tp_pl], p.shape)

    def restore(mod, args, output):
        mod._parameters.update(stored)
        stored.clear()

    module.register_forward_pre_hook(lower)
    module.register_forward_hook(restore)


def shard_over_dp(module) -> "object":
    """Shard every 2-D parameter over the dp dim too (FSDP's layout): on the first
    tensor dim that the tp placement leaves whole and that has at least as many
    elements as dp ranks (else the parameter stays Replicate over dp). Each
    forward all-gathers them over dp first. Collective on the mesh (local chunks
    are cut, nothing is sent). Returns the module.

    Example (``mpiexec -n 4``)::

        >>> shard_over_dp(mlp).w1.weight.placements
        (Shard(dim=1), Shard(dim=0))
    """
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if not (isinstance(p, DTensor) and p.device_mesh.ndim == 2):
                continue
            mesh = p.device_mesh
            dp = 1 - tp_dim_of(mesh)
            if not p.placements[dp].is_replicate():
                continue
            tp_pl = p.placements[1 - dp]
            for d in range(p.ndim):
                if not tp_pl.is_shard(d) and p.shape[d] >= mesh.size(dp):
                    pl = list(p.placements)
                    pl[dp] = Shard(d)
                    m._parameters[name] = p.redistribute(mesh, pl)
                    break
    return module
