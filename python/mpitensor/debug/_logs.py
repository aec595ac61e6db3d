"""set_logs: the in-program equivalent of MPITENSOR_LOGS (torch._logging.set_logs)."""

from __future__ import annotations

from .. import _logging

__all__ = ["set_logs"]


def set_logs(*, dtensor: int | None = None) -> None:
    """Sets the level of the ``mpitensor`` logger, as ``MPITENSOR_LOGS`` does at
    import: ``logging.DEBUG`` (``+dtensor``), ``logging.INFO`` (``dtensor``),
    ``logging.WARNING`` (``-dtensor``); None restores Python's defaults. Lines go
    to stderr, each prefixed with the rank. Local.

    Use this, not ``logging.getLogger("mpitensor").setLevel``: it is also the switch
    of the debug hooks, which cost nothing while they are off.

    Example::

        >>> mpitensor.debug.set_logs(dtensor=logging.DEBUG)
        >>> dt.redistribute(mesh, [Replicate()])
        [rank0]:DEBUG:mpitensor: DTensor.redistribute [S(0)] -> [R], shape (8, 4), ...
    """
    if dtensor is not None and (isinstance(dtensor, bool) or not isinstance(dtensor, int)):
        raise TypeError(f"dtensor must be a logging level (int) or None, got {dtensor!r}")
    _logging.set_level(dtensor)
