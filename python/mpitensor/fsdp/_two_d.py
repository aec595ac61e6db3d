"""2-D parallelism without sharding over dp: tensor parallelism inside
data-parallel replicas.

Torch's way, :func:`~mpitensor.parallel.parallelize_module` over ``mesh["tp"]``
then :func:`~mpitensor.fsdp.fully_shard` over ``mesh["dp"]``, needs nothing from
here. After :func:`enable_2d_with_fsdp`, ``parallelize_module`` also accepts the
2-D ``(dp, tp)`` mesh itself: the plan shards the module over the ``tp`` dim
exactly as on ``mesh["tp"]``, and every parameter then lives on the 2-D mesh,
Replicate over ``dp`` (each data-parallel replica holds the same tensor-parallel
shards, as DDP's replicas). Activations stay per replica: each ``dp`` group runs
its own batch through its ``tp`` group, and the gradients are averaged over
``dp`` (an all-reduce per parameter in backward).
"""

from __future__ import annotations

from .._dtensor import DTensor
from .._dtensor_spec import contiguous_strides
from ..placement_types import Partial, Replicate

__all__ = ["enable_2d_with_fsdp", "is_2d_enabled", "parallelize_2d"]

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
    """Whether :func:`enable_2d_with_fsdp` was called. Local.

    Example: ``enable_2d_with_fsdp(); is_2d_enabled()`` is True.
    """
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
                # a new leaf (a parameter), with the tp parameter's flag
                lifted_p = _on(p.detach().to_local(), mesh, pl, p.shape)
                m._parameters[name] = lifted_p.requires_grad_(p.requires_grad)
                lifted[name] = p.placements[0]
        if lifted:
            _install(m, mesh, tp, tp_mesh, lifted)
    return module


def _on(local, mesh, placements, shape):
    return DTensor.from_local(local, mesh, placements, shape=tuple(shape),
                              stride=contiguous_strides(tuple(shape)))


def _install(module, mesh, tp, tp_mesh, lifted):
    """Hooks that hand the forward tp-mesh parameters and put the 2-D ones back
    afterwards."""
    stored = {}
    dp = 1 - tp

    def lower(mod, args):
        for name, tp_pl in lifted.items():
            p = mod._parameters[name]
            stored[name] = p
            # Each replica's gradient is a term of the replicas' average: Partial
            # (avg) over dp, reduced when it is stored as Replicate.
            grad_pl = list(p.placements)
            grad_pl[dp] = Partial("avg")
            mod._parameters[name] = _on(p.to_local(grad_placements=grad_pl), tp_mesh,
                                        [tp_pl], p.shape)

    def restore(mod, args, output):
        mod._parameters.update(stored)
        stored.clear()

    module.register_forward_pre_hook(lower)
    module.register_forward_hook(restore)
