"""The modes in force: what upper floors switch on and lower floors consult.

A feature that changes how lower code behaves while it is active (implicit
replication, loss_parallel, context parallelism, the debugging tools, grad mode)
pushes its state here; the code that must honour it reads it here. So a lower
module never imports a feature to ask whether it is active.

The flags live once, in ``state`` (the C extension's ``mt_ext_modes``, mapped
here through ctypes with its layout from C), which the C executor reads too:
``state.grad_enabled``, ``state.grad_priced`` (a recorded forward runs),
``state.want`` (where a backward rule's outputs go), ``state.checks``,
``state.log_debug``, ``state.gather_report``, ``state.implicit_replication``,
``state.backward``; and, derived from them, ``tracing`` (some debugging tool
listens, so operations emit trace events). What only Python uses (the
handlers of loss_parallel and context parallelism, the entered CommDebugModes
and DebugModes, the collective checker) is kept here beside them.

Every function here is Local: modes are per process, and every rank of an SPMD
program enters and leaves them alike.
"""

from __future__ import annotations

from . import _C, _clib


class _State(_clib.struct("mt_ext_modes")):
    """The modes in force, held once: the C executor reads these very fields.

    ``grad_enabled``: operations on DTensors that require grad are recorded.
    ``backward``: autograd's engine is running a backward pass. ``checks``:
    collective mismatch checks (mpitensor.debug). ``log_debug``, ``log_info``: the
    mpitensor logger is at DEBUG, or INFO (gathers are logged).
    ``gather_warning``: gathers an operation needs warn (set_gather_warning).
    ``grad_priced``: a recorded forward runs, so decisions price its inputs'
    gradients. ``want``: the DTensor whose gradient a backward rule computes (its
    operations' outputs are headed to its layout), or None.
    ``implicit_replication``: depth of implicit_replication() blocks.
    ``listeners``: entered CommDebugModes and DebugModes; ``recorders``: the
    DebugModes alone. ``copy_views``: the
    records of live copy-views by memory (mpitensor._algorithms._views's dict)."""

    __slots__ = ()

    @property
    def gather_report(self) -> bool:
        """Gathers an operation needs are reported."""
        return self.gather_warning or self.log_info

    @property
    def events(self) -> bool:
        """The executor emits trace events."""
        return tracing or self.log_info


state = _clib.exported(_C.MODES, "mpitensor._C.modes", _State)
# Some tool listens: checks, debug logs, a gather warning, a CommDebugMode or a
# DebugMode. A plain module attribute, which every operation reads (``if
# _modes.tracing:``), kept by _retrace whenever a field it follows changes: read
# from the struct it would cost each operation four field reads.
tracing = False


def _retrace() -> None:
    global tracing
    tracing = bool(state.checks or state.log_debug or state.gather_warning
                   or state.listeners > 0)


# -- implicit_replication --------------------------------------------------------------

def push_implicit_replication() -> None:
    """Enters one implicit_replication block: plain ndarrays mixed with DTensors
    count as Replicate while one is open. Example: see experimental._implicit."""
    state.implicit_replication += 1


def pop_implicit_replication() -> None:
    """Leaves the innermost implicit_replication block."""
    state.implicit_replication -= 1


# -- handlers: loss_parallel, context parallelism ----------------------------------------
# Each entry is the object the innermost block installed; the code that consults
# the mode calls it rather than knowing the feature.
_loss_parallel: list = []
_context_parallel: list = []


def push_loss_parallel(cross_entropy) -> None:
    """Enters a loss_parallel block: ``cross_entropy(input, target, weight,
    ignore_index, reduction, label_smoothing)`` computes nn.functional.cross_entropy on DTensor
    logits inside it."""
    _loss_parallel.append(cross_entropy)


def pop_loss_parallel() -> None:
    _loss_parallel.pop()


def loss_parallel():
    """The cross entropy of the innermost loss_parallel block, or None outside.

    Example: ``handler = _modes.loss_parallel(); if handler: return handler(...)``.
    """
    return _loss_parallel[-1] if _loss_parallel else None


def push_context_parallel(mode) -> None:
    """Enters a context_parallel block. ``mode.mesh`` is its mesh and
    ``mode.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)`` runs
    scaled dot-product attention over the sequence shards."""
    _context_parallel.append(mode)


def pop_context_parallel() -> None:
    _context_parallel.pop()


def context_parallel():
    """The innermost context_parallel block's mode, or None outside any.

    Example: ``cp = _modes.context_parallel(); if cp: return cp.sdpa(q, k, v, ...)``.
    """
    return _context_parallel[-1] if _context_parallel else None


