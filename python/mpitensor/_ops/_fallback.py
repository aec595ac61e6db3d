"""The one fallback: a NumPy call that has no distributed rule runs on the gathered
arrays, so that every call NumPy accepts answers with NumPy's value on every rank.

Every DTensor among the arguments (nested in lists, tuples and dicts too) is
gathered whole on every rank of its mesh (a redistribute to Replicate, which
CommDebugMode counts like any other), NumPy runs once per rank on the gathered
arrays, and every ndarray of the result comes back as a Replicate DTensor on that
mesh; scalars, strings and other objects come back as NumPy gives them. A
``GatherWarning`` names the function and the bytes each rank received, once per
function per process; the trace (collective checks, logs, CommDebugMode's
operations) names it on every call.

Before anything moves, the ranks agree (one small all-reduce) that they call the
same function and that every rank can hold the gathered arrays: a gather that would
not fit in memory is a MemoryError on every rank. ``MPITENSOR_STRICT=1`` or
``with mpitensor.strict():`` turns the fallback off, as torch's strictness: the
call is then a TypeError that names the function.

Writers (``numpy.save``, ``savez``, ``savez_compressed``, ``savetxt``), which come
here for what their rules do not write in parts (a file object), run on the
mesh's first rank only, so that one file is written once. What NumPy writes into
(an ``out=`` DTensor, the first argument of ``ufunc.at``, ``np.put``,
``np.copyto``, ...) is written back into the DTensor, each rank its own part.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import warnings

import numpy as np

from .. import _comm, _modes, _registry, _trace
from .._dtensor import DTensor
from .._fingerprint import fingerprint
from .._call_agreement import call_fingerprint
from ..placement_types import Replicate
from . import _inplace

__all__ = ["GatherWarning", "strict"]


class GatherWarning(UserWarning):
    """A NumPy call on DTensors ran on gathered arrays: it has no distributed rule.
    Local: each rank warns for itself.

    Example: ``warnings.simplefilter("error", mpitensor.GatherWarning)`` makes every
    such gather an error, as ``mpitensor.strict()`` does before anything moves.
    """


_strict = threading.local()
_STRICT_ENV = os.environ.get("MPITENSOR_STRICT", "") not in ("", "0")
_warned: set = set()
_WRITERS = frozenset((np.save, np.savez, np.savez_compressed, np.savetxt))


def _is_strict() -> bool:
    return getattr(_strict, "depth", 0) > 0 or _STRICT_ENV


@contextlib.contextmanager
def strict():
    """Inside it, a NumPy call on DTensors that has no distributed rule raises
    TypeError, as in torch, instead of running on the gathered arrays (the default;
    ``MPITENSOR_STRICT=1`` makes strictness the default). Local: enter it alike on
    every rank.

    Example::

        >>> with mpitensor.strict():
        ...     np.kron(a, b)   # TypeError: numpy.kron has no sharding rule ...
    """
    _strict.depth = getattr(_strict, "depth", 0) + 1
    try:
        yield
    finally:
        _strict.depth -= 1


def _dtensors(obj, found: list) -> None:
    """Appends every DTensor in ``obj`` (nested in lists, tuples and dicts)."""
    if type(obj) is DTensor:
        found.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _dtensors(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _dtensors(item, found)


def _gathered(obj, whole: dict):
    """``obj`` with each DTensor replaced by its gathered array."""
    if type(obj) is DTensor:
        return whole[id(obj)]
    if isinstance(obj, (list, tuple)):
        items = [_gathered(item, whole) for item in obj]
        return type(obj)(items) if type(obj) in (list, tuple) else type(obj)(*items)
    if isinstance(obj, dict):
        return {k: _gathered(v, whole) for k, v in obj.items()}
    return obj


def _wrapped(obj, mesh):
    """``obj`` with each ndarray or NumPy scalar of a dtype a DTensor holds made a
    Replicate DTensor on ``mesh`` (a scalar a 0-d one, as a reduction of DTensors
    gives)."""
    if isinstance(obj, np.generic) and obj.dtype.kind in "biufc" and obj.dtype.isnative:
        obj = np.asarray(obj)
    if type(obj) is np.ndarray and (obj.dtype.kind in "biufc") and obj.dtype.isnative:
        local = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
        return DTensor.from_local(local, mesh, [Replicate()] * mesh.ndim)
    if isinstance(obj, (list, tuple)):
        items = [_wrapped(item, mesh) for item in obj]
        return type(obj)(items) if type(obj) in (list, tuple) else type(obj)(*items)
    return obj


def _available_bytes() -> int:
    """The memory this process may still take: MemAvailable, else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 2**62


