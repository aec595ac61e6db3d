"""DTensor's former module, kept for the imports of mpitensor.checkpoint (task D1
switches them to mpitensor._dtensor; then this file goes)."""

from ._dtensor import DTensor

__all__ = ["DTensor"]
