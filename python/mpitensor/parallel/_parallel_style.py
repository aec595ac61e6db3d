"""ParallelStyle: the base of every parallel style (style.py, _legacy_style.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..device_mesh import DeviceMesh

__all__ = ["ParallelStyle"]


class ParallelStyle(ABC):
    """What a style must do: ``_apply(module, device_mesh)`` shards ``module`` (and
    installs its hooks) and returns it. ``src_data_rank`` (set by
    parallelize_module) is the rank whose parameter values are scattered.
    Subclasses are local values; applying one is collective on the mesh.

    Example: ``class Mine(ParallelStyle): def _apply(self, module, device_mesh): ...``,
    then ``parallelize_module(model, mesh, {"proj": Mine()})``.
    """

    src_data_rank: int | None = 0

    @abstractmethod
    def _apply(self, module, device_mesh: DeviceMesh):
        ...