def gather_call(func, args: tuple, kwargs: dict, name: str | None = None,
                cause: Exception | None = None):
    """``func(*args, **kwargs)`` on the gathered DTensors among the arguments, its
    arrays returned as Replicate DTensors (``out=`` DTensors and the array a NumPy
    function writes in place are written back). ``cause``: the NoRule that the
    function's rule raised, raised again under strictness. Collective on the
    DTensors' mesh.

    Example: ``gather_call(np.kron, (a, b), {})`` is ``np.kron`` of the whole arrays,
    replicated.
    """
    name = name or _registry.qualified_name(func)
    found: list = []
    _dtensors(args, found)
    _dtensors(kwargs, found)
    if _is_strict() or not found:
        raise cause or _registry.no_rule(name)
    mesh = found[0].device_mesh
    for t in found[1:]:
        if t.device_mesh != mesh:
            raise _registry.mesh_error(name, mesh, t.device_mesh)
    if _modes.state.grad_enabled and any(t.requires_grad for t in found):
        raise NotImplementedError(
            f"{name} has no distributed rule and no backward rule in mpitensor.autograd; "
            "run it under mpitensor.no_grad() or on .detach()ed DTensors (the gradient "
            "through it would be lost)")
    unique = {id(t): t for t in found}
    need = sum(t.size * t.dtype.itemsize for t in unique.values())
    if mesh.get_coordinate() is not None:
        # One call, one gather: every rank must make the same one and hold its result.
        _comm.agree(
            mesh, need <= _available_bytes(),
            fingerprint((need, call_fingerprint(name, args, kwargs))),
            f"{name}: the ranks of the mesh made different calls (other functions or "
            f"arguments, or DTensors of other placements, shapes or dtypes)" if need <= _available_bytes() else
            f"{name} runs on the gathered arrays ({need} bytes on each rank), and a rank "
            f"of the mesh has not that much memory available", MemoryError)
    if _modes.tracing:
        _trace.collective(f"{name} (gathered: no distributed rule)", mesh, None, None, None)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"{name} has no distributed rule in mpitensor: its DTensor arguments were "
            f"gathered on every rank ({need} bytes each) and NumPy ran on the whole "
            f"arrays; the result is replicated (this warning comes once per function; "
            f"mpitensor.strict() makes such calls a TypeError)", GatherWarning,
            stacklevel=_program_level())
    # Copies: NumPy may write into them (out=, in-place functions), and a local
    # array of a Replicate DTensor is that DTensor's own.
    whole = {k: np.array(t.redistribute(mesh, [Replicate()] * mesh.ndim).to_local())
             for k, t in unique.items()}
    plain_args, plain_kwargs = _gathered(args, whole), _gathered(kwargs, whole)
    if func in _WRITERS:
        return _write_once(mesh, func, plain_args, plain_kwargs, name)
    result = func(*plain_args, **plain_kwargs)
    out = _out_of(func, args, kwargs)
    written = _written(func, name, args, out)
    for target in written:
        _inplace.write_result(name, target, _wrapped(whole[id(target)], mesh))
    if out is not None:
        # NumPy returns what it wrote into: the DTensors written back above, or the
        # caller's own ndarrays. A ufunc's out= arrives as a tuple, and a one-output
        # ufunc returns the array.
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out
    return _wrapped(result, mesh)


def _out_of(func, args: tuple, kwargs: dict):
    """The call's ``out=``, given by keyword or in its place among the positional
    arguments (``np.round(a, 1, o)``, ``dt.round(1, o)``, ``np.add(a, b, o)``)."""
    if "out" in kwargs:
        return kwargs["out"]
    if isinstance(func, np.ufunc):
        return tuple(args[func.nin:]) or None
    at = _out_position(func)
    return args[at] if at is not None and at < len(args) else None


@functools.cache
def _out_position(func) -> int | None:
    """Where ``out`` stands among ``func``'s positional parameters, if it does."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    for k, p in enumerate(params):
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return None
        if p.name == "out":
            return k
    return None


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _program_level() -> int:
    """The stacklevel, for its caller's warnings.warn, of the first frame outside
    mpitensor: the warning names the line of the program (or library) that made
    the call, whichever of mpitensor's doors it came through."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level += 1
        frame = frame.f_back
    return level


def _written(func, name: str, args: tuple, out) -> list:
    """The DTensors that NumPy wrote into on the gathered copies: ``out``'s, and
    the first argument of an in-place function (``ufunc.at``, ``np.put``, ...)."""
    targets = list(out) if isinstance(out, tuple) else [out]
    # A function that writes into its first argument is registered with no
    # backward (autograd's table of writes), the table the executor reads too.
    writer = _registry.backwards.get(func, (None, True))[1] is None
    if (writer or name.endswith(".at")) and args:
        targets.append(args[0])
    return [t for t in targets if type(t) is DTensor]


def _write_once(mesh, func, args, kwargs, name):
    """A NumPy writer on the mesh's first rank only, its failure every rank's."""
    first = mesh.get_coordinate() is None or not any(mesh.get_coordinate())
    error = None
    if first:
        try:
            func(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - travels to every rank below
            error = e
    if mesh.get_coordinate() is not None:
        _comm.agree(mesh, error is None, 0,
                    f"{name}: {error}" if error is not None else "",
                    type(error) if error is not None else ValueError)
    elif error is not None:
        raise error
    return None


_registry.fallback = gather_call
