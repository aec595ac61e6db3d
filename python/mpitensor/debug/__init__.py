"""Seeing what mpitensor does: communication counting (``CommDebugMode``)."""

from ._comm_mode import CommDebugMode

__all__ = ["CommDebugMode"]
