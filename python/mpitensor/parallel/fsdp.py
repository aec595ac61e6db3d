"""torch's import path of the 2-D switch; the code lives in :mod:`mpitensor.fsdp`.

Example: ``from mpitensor.parallel.fsdp import enable_2d_with_fsdp``.
"""

from __future__ import annotations

from ..fsdp._two_d import _enabled, enable_2d_with_fsdp, is_2d_enabled  # noqa: F401

__all__ = ["enable_2d_with_fsdp", "is_2d_enabled"]
