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
compares the collectives instead. Operators and plain ufunc calls without
keywords (``a + b``, ``np.exp(a)``) take the executor's fast path and are not
agreed: their arguments are DTensors and scalars the dispatch itself checks.
"""

from __future__ import annotations

import numpy as np

from . import _C, _clib, _modes

__all__ = ["agree_call", "call_fingerprint", "agreed_call", "has_plain_array",
           "called_by_program"]

# Frames of these modules make the calls a program makes; the rest of the package
# makes its own calls alike on every rank.
_PACKAGE = __name__.rpartition(".")[0] + "."
_DOORS = (_PACKAGE + "array_api", _PACKAGE + "testing")


def agree_call(name: str, args: tuple, kwargs: dict, caller) -> None:
    """Agrees on the call ``name(*args, **kwargs)`` that the frame ``caller`` makes
    on DTensors, when a program makes it (not mpitensor) on a mesh of more than one
    rank: ValueError on every rank of the mesh when the calls differ. The doors of
    NumPy's calls (mpitensor._registry.door, the ufuncs' Python entry, the C
    reduction methods) call it first. Collective on the mesh of the first DTensor
    argument.

    Example: ``agree_call("numpy.sum", (dt,), {"axis": 0}, sys._getframe(1))``.
    """
    if _modes.state.checks or not called_by_program(caller):
        return
    mesh = _mesh_of(args) or _mesh_of(kwargs.values())
    if mesh is None or mesh._coordinate is None or mesh._mesh.size == 1:
        return
    # The mesh's check and the agreement in one C call: every call a program
    # makes pays for it.
    mesh._agree_call(call_fingerprint(name, args, kwargs), _message(name))


def _plain_array(v) -> bool:
    return type(v) is np.ndarray and v.ndim > 0 and v.dtype.kind in "biufc"


def has_plain_array(args: tuple, kwargs: dict) -> bool:
    """Whether a plain numeric ndarray (not 0-d) is among the arguments, or in a
    list or tuple one: the call takes it as replicated once agreed. Local.

    Example: ``has_plain_array((dt, np.ones(3)), {})`` is True.
    """
    return _any_plain(args) or (bool(kwargs) and _any_plain(kwargs.values()))


def _any_plain(values) -> bool:
    # Every call a program makes pays for this scan: the common arguments (DTensors,
    # scalars, None) are passed over by their type alone.
    for v in values:
        t = type(v)
        if t is np.ndarray:
            if _plain_array(v):
                return True
        elif (t is list or t is tuple) and any(map(_plain_array, v)):
            return True
    return False


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
    agree_call(name, args, kwargs, caller)
    if not has_plain_array(args, kwargs):
        return run(*run_args, **run_kwargs)
    _modes.push_implicit_replication()
    try:
        return run(*run_args, **run_kwargs)
    finally:
        _modes.pop_implicit_replication()


# The ValueError's text per function, encoded once: a call agreement must cost little.
_messages: dict = {}


def _message(name: str) -> bytes:
    text = _messages.get(name)
    if text is None:
        if len(_messages) > 4096:
            _messages.clear()
        text = _messages[name] = _clib.message(
            f"{name}: the ranks of the mesh made different calls (other arguments, or "
            f"DTensors of other placements, shapes or dtypes); every rank of the mesh "
            f"must make the same call")
    return text


def called_by_program(frame) -> bool:
    """Whether the frame ``frame`` is a program's (or the array API namespace's, on
    a program's behalf), not mpitensor's own. Local.

    Example: ``called_by_program(sys._getframe(1))``.
    """
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    return not module.startswith(_PACKAGE) or module.startswith(_DOORS)


def _mesh_of(values):
    """The mesh of the first DTensor among ``values`` (and in their lists and
    tuples), or None."""
    for v in values:
        if isinstance(v, _C.DTensorBase):
            return v._spec.mesh
        if type(v) in (list, tuple):
            mesh = _mesh_of(v)
            if mesh is not None:
                return mesh
    return None


def call_fingerprint(name: str, args: tuple, kwargs: dict) -> int:
    """A fingerprint of the call ``name(*args, **kwargs)``, the same on every rank
    exactly when the calls are alike: DTensors by placements, global shape and
    dtype (their local values differ by rank), ndarrays by shape, dtype and bytes,
    anything else by value where it has a canonical one, by type otherwise
    (``_C.call_fingerprint``). Local.

    Example: ``call_fingerprint("numpy.sum", (dt,), {"axis": 0})``.
    """
    return _C.call_fingerprint(name, args, kwargs)
