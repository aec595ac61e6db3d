"""CommDebugMode: counts the collectives that really ran, and their bytes."""

from __future__ import annotations

from collections import defaultdict

from .. import _C


def _diff(now: dict, then: dict, index: int) -> defaultdict:
    out: defaultdict = defaultdict(int)
    for name, value in now.items():
        delta = value[index] - then[name][index]
        if delta:
            out[name] = delta
    return out


class CommDebugMode:
    """Context manager that counts the MPI collectives run inside it, on this rank.

    Counts come from the C executor, so they are the MPI calls that really ran.
    Keys are torch's functional-collective names: ``"all_gather_into_tensor"``,
    ``"all_reduce"``, ``"reduce_scatter_tensor"``, ``"all_to_all_single"``,
    ``"broadcast"``, ``"scatter"``; missing keys read 0. Entering resets the counts.
    Local: counting never communicates.

    Example::

        >>> with CommDebugMode() as comm_mode:
        ...     dt.redistribute(mesh, [Replicate()])
        >>> comm_mode.get_comm_counts()["all_gather_into_tensor"]
        1
        >>> comm_mode.get_comm_bytes()["all_gather_into_tensor"]   # bytes this rank sent
    """

    def __init__(self):
        self._start = self._end = None

    def __enter__(self) -> "CommDebugMode":
        self._start, self._end = _C.comm_counters(), None
        return self

    def __exit__(self, *exc) -> None:
        self._end = _C.comm_counters()

    def _window(self):
        if self._start is None:
            raise RuntimeError("CommDebugMode has not been entered yet: use `with CommDebugMode() as m:`")
        return (self._end or _C.comm_counters()), self._start

    def get_comm_counts(self) -> defaultdict:
        """``{collective name: calls}`` inside the context (so far, while inside it)."""
        return _diff(*self._window(), 0)

    def get_comm_bytes(self) -> defaultdict:
        """``{collective name: payload bytes this rank delivered to other ranks}``."""
        return _diff(*self._window(), 1)

    def get_total_counts(self) -> int:
        """All collective calls inside the context."""
        return sum(self.get_comm_counts().values())
