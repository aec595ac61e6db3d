"""implicit_replication: plain ndarrays mixed with DTensors count as Replicate.

The block counts itself in mpitensor._modes, which the dispatch (mpitensor._ops)
reads: while it is entered and an operation mixes DTensors with plain
``np.ndarray`` operands, each ndarray is treated as a DTensor on the DTensors' mesh
with all-Replicate placements (``DTensor.from_local(arr, mesh, [Replicate()] *
mesh.ndim)``, no communication: every rank is trusted to hold the same array).
Outside it, such mixing is an error.
"""

from __future__ import annotations

import contextlib

from .. import _modes

__all__ = ["implicit_replication"]


@contextlib.contextmanager
def implicit_replication():
    """Within this context, NumPy operations that mix DTensors and plain ndarrays
    treat the ndarrays as Replicate on the DTensors' mesh. Local; re-entrant.

    Example::

        >>> with implicit_replication():
        ...     y = dt + np.ones(dt.shape[-1])
    """
    _modes.push_implicit_replication()
    try:
        yield
    finally:
        _modes.pop_implicit_replication()
