"""The layout of a DTensor: mesh, placements, global shape and dtype."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _C
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


# Every operation's output is given a spec: NamedTuple's __new__, a Python function
# reached through the type's slot, would cost more than the rest of a small
# operation, so the extension makes the tuple (the same fields, the same errors).
DTensorSpec.__new__ = staticmethod(_C.new_spec)


# Row-major strides in elements, torch's meaning of ``stride()``: the core's rule
# (a dim of size 0 counts as 1), so the specs Python and C make agree; the core's
# binding itself, since every DTensor made in Python asks it. Local.
# Example: ``contiguous_strides((4, 0)) == (1, 1)``.
contiguous_strides = core.contiguous_strides
