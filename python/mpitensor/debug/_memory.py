"""How much a call grows this process's resident memory at its peak (Linux)."""

from __future__ import annotations

import gc
from typing import Any, Callable

from .. import _comm

__all__ = ["peak_rss_growth"]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field} line")


def peak_rss_growth(fn: Callable[[], Any]) -> int:
    """Bytes by which this process's peak resident memory rises above its resident
    memory before ``fn()``, while ``fn`` runs and its result is alive.

    The kernel's high-water mark (VmHWM) is reset to the current RSS first (by
    writing 5 to ``/proc/self/clear_refs``), so the figure includes what no Python
    tracer sees: MPI's and BLAS's own temporaries, and the block pool. Linux only:
    OSError where the mark cannot be reset (another system, a restricted
    container). The block pool's cached blocks, and what glibc can give back of
    the memory it keeps, are released first, so that they do not serve ``fn``'s
    allocations unseen; memory a thread's own malloc arena keeps still can, so
    the figure is a lower bound of what ``fn`` needs from a cold start. Local;
    the result of ``fn`` is dropped.

    Example::

        >>> peak_rss_growth(lambda: np.ones(1 << 22)) >= 30 << 20   # 32 MiB
        True
    """
    gc.collect()
    # Memory freed earlier but still resident would serve fn's allocations without
    # a new page, and the growth would read 0 for a call that allocates: blocks
    # the pool caches for reuse, and what glibc keeps (up to twice its mmap
    # threshold, which rises to 32 MiB after a large free). Both are handed back
    # first; malloc_trim cannot shrink the top of an arena other than the main
    # one, which the main thread uses after contention with other threads.
    _comm.pool_trim()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return (peak - before) * 1024
