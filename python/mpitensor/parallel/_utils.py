"""Argument checks shared by the parallel styles and parallelize_module."""

from __future__ import annotations

from ..placement_types import Placement


def validate_tp_mesh_dim(device_mesh) -> None:
    """Tensor parallelism takes a 1-D mesh (ValueError on every rank otherwise)."""
    if device_mesh.ndim != 1:
        raise ValueError(
            f"Tensor Parallel only accepts a 1D DeviceMesh, but found {device_mesh.ndim}D! "
            f"If you have a 2-D or N-D device_mesh, consider passing in device_mesh[\"tp\"]"
        )


def check_placement(value, what: str, optional: bool = True):
    """``value`` itself when it is a Placement (or None when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, Placement):
        raise TypeError(f"{what} must be a Placement such as Shard(0) or Replicate(), got "
                        f"{value!r}")
    return value


def layouts(value, what: str):
    """A Placement or a tuple of optional Placements, as a tuple (None stays None)."""
    if value is None:
        return None
    if isinstance(value, Placement):
        return (value,)
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{what} must be a Placement or a tuple of Placements/None, got "
                        f"{value!r}")
    return tuple(check_placement(v, what) for v in value)
