"""parallelize_module: apply parallel styles to a module by a plan."""

from __future__ import annotations

import warnings
from fnmatch import fnmatch

from .. import _args
from ..nn.module import Module
from ..fsdp import _two_d as _fsdp
from ._utils import validate_tp_mesh_dim
from .style import ParallelStyle

__all__ = ["parallelize_module"]


def parallelize_module(module, device_mesh=None, parallelize_plan=None, *,
                       src_data_rank: int | None = 0):
    """Shard ``module`` for tensor parallelism by ``parallelize_plan``, as
    torch.distributed.tensor.parallel.parallelize_module.

    The plan is a :class:`ParallelStyle` (applied to ``module``) or a dict
    ``{fqn: style}``. Each key is a dotted path whose segments are matched to child
    names with ``fnmatch`` (``"layers.*.attention"``, ``"w[13]"``, ``"net*"``); every
    match gets the style, and ``""`` means ``module`` itself. A key that matches
    nothing is a UserWarning; a plan of another type is a TypeError; a mesh that is
    not 1-D is a ValueError (slice it first: ``mesh["tp"]``), unless
    :func:`mpitensor.parallel.fsdp.enable_2d_with_fsdp` was called, which takes a 2-D
    (dp, tp) mesh (the plan over tp, parameters Replicate over dp); no plan warns and
    returns the module unchanged. ``src_data_rank`` is the rank whose parameter
    values are scattered (None: every rank cuts its own copy, no communication).
    Collective on the mesh. Returns the module (the root may be replaced by a
    style, as PairwiseParallel does for attention).

    Example (``mpiexec -n 4``)::

        >>> mesh = init_device_mesh("cpu", (4,))
        >>> model = parallelize_module(model, mesh, {
        ...     "layers.*.feed_forward.w1": ColwiseParallel(),
        ...     "layers.*.feed_forward.w2": RowwiseParallel(),
        ... })
    """
    if not isinstance(module, Module):
        raise TypeError(f"parallelize_module takes an mpitensor.nn.Module, got "
                        f"{type(module).__name__}")
    mesh = _args.resolve_mesh(device_mesh)
    if mesh.ndim == 2 and _fsdp.is_2d_enabled() and parallelize_plan is not None:
        return _fsdp.parallelize_2d(module, mesh, parallelize_plan, src_data_rank,
                                    parallelize_module)
    validate_tp_mesh_dim(mesh)
    if parallelize_plan is None:
        warnings.warn("No parallelize_plan is provided and auto-parallel is not supported "
                      "at the moment, so this parallelize_module call will do nothing.",
                      stacklevel=2)
        return module
    if src_data_rank not in (0, None) or isinstance(src_data_rank, bool):
        raise ValueError(f"src_data_rank must be 0 or None, got {src_data_rank!r}")
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan.src_data_rank = src_data_rank
        return parallelize_plan._apply(module, mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError("Expect Union[ParallelStyle, Dict[str, ParallelStyle]] for "
                        f"parallelize_plan, {type(parallelize_plan)} found!")
    for path, style in parallelize_plan.items():
        if not isinstance(path, str):
            raise TypeError(f"parallelize_plan keys must be module paths (str), got {path!r}")
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_plan[{path!r}] must be a ParallelStyle, got "
                            f"{type(style).__name__}")
    for path, style in parallelize_plan.items():
        if path == "":
            parallelize_module(module, mesh, style, src_data_rank=src_data_rank)
            continue
        targets, missing = _resolve(module, path.split("."))
        if not targets:
            warnings.warn(f"Parallelize plan key '{path}' could not be resolved: no "
                          f"submodule matching token '{missing}', skipping this plan entry.",
                          stacklevel=2)
        for parent, name, child in targets:
            new = parallelize_module(child, mesh, style, src_data_rank=src_data_rank)
            if new is not child:
                parent.register_module(name, new)
    return module


def _resolve(module, atoms):
    """Every (parent, name, submodule) whose path matches ``atoms`` segment by
    segment with fnmatch, and the first token that matched nothing (or None)."""
    level = [(None, "", module)]
    for atom in atoms:
        level = [(m, n, c) for _, _, m in level for n, c in m.named_children()
                 if fnmatch(n, atom)]
        if not level:
            return [], atom
    return level, None
