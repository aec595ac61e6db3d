"""distribute_module: a module's parameters and buffers -> DTensors, and hooks that
turn its inputs and outputs into the layouts the caller wants."""

from __future__ import annotations

import inspect
import warnings
from typing import Callable

from . import _args
from ._dtensor import DTensor
from ._distribute import distribute_tensor
from .autograd import no_grad
from .device_mesh import DeviceMesh
from .nn.module import Module

__all__ = ["distribute_module"]


def distribute_module(module, device_mesh: DeviceMesh | None = None,
                      partition_fn: Callable | None = None,
                      input_fn: Callable | None = None,
                      output_fn: Callable | None = None):
    """Turn ``module``'s parameters and buffers into DTensors and install input and
    output conversions, as torch.distributed.tensor.distribute_module.

    1. ``partition_fn(name, submodule, device_mesh)`` runs on every submodule
       (``module.named_modules()``, the root named ``""``); it may replace
       parameters with DTensors (``submodule.register_parameter``). Whatever
       parameter or buffer is still an ndarray afterwards is replicated over the
       mesh (all of them when ``partition_fn`` is None).
    2. ``input_fn(module, inputs, device_mesh)`` becomes a forward pre-hook and
       ``output_fn(module, outputs, device_mesh)`` a forward hook (the older
       two-argument forms ``(inputs, device_mesh)`` / ``(outputs, device_mesh)``
       still work with a FutureWarning, as in torch).

    A second call on the same module is a RuntimeError. Collective on the mesh
    (parameters are scattered or broadcast from the first rank of each mesh dim).

    Example (``mpiexec -n 2``)::

        >>> mesh = init_device_mesh("cpu", (2,))
        >>> def shard_rows(name, m, mesh):
        ...     if isinstance(m, nn.Linear):
        ...         m.register_parameter("weight", distribute_tensor(m.weight, mesh, [Shard(0)]))
        >>> lin = distribute_module(nn.Linear(4, 8), mesh, shard_rows)
        >>> lin.weight.placements, lin.bias.placements
        ((Shard(dim=0),), (Replicate(),))
    """
    if not isinstance(module, Module):
        raise TypeError(f"distribute_module takes an mpitensor.nn.Module, got "
                        f"{type(module).__name__}")
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError("distribute_module should only be called once on a module, "
                           "but it has already been called on this module!")
    mesh = _args.resolve_mesh(device_mesh)
    # Placing parameters writes them: not part of any gradient (torch's
    # distribute_module runs under no_grad too).
    with no_grad():
        for name, submod in list(module.named_modules()):
            if partition_fn is not None:
                partition_fn(name, submod, mesh)
            _replicate_the_rest(submod, mesh)
    if input_fn is not None:
        _install(module, input_fn, mesh, "input_fn")
    if output_fn is not None:
        _install(module, output_fn, mesh, "output_fn")
    module._distribute_module_applied = True
    return module


def _replicate_the_rest(module, mesh: DeviceMesh) -> None:
    for key, param in list(module._parameters.items()):
        if param is not None and not isinstance(param, DTensor):
            module.register_parameter(key, distribute_tensor(param, mesh, None))
    for key, buf in list(module._buffers.items()):
        if buf is not None and not isinstance(buf, DTensor):
            module._buffers[key] = distribute_tensor(buf, mesh, None)


def _install(module, fn: Callable, mesh: DeviceMesh, what: str) -> None:
    try:
        nargs = len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        nargs = 3
    if nargs not in (2, 3):
        raise ValueError(f"{what} should take in 3 arguments, but got {nargs} arguments!")
    if nargs == 2:
        warnings.warn(f"Deprecating {what} that takes two arguments (inputs or outputs, "
                      f"device_mesh), please use {what} that takes in (module, inputs or "
                      f"outputs, device_mesh) instead!", FutureWarning, stacklevel=3)
    if what == "input_fn":
        if nargs == 2:
            module.register_forward_pre_hook(lambda _, inputs: fn(inputs, mesh))
        else:
            module.register_forward_pre_hook(lambda mod, inputs: fn(mod, inputs, mesh))
    elif nargs == 2:
        module.register_forward_hook(lambda _, inputs, outputs: fn(outputs, mesh))
    else:
        module.register_forward_hook(lambda mod, inputs, outputs: fn(mod, outputs, mesh))
