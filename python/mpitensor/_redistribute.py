"""Moving a DTensor between layouts: plan lookup and async handles.

The plan itself (which collectives, in which order, how many bytes) and the check
of what a move may not do are the C core's (mt_plan_check, mt_plan_create); plans
are cached per mesh, and this module hands the local array to the executor.
"""

from __future__ import annotations

import numpy as np

from . import _C
from ._layout import _codes


class AsyncLocal:
    """The local data of a DTensor whose redistribute is still in flight.

    ``DTensor.redistribute(..., async_op=True)`` returns at once with one of these
    inside; the first use of the local data (``to_local()``, ``full_tensor()``, an
    operation, or ``DTensor.wait()``) waits for the MPI request and replaces it by
    the ndarray, so ``to_local()`` always returns a plain, complete ndarray.
    """

    __slots__ = ("_request",)

    def __init__(self, request):
        self._request = request

    def wait(self) -> np.ndarray:
        """Completes the redistribute (collective) and returns the local ndarray."""
        return self._request.wait()

    def __repr__(self) -> str:
        return f"AsyncLocal(done={self._request.done})"


def plan_for(mesh, shape: tuple[int, ...], src, dst, dtype):
    """The C plan for this move of ``dtype`` elements, checked when made (RuntimeError
    for a Partial target the source lacks, TypeError for a reduction the dtype
    lacks: complex max/min, an average of bools or integers; mesh dims of size 1
    alike) and kept in the mesh's bounded cache (the oldest plan goes first).
    Local.

    Example: ``plan_for(mesh, (8, 8), (Shard(0),), (Replicate(),), np.dtype("f8"))``.
    """
    key = (shape, src, dst, dtype)
    plan = mesh._plans.get(key)
    if plan is None:
        plans = mesh._plans
        if len(plans) >= mesh._plan_limit:
            del plans[next(iter(plans))]
        plan = plans[key] = _C.Plan(shape, mesh.shape, _codes(src), _codes(dst), dtype,
                                    mesh._handle.time_model())
    return plan


def run(mesh, plan, local: np.ndarray, async_op: bool):
    """Executes ``plan`` on this rank's local array: an ndarray, or an AsyncLocal."""
    if async_op:
        return AsyncLocal(_C.redistribute_start(mesh._handle, plan, local))
    return _C.redistribute(mesh._handle, plan, local)