# -- gather warnings -------------------------------------------------------------------

def set_gather_warning(enabled: bool) -> bool:
    """Turns on (or off) a ``UserWarning`` on every rank each time a NumPy operation
    on DTensors gathers a sharded dim it cannot work on in pieces (the operations
    marked **gathered** in the user guide); returns the previous setting. Local:
    call it alike on every rank. The gathers are logged under
    ``MPITENSOR_LOGS=dtensor`` whether or not it is on.

    Example::

        >>> mpitensor.set_gather_warning(True)
        False
        >>> np.sort(dt, axis=0)   # dt [Shard(0), Shard(1)]: no free dim, so...
        UserWarning: numpy.sort gathers ...
    """
    was = state.gather_warning
    state.gather_warning = bool(enabled)
    _retrace()
    return was


# -- tracing: collective checks, debug logging, CommDebugMode ---------------------------
listeners: list = []  # entered CommDebugModes, innermost last
recorders: list = []  # entered DebugModes, innermost last
# checker(text, mesh): the collective agreement that debug registers; called before
# each collective while ``state.checks`` is on.
checker = None


def set_backward(active: bool) -> bool:
    """Enters or leaves a backward pass; returns the previous state. The listeners
    first settle what ran before, so each collective lands on its side.

    Example: ``was = set_backward(True)`` ... ``set_backward(was)``.
    """
    for listener in listeners:
        listener._settle()
    was = state.backward
    state.backward = bool(active)
    return was


def set_checks(enabled: bool) -> None:
    """Collective mismatch checks on or off (mpitensor.debug.set_collective_checks)."""
    if enabled and checker is None:
        raise RuntimeError("no collective checker is registered; import mpitensor.debug")
    state.checks = bool(enabled)
    _retrace()


def register_checker(func) -> None:
    """Installs ``func(text, mesh)``, the agreement run before each checked collective."""
    global checker
    checker = func


def set_log_debug(enabled: bool) -> None:
    """Whether the hooks write debug log lines (mpitensor._logging)."""
    state.log_debug = bool(enabled)
    _retrace()


def set_log_info(enabled: bool) -> None:
    """Whether the gathers operations need are logged (mpitensor._logging)."""
    state.log_info = bool(enabled)


def add_listener(listener) -> None:
    """Adds an entered CommDebugMode; it is told of every traced operation: each
    decision appends ``(operation name, input specs)`` to its list ``_records``
    (an append, not a call: it sits on every traced operation); the rarer
    records call its methods (mpitensor._trace)."""
    listeners.append(listener)
    state.listeners = len(listeners) + len(recorders)
    _retrace()


def remove_listener(listener) -> None:
    if listener in listeners:
        listeners.remove(listener)
    state.listeners = len(listeners) + len(recorders)
    _retrace()


def add_recorder(recorder) -> None:
    """Adds an entered DebugMode: each trace event calls its method of the event's
    name with an underscore (``_decision``, ``_move``, ``_ran``, ``_collective``,
    ``_local``, ``_call_enter``, ``_call_exit``; mpitensor._trace).

    Example: ``add_recorder(mode)`` ... ``remove_recorder(mode)``.
    """
    recorders.append(recorder)
    state.listeners = len(listeners) + len(recorders)
    state.recorders = len(recorders)
    _retrace()


def remove_recorder(recorder) -> None:
    if recorder in recorders:
        recorders.remove(recorder)
    state.listeners = len(listeners) + len(recorders)
    state.recorders = len(recorders)
    _retrace()


# -- grad mode, autograd ------------------------------------------------------------------
# The engine of mpitensor.autograd, installed when it is imported: the ground
# floor's DTensor runs ``autograd.backward(tensor, gradient, retain_graph)``.
autograd = None


def set_grad_enabled(enabled: bool) -> bool:
    """Sets grad mode; returns the previous one. Example: ``was = set_grad_enabled(False)``."""
    was = state.grad_enabled
    state.grad_enabled = bool(enabled)
    return was


def set_want(target):
    """Sets the DTensor whose gradient a backward rule is computing (None: none):
    the operations it runs are decided knowing their output goes to that
    DTensor's placements next. Returns the previous one.

    Example: ``was = set_want(x); ...; set_want(was)``.
    """
    was = state.want
    state.want = target
    return was


def install_autograd(engine) -> None:
    """Installs the autograd engine (mpitensor.autograd does, at import)."""
    global autograd
    autograd = engine
