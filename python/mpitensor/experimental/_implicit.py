"""implicit_replication: plain ndarrays mixed with DTensors count as Replicate.

The dispatch layer (mpitensor._ops) reads the module-level flag ``active``: when it
is true and an operation mixes DTensors with plain ``np.ndarray`` operands, each
ndarray is treated as a DTensor on the DTensors' mesh with all-Replicate placements
(``DTensor.from_local(arr, mesh, [Replicate()] * mesh.ndim)``, no communication: every
rank is trusted to hold the same array). When it is false, such mixing is an error.
"""

from __future__ import annotations

import contextlib

__all__ = ["implicit_replication", "active"]

active: int = 0  # nesting depth; true while inside implicit_replication()


@contextlib.contextmanager
def implicit_replication():
    """Within this context, NumPy operations that mix DTensors and plain ndarrays
    treat the ndarrays as Replicate on the DTensors' mesh. Local; re-entrant.

    Example::

        >>> with implicit_replication():
        ...     y = dt + np.ones(dt.shape[-1])
    """
    global active
    active += 1
    try:
        yield
    finally:
        active -= 1
