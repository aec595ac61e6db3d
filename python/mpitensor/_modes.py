"""The modes in force: what upper floors switch on and lower floors consult.

A feature that changes how lower code behaves while it is active (implicit
replication, loss_parallel, context parallelism, the debugging tools, grad mode)
pushes its state here; the code that must honour it reads it here. So a lower
module never imports a feature to ask whether it is active, and the C dispatch
reads one flag word instead of the Python state (``_C.set_modes``).

Every function here is Local: modes are per process, and every rank of an SPMD
program enters and leaves them alike.
"""

from __future__ import annotations

from . import _C

# -- implicit_replication --------------------------------------------------------------
# Nesting depth of mpitensor.experimental.implicit_replication(); plain ndarrays
# mixed with DTensors count as Replicate while it is positive.
implicit_replication = 0


def push_implicit_replication() -> None:
    """Enters one implicit_replication block. Example: see experimental._implicit."""
    global implicit_replication
    implicit_replication += 1


def pop_implicit_replication() -> None:
    """Leaves the innermost implicit_replication block."""
    global implicit_replication
    implicit_replication -= 1


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
# Whether an operation that must gather a sharded dim (the table in the user guide)
# warns; every such gather is logged at INFO whatever this says.
gather_warning = False


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
    global gather_warning
    was, gather_warning = gather_warning, bool(enabled)
    _publish()
    return was


# -- tracing: collective checks, debug logging, CommDebugMode ---------------------------
# ``tracing`` is read at every hook site (mpitensor._trace): True while any of the
# three listens. While it is set the C dispatch sends every operation through the
# Python entry, where the hooks are.
tracing = False
checks = False  # collective mismatch detection
log_debug = False  # the mpitensor logger is at DEBUG
log_info = False  # ... or at INFO: the gathers operations need are logged
# Whether a gather an operation needs is reported (logged or warned). Logging at
# INFO sees the gathers of the Python paths at no cost elsewhere; the warning, asked
# for explicitly, sets ``tracing`` so that the C fast path's decisions pass a hook too.
gather_report = False
listeners: list = []  # entered CommDebugModes, innermost last
# checker(text, mesh): the collective agreement that debug registers; called before
# each collective while ``checks`` is on.
checker = None

# -- grad mode, autograd ------------------------------------------------------------------
# Whether operations record for autograd (torch.is_grad_enabled()); C reads it
# through the flag word: a DTensor that requires grad takes the Python entry only
# while it is on.
grad_enabled = True
# The engine of mpitensor.autograd, installed when it is imported: the ground
# floor's DTensor records its own differentiable methods (redistribute, from_local,
# to_local) with ``autograd.record(name, output, inputs, backward)`` and runs
# ``autograd.backward(tensor, gradient, retain_graph)``.
autograd = None


# True while autograd's engine runs a backward: CommDebugMode files what runs then
# under "backward".
backward = False


def set_backward(active: bool) -> bool:
    """Enters or leaves a backward pass; returns the previous state. The listeners
    first settle what ran before, so each collective lands on its side.

    Example: ``was = set_backward(True)`` ... ``set_backward(was)``.
    """
    global backward
    for listener in listeners:
        listener._settle()
    was, backward = backward, bool(active)
    return was


def install_autograd(engine) -> None:
    """Installs the autograd engine (mpitensor.autograd does, at import)."""
    global autograd
    autograd = engine


def _publish() -> None:
    global tracing, gather_report
    gather_report = gather_warning or log_info
    tracing = checks or log_debug or bool(listeners) or gather_warning
    _C.set_modes(tracing, grad_enabled)


def set_checks(enabled: bool) -> None:
    """Collective mismatch checks on or off (mpitensor.debug.set_collective_checks)."""
    global checks
    if enabled and checker is None:
        raise RuntimeError("no collective checker is registered; import mpitensor.debug")
    checks = bool(enabled)
    _publish()


def register_checker(func) -> None:
    """Installs ``func(text, mesh)``, the agreement run before each checked collective."""
    global checker
    checker = func


def set_log_debug(enabled: bool) -> None:
    """Whether the hooks write debug log lines (mpitensor._logging)."""
    global log_debug
    log_debug = bool(enabled)
    _publish()


def set_log_info(enabled: bool) -> None:
    """Whether the gathers operations need are logged (mpitensor._logging)."""
    global log_info
    log_info = bool(enabled)
    _publish()


def add_listener(listener) -> None:
    """Adds an entered CommDebugMode; it is told of every traced operation."""
    listeners.append(listener)
    _publish()


def remove_listener(listener) -> None:
    if listener in listeners:
        listeners.remove(listener)
    _publish()


def set_grad_enabled(enabled: bool) -> bool:
    """Sets grad mode; returns the previous one. Example: ``was = set_grad_enabled(False)``."""
    global grad_enabled
    was, grad_enabled = grad_enabled, bool(enabled)
    if was != grad_enabled:  # tracing does not depend on it: only C must learn
        _C.set_modes(tracing, grad_enabled)
    return was


_publish()
