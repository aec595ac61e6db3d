"""A redistribution plan as data, for tools, tracing and benchmarks: its steps,
bytes, messages and predicted time, torch's plan for the same move, and what
another time model predicts, and its raw run (:func:`run`). The planner is the C
core's (core/plan), called through ctypes in the ``_C`` object (:mod:`._clib`). A
:class:`Plan` owns one reference of an ``mt_plan``; the executor's trace events hand
their plans over as capsules, which :func:`of` takes. Every function is Local but
:func:`run` and the runners :func:`runner` makes.
"""

from __future__ import annotations

import numpy as np

from . import _C, _comm
from ._clib import (_STATUS_CODES, Error, I64, P, _Layout, call, capsule_pointer, check,
                    dtype_code)
from ._bind.comm import mt_redistribute
from ._bind.core import (_layout, mt_plan_check, mt_time_model_default, mt_plan_create_timed,
                         mt_plan_create_torch, mt_plan_nsteps, mt_plan_step, mt_plan_bytes,
                         mt_plan_messages, mt_plan_net_bytes, mt_plan_time, mt_plan_predict,
                         mt_plan_torch_bytes)

__all__ = ["Plan", "STEP_KINDS", "steps", "of", "run", "runner"]

# mt_step_kind, by code.
STEP_KINDS = ("all_gather", "all_to_all", "chunk", "all_reduce", "reduce_scatter",
              "direct", "all_reduce_nodes")


def _codes(layout: _Layout) -> tuple:
    return tuple((p.kind, p.dim, p.reduce_op)
                 for p in layout.placements[:layout.mesh_ndim])


def _address(plan) -> int:
    """The ``mt_plan *`` of a :class:`Plan` or of an executor's plan capsule, for a
    ctypes call."""
    if isinstance(plan, Plan):
        plan = plan._owner
    return capsule_pointer(plan, b"mpitensor.plan")


def steps(plan) -> list[tuple]:
    """[(kind, mesh_dim, src_codes, dst_codes, bytes, messages, seconds,
    copy_bytes, reduce_bytes, net_bytes)] of every step of ``plan`` (a
    :class:`Plan` or an executor's plan capsule): bytes and messages over all
    ranks, the local copies and reductions of the busiest rank, the bytes between
    nodes over all ranks."""
    address, out = _address(plan), []
    for i in range(mt_plan_nsteps(address)):
        s = mt_plan_step(address, i).contents
        out.append((STEP_KINDS[s.kind], s.mesh_dim, _codes(s.src), _codes(s.dst),
                    s.bytes, s.messages, s.time, s.copy_bytes, s.reduce_bytes,
                    s.net_bytes))
    return out


def of(plan) -> "Plan":
    """``plan`` (a capsule of a plan with steps, as the executor's trace events
    carry them) as a :class:`Plan`, sharing it: its layouts are its first step's
    source and its last step's target, its model the built-in one."""
    if isinstance(plan, Plan):
        return plan
    address = _address(plan)
    out = Plan._owning(plan)
    first = mt_plan_step(address, 0).contents
    last = mt_plan_step(address, mt_plan_nsteps(address) - 1).contents
    out._src, out._dst = _Layout.from_buffer_copy(first.src), _Layout.from_buffer_copy(last.dst)
    out._itemsize = first.itemsize
    out._model = mt_time_model_default()
    return out


def runner(mesh, plan, like):
    """A callable that runs ``plan`` (a :class:`Plan` made for ``mesh``'s shape)
    on a local array of ``like``'s shape and dtype, this rank's box of its source,
    and returns a new array of its target, as :func:`run` does. The boxes are worked
    out once, so that a call costs about what the executor's run of a cached plan
    costs: what benchmarks that time plans against each other need. Each call is
    collective on the mesh.

    Example: ``go = runner(mesh, plan, local); out = go(local)``.
    """
    address, m = _address(plan), _comm.checked(mesh)
    n = mt_plan_nsteps(address)
    if n == 0:
        return _comm._movable
    src, dst = mt_plan_step(address, 0).contents.src, mt_plan_step(address, n - 1).contents.dst
    mine, theirs = _comm._my_box(m, src), _comm._my_box(m, dst)
    _comm._check_local(_comm._movable(like), mine)
    shape = tuple(mine.shape[:mine.ndim])

    def go(local):
        local = _comm._movable(local)
        if local.shape != shape:
            _comm._check_local(local, mine)
        out = _comm._box_array(theirs, local.dtype)
        call(mt_redistribute, _comm.checked(mesh), _address(plan), dtype_code(local.dtype),
             local, out)
        return out

    return go


