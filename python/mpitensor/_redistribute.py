"""Moving a DTensor between layouts: argument rules, plan lookup, async handles.

The plan itself (which collectives, in which order, how many bytes) is made by the
C core and cached per mesh; this module only checks what torch checks and hands
the local array to the executor.
"""

from __future__ import annotations

import numpy as np

from . import _C
from ._layout import _codes
from .placement_types import Partial, Placement


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


def check_targets(src: tuple[Placement, ...], dst: tuple[Placement, ...],
                  dtype: np.dtype) -> None:
    """Refuses, from the arguments alone and so on every rank alike, what torch
    refuses and what has no reduction for this dtype.

    Partial can be kept but never created by a redistribute. The reductions a move
    runs must exist for the dtype: complex numbers have no max/min, and an average
    of bools or integers is not of their dtype. A mesh dim of size 1, which needs no
    reduction, raises the same errors as a larger one.
    """
    for m, (s, d) in enumerate(zip(src, dst)):
        if s is d or (type(s) is not Partial and type(d) is not Partial):
            continue
        if type(d) is Partial:
            raise RuntimeError(
                f"Can not redistribute from {s} to {d} on mesh dim {m}: redistributing "
                f"to Partial is for internal use only! Partial tensors come from "
                f"DTensor.from_local and from operators."
            )
        op = s.reduce_op
        if dtype.kind == "c" and op in ("max", "min"):
            raise TypeError(f"Partial({op}) of {dtype} values: complex numbers have no order")
        if dtype.kind in "biu" and op == "avg":
            raise TypeError(
                f"Partial(avg) of {dtype} values: an average is not a {dtype}; cast to a "
                f"float dtype first (forward_dtype=)"
            )


def plan_for(mesh, shape: tuple[int, ...], src, dst, itemsize: int):
    """The C plan for this move, made once per (mesh, shape, placements, itemsize)
    and kept in the mesh's bounded cache (the oldest plan goes first)."""
    key = (shape, src, dst, itemsize)
    plan = mesh._plans.get(key)
    if plan is None:
        plans = mesh._plans
        if len(plans) >= mesh._plan_limit:
            del plans[next(iter(plans))]
        plan = plans[key] = _C.Plan(shape, mesh.shape, _codes(src), _codes(dst), itemsize)
    return plan


def run(mesh, plan, local: np.ndarray, async_op: bool):
    """Executes ``plan`` on this rank's local array: an ndarray, or an AsyncLocal."""
    if async_op:
        return AsyncLocal(_C.redistribute_start(mesh._handle, plan, local))
    return _C.redistribute(mesh._handle, plan, local)
