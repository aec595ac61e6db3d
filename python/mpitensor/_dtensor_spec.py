"""The layout of a DTensor: mesh, placements, global shape and dtype."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .device_mesh import DeviceMesh
from .placement_types import Placement


class DTensorSpec(NamedTuple):
    """Immutable description of a DTensor, equal on every rank of its mesh."""

    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    stride: tuple[int, ...]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements, torch's meaning of ``stride()``."""
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= max(s, 1)
    return tuple(reversed(strides))
