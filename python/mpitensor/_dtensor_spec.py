"""The layout of a DTensor: mesh, placements, global shape and dtype."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._bind import core
from .device_mesh import DeviceMesh
from .placement_types import Placement


class DTensorSpec(NamedTuple):
    """Immutable description of a DTensor, equal on every rank of its mesh."""

    mesh: DeviceMesh
    placements: tuple[Placement, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    stride: tuple[int, ...]


# Row-major strides in elements, torch's meaning of ``stride()``: the core's rule
# (a dim of size 0 counts as 1), so the specs Python and C make agree; the core's
# binding itself, since every DTensor made in Python asks it. Local.
# Example: ``contiguous_strides((4, 0)) == (1, 1)``.
contiguous_strides = core.contiguous_strides
