"""Every rank makes the same NumPy call.

A NumPy function on DTensors is a call every rank of the mesh makes (as every op
on a torch DTensor is). A program whose ranks pass different arguments (another
``axis=``, a ``bins=`` array computed per rank, an argument that is invalid on one
rank only) would otherwise pair one rank's collectives with another call's, or
leave the others waiting in a collective the odd rank never enters. So before a
registered NumPy function runs, the ranks agree (one small all-reduce, the
agreement primitive) on a fingerprint of the call: the function, each DTensor's
placements, global shape and dtype, and the value of every other argument. Once
they agree, every check the rule makes sees the same arguments on every rank and
fails on every rank alike; a difference is a ValueError on every rank, before
anything moves, and the next call pairs.

Only the call a program makes is agreed: the calls mpitensor makes inside an
operation, a backward pass, an optimizer or a parallel style are made alike by
construction. Under the collective checks (``MPITENSOR_CHECK=1``) the checker
compares the collectives instead. Operators, in place too, and plain ufunc calls
without keywords (``a + b``, ``x += y``, ``np.exp(a)``) take the executor's fast
path and are not agreed: their arguments are DTensors and scalars the dispatch
itself checks.
"""

from __future__ import annotations

from . import _C, _modes

__all__ = ["agree_call", "call_fingerprint", "agreed_call", "PROGRAM", "CONTIGUOUS",
           "RAISES", "CALL_FLAGS", "PLAIN", "CALL_STRIDED", "CALL_GRAD", "CALL_MESHES",
           "CALL_PLAIN"]

# The flags agree_call returns: a program made the call (not mpitensor, whose own
# calls are alike on every rank by construction); every DTensor argument holds a
# C-contiguous local array on every rank (where NumPy's view of a local array is
# one on every rank, no further all-reduce need ask); a program made it while
# NumPy's error state raises (or calls a function) on some floating-point error,
# so that the door agrees on the call's errors too; and, from bit CALL_FLAGS on,
# ``_C.call_flags`` of the arguments, which the door would ask next (among them
# whether a plain numeric ndarray, which the call takes as replicated once agreed,
# is an argument).
PROGRAM, CONTIGUOUS, RAISES, CALL_FLAGS = 1, 2, 4, 3
# The bits of ``_C.call_flags``: an argument is strided, needs a gradient, lives on
# another mesh of the same ranks, or is a plain numeric ndarray; the last as
# agree_call returns it.
CALL_STRIDED, CALL_GRAD, CALL_MESHES, CALL_PLAIN = 1, 2, 4, 8
PLAIN = CALL_PLAIN << CALL_FLAGS


# agree_call(name, args, kwargs, caller) -> flags: agrees on the call
# ``name(*args, **kwargs)`` that the frame ``caller`` makes on DTensors, when a
# program makes it (not mpitensor: a frame of the package outside the array API
# namespace and mpitensor.testing) on a mesh of more than one rank, outside the
# collective checks: ValueError on every rank of the mesh when the calls differ.
# The doors of NumPy's calls (mpitensor._registry.door, the ufuncs' Python entry,
# the C reduction methods) call it first; it returns the flags above.
# Collective on the mesh of the first DTensor argument when it agrees. All of it
# is one C call, which every call a program makes pays for. Example:
# ``agree_call("numpy.sum", (dt,), {"axis": 0}, sys._getframe(1))``.
agree_call = _C.agree_call


def agreed_call(name: str, args: tuple, kwargs: dict, caller, run, *run_args, **run_kwargs):
    """``run(*run_args, **run_kwargs)``, the call ``name(*args, **kwargs)`` that the
    frame ``caller`` makes, once the ranks agree on it (:func:`agree_call`), with
    each plain ndarray beside its DTensors taken as replicated on their mesh, as
    NumPy's libraries mix them (``classes == np.asarray([0, 1])``): the agreement
    compares the ndarrays' bytes, so every rank holds the same one, or every rank
    raises ValueError before anything moves. Collective on the mesh of the first
    DTensor argument.

    Example: ``agreed_call("numpy.dot", (dt, w), {}, sys._getframe(1), np.dot, dt, w)``.
    """
    if not agree_call(name, args, kwargs, caller) & PLAIN:
        return run(*run_args, **run_kwargs)
    _modes.push_implicit_replication()
    try:
        return run(*run_args, **run_kwargs)
    finally:
        _modes.pop_implicit_replication()


# call_fingerprint(name, args, kwargs) -> int: a fingerprint of the call, the same
# on every rank exactly when the calls are alike: DTensors by placements, global
# shape and dtype (their local values differ by rank), ndarrays by shape, dtype and
# bytes, anything else by value where it has a canonical one, by type otherwise.
# Local. Example: ``call_fingerprint("numpy.sum", (dt,), {"axis": 0})``.
call_fingerprint = _C.call_fingerprint
