"""Seeing what mpitensor does.

* :class:`CommDebugMode`: the collectives that ran (counts and bytes), per module,
  with the DTensor operations behind them; tables, JSON and a one-line summary.
* :class:`DebugMode`: torch's hierarchical trace of every DTensor operation, in
  order: operands' placements, output placements, implicit and explicit
  redistributes with their collectives, the local calls.
* :func:`visualize_sharding`: which rank holds which block, as a terminal table.
* :func:`plot_sharding`, :func:`plot_redistribute`: the same, and a redistribute's
  transfers, as PNG pictures (matplotlib).
* :func:`set_collective_checks` (or ``MPITENSOR_CHECK=1``): ranks that are about to
  make different collectives raise a RuntimeError instead of hanging.
* :func:`set_logs` (or ``MPITENSOR_LOGS=+dtensor``): debug lines for every
  redistribute and sharding decision.
* :func:`peak_rss_growth`: how much a call grows the process's resident memory at
  its peak, MPI's own temporaries included (Linux).
"""

from ._collective_check import collective_checks_enabled, set_collective_checks
from ._comm_mode import CommDebugMode
from ._debug_mode import DebugMode, get_active_debug_mode
from ._logs import set_logs
from ._memory import peak_rss_growth
from ._plot import plot_redistribute, plot_sharding
from ._visualize_sharding import visualize_sharding

__all__ = [
    "CommDebugMode",
    "DebugMode",
    "get_active_debug_mode",
    "visualize_sharding",
    "plot_sharding",
    "plot_redistribute",
    "set_collective_checks",
    "collective_checks_enabled",
    "set_logs",
    "peak_rss_growth",
]
