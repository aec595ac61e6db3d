"""The trace events of the executor and the hook sites of Python's own
collectives, gathered in one module so that the debugging tools share them.

Five tools listen (their flags are in mpitensor._modes.state): the collective
mismatch detector (``mpitensor.debug.set_collective_checks``), debug logging
(``MPITENSOR_LOGS=+dtensor``), gather reports (INFO logging, the gather warning),
the operation trace of an entered ``CommDebugMode`` and the call trace of an
entered ``DebugMode``. While one does, ``_modes.tracing`` is set and the C
executor tells what it does, each event calling the function of its name here:
:func:`decision` (an operation's, found in or added to the memo), :func:`move` (a
plan about to run: an operation's input, an explicit redistribute or a move an
operation names) and :func:`unmoved` (an explicit redistribute to its own
placements); while a DebugMode is entered, also :func:`ran` (what the
operation's local function got and what it gave: installed by
:func:`record_runs`, so that without a DebugMode the executor builds nothing for
it). With every tool off
the executor pays one flag test per operation.

Python's own collectives (``distribute_tensor``, ``from_local(run_check=True)``)
call :func:`collective`, and nn.functional's local layouts :func:`local`, behind
``if _modes.tracing:``. The Python door of registered calls brackets each
call with :func:`call_enter` and :func:`call_exit` while a DebugMode is entered
(``if _modes.recorders:``), so that what the call runs nests under it.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from . import _C, _clib, _modes, _plan
from .placement_types import from_code

# The operation whose inputs are being redistributed (set by `decision`, read by
# `redistribute`), so that checks and logs name it.
_current_op = ""

log = logging.getLogger("mpitensor")


def placements_text(placements) -> str:
    return "[" + ", ".join(str(p) for p in placements) + "]"


def dtype_text(dtype) -> str:
    return str(getattr(dtype, "name", dtype))


# -- the executor's events: each kind is the hook of its name (csrc/ext/ext_hooks.c) --

def move(what, mesh, plan, shape, dtype, src, dst) -> None:
    """The "move" event: a DTensor of ``src`` placements and global ``shape`` about
    to move to ``dst`` (None: the plan's target) by ``plan`` (None: no rank of
    this move communicates), for the operation being decided (``what`` None),
    an explicit redistribute (``"DTensor.redistribute"``) or the operation
    ``what`` names."""
    global _current_op
    plan = _plan.of(plan) if plan is not None else None
    steps = plan.steps() if plan is not None else []
    if dst is None:
        dst = _plan_placements(steps)[1]
    if what is None:
        if _modes.state.gather_report:
            report_move(_current_op or "an operation", _Spec(mesh, src, shape, dtype), dst)
        redistribute("operation", mesh, plan, shape, dtype, steps, src, dst)
    elif what == "DTensor.redistribute":
        redistribute(what, mesh, plan, shape, dtype, steps, src, dst)
    else:
        _current_op = what
        redistribute("operation", mesh, plan, shape, dtype, steps, src, dst)


class _Spec:
    """What report_move reads of a spec."""

    __slots__ = ("mesh", "placements", "shape", "dtype")

    def __init__(self, mesh, placements, shape, dtype):
        self.mesh, self.placements, self.shape, self.dtype = mesh, placements, shape, dtype


# -- hooks ---------------------------------------------------------------------------

def redistribute(what: str, mesh, plan, shape, dtype, steps, src, dst) -> None:
    """Right before ``plan`` (None: no rank of this move communicates) runs on
    ``mesh``, moving ``src`` to ``dst`` placements (every member rank calls this)."""
    explicit = what != "operation"
    if not explicit:
        what = f"{_current_op}: redistribute an input" if _current_op else "redistribute"
    communicates = any(s[0] != "chunk" for s in steps)
    text = _redistribute_text(what, src, dst, shape, dtype)
    # An explicit redistribute is checked even when this rank's move is local: on
    # another rank the same call may communicate (its placements differ), and would
    # wait in its check for a rank that never comes.
    if _modes.state.checks and (communicates or explicit):
        _modes.checker(text, mesh)
    if _modes.state.log_debug:
        parts = ", ".join(f"{s[0]}(mesh dim {s[1]}, {s[4]} B)" if s[1] >= 0
                          else f"{s[0]}({s[4]} B)" for s in steps)
        log.debug("%s on %r: %d step(s), %d B received over all ranks: %s", text, mesh,
                  len(steps), plan.bytes if plan is not None else 0,
                  parts or "no step")
    for listener in _modes.listeners:
        listener._record_redistribute(explicit, mesh, steps, shape, src)
    for recorder in _modes.recorders:
        recorder._move(explicit, mesh, steps, shape, dtype, src, dst)


def unmoved(what: str, mesh, placements, shape, dtype) -> None:
    """The "unmoved" event: a move returns without a plan (the target is the
    source). An explicit redistribute is checked as any, for the same reason as a
    local one."""
    if what == "DTensor.redistribute" and _modes.state.checks:
        _modes.checker(_redistribute_text(what, placements, placements, shape, dtype), mesh)


def _redistribute_text(what, src, dst, shape, dtype) -> str:
    return (f"{what} {placements_text(src)} -> {placements_text(dst)}, shape "
            f"{tuple(shape)}, {dtype_text(dtype)}")


def _plan_placements(steps):
    """(source, target) placements of a plan, from its first and last steps."""
    if not steps:
        return (), ()
    return (tuple(from_code(c) for c in steps[0][2]),
            tuple(from_code(c) for c in steps[-1][3]))


def collective(what: str, mesh, placements, shape, dtype) -> None:
    """Right before a collective that is not a plan (distribute_tensor, the
    exchanges of from_local's run_check) starts on ``mesh``."""
    text = what + (f" {placements_text(placements)}" if placements is not None else "")
    if shape is not None:
        text += f", shape {tuple(shape)}"
    if dtype is not None:
        text += f", {dtype_text(dtype)}"
    if _modes.state.checks:
        _modes.checker(text, mesh)
    if _modes.state.log_debug:
        log.debug("%s on %r", text, mesh)
    for listener in _modes.listeners:
        listener._record_operation(what, [], [], mesh)
    for recorder in _modes.recorders:
        recorder._collective(what, mesh, placements, shape, dtype)


def decision(op_key, specs, out_placements, out_shape, hit: bool) -> None:
    """The "decision" event: an operation's decision was found (hit) or made (miss)
    in the memo, for DTensor inputs of ``specs``; its output placements and shape
    come only while debug logging is on (None otherwise). It sits on every traced
    operation, so a listener keeps what it is given and reads it later."""
    global _current_op
    name = _op_names.get(op_key) or op_name(op_key)
    _current_op = name
    if out_placements is not None:
        ins = "; ".join(f"{placements_text(s.placements)} {tuple(s.shape)} "
                        f"{dtype_text(s.dtype)}" for s in specs)
        log.debug("%s: inputs %s -> output %s %s (cache %s)", name, ins,
                  placements_text(out_placements), out_shape,
                  "hit" if hit else "miss")
    if _modes.listeners:
        record = (name, specs)
        for listener in _modes.listeners:
            listener._records.append(record)
    for recorder in _modes.recorders:
        recorder._decision(name, specs)


def ran(op_key, operands, targets, local_args, out) -> None:
    """The "ran" event, while a DebugMode is entered (:func:`record_runs`): the
    operation of ``op_key`` (whose decision event came first) ran its local
    function. ``operands``: the call's operands as given (DTensors and scalars);
    ``targets``: each DTensor operand's placements as the local function got it
    (its plan's target, ``Partial(sum)`` where it was partitioned: torch's
    ``Replicate -> Partial(sum)``); ``local_args``: the local function's
    positional arguments (the moved local arrays, scalars, the op's extra
    arguments); ``out``: the result (a DTensor or a tuple of them)."""
    for recorder in _modes.recorders:
        recorder._ran(op_key, operands, targets, local_args, out)


def call_enter(name: str, args, kwargs):
    """The start of a Python-level call on DTensors (the door of registered NumPy
    functions and DTensor's methods): ``name`` as the trace writes it
    (``numpy.linalg.svd``), its arguments as given. Returns the token that
    :func:`call_exit` takes. Call it only while ``_modes.recorders`` is non-empty.

    Example::

        token = _trace.call_enter("numpy.linalg.norm", (x,), {}) if _modes.recorders else None
        try:
            result = entry(x)
        finally:
            if token is not None:
                _trace.call_exit(token, result)
    """
    return [(recorder, recorder._call_enter(name, args, kwargs))
            for recorder in _modes.recorders]


def call_exit(token, result) -> None:
    """The end of the call :func:`call_enter` opened (``result`` None when it
    raised): what ran since nests under it."""
    for recorder, handle in token:
        recorder._call_exit(handle, result)


def local(name: str, inputs, out_placements) -> None:
    """Before an operation whose layouts need no decision and no communication
    (nn.functional's linear and pointwise functions on local shards)."""
    if _modes.state.log_debug:
        ins = "; ".join(f"{placements_text(x._spec.placements)} {tuple(x._spec.shape)}"
                        for x in inputs)
        log.debug("%s: inputs %s -> output %s (local, no decision needed)", name, ins,
                  placements_text(out_placements))
    for listener in _modes.listeners:
        listener._record_operation(name, [tuple(x._spec.shape) for x in inputs],
                                   [tuple(x._spec.placements) for x in inputs],
                                   inputs[0]._spec.mesh)
    for recorder in _modes.recorders:
        recorder._local(name, inputs, out_placements)


_op_names: dict = {}  # op key -> name: the name is asked for on every traced op


def op_name(op_key) -> str:
    """``numpy.add``, ``numpy.einsum``, ... from an operation's key."""
    try:
        return _op_names[op_key]
    except (KeyError, TypeError):
        pass
    name = _op_name(op_key)
    if len(_op_names) < 4096:
        try:
            _op_names[op_key] = name
        except TypeError:
            pass
    return name


def _op_name(op_key) -> str:
    while isinstance(op_key, tuple) and op_key:
        if op_key[0] == "register_sharding" and len(op_key) > 1:
            op_key = op_key[1]
            break
        op_key = op_key[0]
    name = getattr(op_key, "__name__", None)
    if name is None:
        name = str(op_key)
    # NumPy's own functions get their module; others (nn.functional's softmax, a
    # user's register_sharding function) keep their bare name.
    return "numpy." + name if "." not in name and hasattr(np, name) else name


def report_move(what: str, spec, placements) -> None:
    """report_gather for the move of the DTensor of ``spec`` to ``placements``, when
    it gathers: along every mesh dim (of more than one rank) where a Shard becomes
    Replicate. Local.

    Example: ``report_move("numpy.sort", dt._spec, (Replicate(),))``.
    """
    if not _modes.state.gather_report:
        return
    shape = spec.mesh.shape
    dims = [m for m, (p, q) in enumerate(zip(spec.placements, placements))
            if p.is_shard() and q.is_replicate() and shape[m] > 1]
    if dims:
        report_gather(what, spec, placements, dims)


def report_gather(what: str, spec, placements, mesh_dims) -> None:
    """Reports that the operation ``what`` gathers the DTensor of ``spec`` along
    ``mesh_dims`` (to ``placements``): an INFO line on the ``mpitensor`` logger
    (``MPITENSOR_LOGS=dtensor``), and a UserWarning on every rank when
    ``mpitensor.set_gather_warning(True)`` is on. The gather itself runs as a
    collective that CommDebugMode counts. Local.

    Example: ``report_gather("numpy.sort", dt._spec, (Replicate(),), [0])``.
    """
    if not _modes.state.gather_report:
        return
    dims = sorted({spec.placements[m].dim for m in mesh_dims})
    text = (f"{what} gathers dim{'s' if len(dims) > 1 else ''} "
            f"{', '.join(map(str, dims))} of a {tuple(spec.shape)} "
            f"{dtype_text(spec.dtype)} DTensor ({placements_text(spec.placements)} -> "
            f"{placements_text(placements)}): it has no rule that works on the pieces "
            f"here (see the user guide's table of gathers)")
    log.info(text)
    if _modes.state.gather_warning:
        warnings.warn(text, UserWarning, stacklevel=4)


# -- what the executor counts -------------------------------------------------------

# The kinds of calls from C into Python (csrc/ext/ext_hooks.c), then the operations
# the executor ran, in the order of the extension's counters.
HOOK_KINDS = ("local", "build", "entry", "event", "placements", "error", "dtype",
              "errstate", "deferred", "runs")
assert len(HOOK_KINDS) == _C.HOOK_COUNT, "HOOK_KINDS does not mirror the extension's"
_hook_calls = _clib.exported(_C.HOOK_CALLS, "mpitensor._C.hook_calls")


def hook_stats() -> dict:
    """{kind: calls} of the calls from C into Python since import, by hook kind, and
    ``runs``: the operations the executor ran. Local.

    Example: ``hook_stats()["local"]`` grows by one for a cached ``a + b``.
    """
    return dict(zip(HOOK_KINDS, _hook_calls))


_C.set_hook("decision", decision)
_C.set_hook("move", move)
_C.set_hook("unmoved", unmoved)


def record_runs(on: bool) -> None:
    """Installs (or removes) the "ran" hook: DebugMode does while one is entered.
    The executor builds the event's arguments only while the hook is installed.

    Example: ``record_runs(bool(_modes.recorders))``.
    """
    _C.set_hook("ran", ran if on else None)