def run(mesh, plan, local) -> np.ndarray:
    """The local array of ``plan``'s target (a :class:`Plan` made for ``mesh``'s
    shape) from ``local``, this rank's box of its source (``local`` itself,
    C-contiguous, for a plan without steps): the raw run of a plan on a DeviceMesh,
    as the executor runs it, for benchmarks and tests. ctypes releases the GIL
    while it runs. Collective on the mesh.

    Example: ``run(mesh, plan, dt.to_local())``.
    """
    return runner(mesh, plan, local)(local)


class Plan:
    """The plan of moving a tensor of ``shape`` on a mesh of ``mesh_shape`` from
    ``src`` to ``dst`` placement codes, for elements of ``dtype``, ranked by the
    time model tuple ``model`` (the built-in one when None); the move is checked
    first (RuntimeError: a Partial created; TypeError: a reduction the dtype
    lacks). Local.

    Example: ``Plan((8,), (2,), [(1, 0, 0)], [(0, 0, 0)], "f8").steps()[0][0]`` is
    ``"all_gather"``.
    """

    __slots__ = ("_owner", "_src", "_dst", "_model", "_itemsize")

    def __new__(cls, shape, mesh_shape, src, dst, dtype, model=None):
        model = mt_time_model_default() if model is None else _comm.time_model(model)
        dtype = np.dtype(dtype)
        a, b = _layout(shape, mesh_shape, src), _layout(shape, mesh_shape, dst)
        call(mt_plan_check, a, b, dtype_code(dtype))
        made = P()
        call(mt_plan_create_timed, a, b, dtype.itemsize, model, made)
        self = cls._owning(_C.adopt(made, "plan"))
        self._src, self._dst, self._model, self._itemsize = a, b, model, dtype.itemsize
        return self

    @classmethod
    def _owning(cls, owner) -> "Plan":
        """A Plan of the ``mt_plan`` that ``owner``, a plan capsule, holds."""
        self = object.__new__(cls)
        self._owner = owner
        return self

    @property
    def nsteps(self) -> int:
        """The number of steps."""
        return mt_plan_nsteps(_address(self))

    @property
    def bytes(self) -> int:
        """Bytes received from other ranks, all ranks."""
        return mt_plan_bytes(_address(self))

    @property
    def messages(self) -> int:
        """Point-to-point messages, all ranks."""
        return mt_plan_messages(_address(self))

    @property
    def time(self) -> float:
        """Predicted seconds (the time model)."""
        return mt_plan_time(_address(self))

    @property
    def net_bytes(self) -> int:
        """Bytes received from ranks of other nodes, all ranks (the model's
        ranks_per_node)."""
        return mt_plan_net_bytes(_address(self))

    def steps(self) -> list[tuple]:
        """The steps, as :func:`steps` gives them."""
        return steps(self)

    def predict(self, model: tuple) -> float:
        """The seconds the time model tuple ``model`` predicts for these steps."""
        return mt_plan_predict(_address(self), _comm.time_model(model))

    def torch(self) -> "Plan | None":
        """The Plan of torch's per-mesh-dim steps for the same move, priced by the
        same model, or None where one of them is no valid collective here."""
        made, err = P(), Error()
        rc = mt_plan_create_torch(self._src, self._dst, self._itemsize, self._model, made, err)
        if rc == _STATUS_CODES["MT_ENOTSUP"]:
            return None
        check(rc, err)
        out = Plan._owning(_C.adopt(made, "plan"))
        out._src, out._dst, out._model = self._src, self._dst, self._model
        out._itemsize = self._itemsize
        return out

    def torch_bytes(self) -> tuple[int, int]:
        """(bytes, net_bytes) that torch's per-mesh-dim steps move for the same
        redistribution, over all ranks, priced as these steps."""
        moved, net = I64(), I64()
        call(mt_plan_torch_bytes, self._src, self._dst, self._itemsize, self._model, moved, net)
        return moved.value, net.value
