"""NumPy functions that are not ufuncs but answer element by element, on DTensors:
``np.angle``, ``np.fix``, ``np.i0``, ``np.sinc``, ``np.iscomplex``, ``np.isreal``,
``np.isneginf``, ``np.isposinf``, ``np.nan_to_num``, ``np.astype``,
``np.digitize`` (with bins every rank holds alike), ``np.piecewise`` (constant
pieces), ``np.real_if_close`` (one flag reduced over the mesh), and
``np.linspace``, ``np.logspace`` and ``np.geomspace`` between DTensor endpoints
(each sequence is its own pair's).

Each runs NumPy's own function on every rank's block, so each element is NumPy's
value, bit for bit, and the output keeps the input's Shard, strided shard and
Replicate placements without communicating (a strided input is read as its
plain expansion and the result read back, ``_strided.on_expansion``). None of
them is linear, so a Partial input is reduced first. The result's dtype and
NumPy's errors for a dtype come from one call on a one-element stand-in of the
input's dtype, made on every rank before anything runs: a rank whose block is
empty would otherwise answer with another dtype, or not raise while the others
do.
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from ..placement_types import Replicate
from .._algorithms import _dispatch as D
from ._select import _everywhere, _run_elementwise, astype as _astype
from ._strided import is_strided, on_expansion

__all__ = ["angle", "fix", "i0", "sinc", "iscomplex", "isreal", "isneginf", "isposinf",
           "nan_to_num", "astype", "digitize", "piecewise", "real_if_close", "linspace", "logspace", "geomspace"]


def _dtensor(name, x):
    if type(x) is not DTensor:
        if isinstance(x, np.ndarray):
            raise D.mixed_error(name, x)
        raise TypeError(f"{name}: expected a DTensor, got {type(x).__name__}")
    return x


def per_element(name, key, x, func):
    """``func`` of each rank's block of the DTensor ``x``, cast to the dtype ``func``
    gives for ``x``'s dtype; Shard and Replicate kept, a Partial reduced first.
    Local unless ``x`` has a Partial.

    Example: ``per_element("numpy.fix", ("fix",), dt, np.fix)``.
    """
    x = _dtensor(name, x)
    if is_strided(x):
        return on_expansion(x, lambda e: per_element(name, key, e, func), reduce=True)
    dtype = np.asarray(func(np.zeros(1, x.dtype))).dtype
    return _run_elementwise(name, key, (x,), lambda v: np.asarray(func(v), dtype))


def _no_out(name, out):
    if out is not None:
        raise _registry.NoRule(f"{name}: out= is not supported on DTensors")


@_registry.implements(np.angle, takes_strided=True)
def angle(z, deg=False):
    """``np.angle`` of a DTensor, element by element. Local for Shard and Replicate.

    Example: ``np.angle(dt, deg=True)``.
    """
    deg = bool(deg)
    return per_element("numpy.angle", ("angle", deg), z, lambda v: np.angle(v, deg))


@_registry.implements(np.fix, takes_strided=True)
def fix(x, out=None):
    """``np.fix`` of a DTensor (rounding toward zero). Local for Shard and Replicate.

    Example: ``np.fix(dt)``.
    """
    _no_out("numpy.fix", out)
    return per_element("numpy.fix", ("fix",), x, np.fix)


@_registry.implements(np.i0, takes_strided=True)
def i0(x):
    """``np.i0`` of a DTensor (the modified Bessel function of order 0), NumPy's
    TypeError for complex values. Local for Shard and Replicate.

    Example: ``np.i0(dt)``.
    """
    return per_element("numpy.i0", ("i0",), x, np.i0)


@_registry.implements(np.sinc, takes_strided=True)
def sinc(x):
    """``np.sinc`` of a DTensor. Local for Shard and Replicate.

    Example: ``np.sinc(dt)``.
    """
    return per_element("numpy.sinc", ("sinc",), x, np.sinc)


@_registry.implements(np.iscomplex, takes_strided=True)
def iscomplex(x):
    """``np.iscomplex`` of a DTensor: a bool DTensor of its layout. Local for Shard
    and Replicate.

    Example: ``np.iscomplex(dt).any()``.
    """
    return per_element("numpy.iscomplex", ("iscomplex",), x, np.iscomplex)


@_registry.implements(np.isreal, takes_strided=True)
def isreal(x):
    """``np.isreal`` of a DTensor: a bool DTensor of its layout. Local for Shard and
    Replicate.

    Example: ``np.isreal(dt).all()``.
    """
    return per_element("numpy.isreal", ("isreal",), x, np.isreal)


@_registry.implements(np.isneginf, takes_strided=True)
def isneginf(x, out=None):
    """``np.isneginf`` of a DTensor; NumPy's TypeError for complex values. Local for
    Shard and Replicate.

    Example: ``np.isneginf(dt)``.
    """
    _no_out("numpy.isneginf", out)
    return per_element("numpy.isneginf", ("isneginf",), x, np.isneginf)


@_registry.implements(np.isposinf, takes_strided=True)
def isposinf(x, out=None):
    """``np.isposinf`` of a DTensor; NumPy's TypeError for complex values. Local for
    Shard and Replicate.

    Example: ``np.isposinf(dt)``.
    """
    _no_out("numpy.isposinf", out)
    return per_element("numpy.isposinf", ("isposinf",), x, np.isposinf)


@_registry.implements(np.nan_to_num, takes_strided=True)
def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """``np.nan_to_num`` of a DTensor with scalar replacements; ``copy=False``
    writes into ``x`` and returns it, as NumPy. Local for Shard and Replicate.

    Example: ``np.nan_to_num(dt, posinf=1e300)``.
    """
    name = "numpy.nan_to_num"
    x = _dtensor(name, x)
    for v in (nan, posinf, neginf):
        if v is not None and not D.is_scalar(v):
            raise _registry.NoRule(f"{name}: replacements that are arrays are not "
                                   f"supported on DTensors")
    if not copy and x.dtype.kind not in "fc":
        return x  # NumPy returns the array itself: nothing to replace
    result = per_element(name, ("nan_to_num", nan, posinf, neginf), x,
                         lambda v: np.nan_to_num(v, nan=nan, posinf=posinf, neginf=neginf))
    if copy:
        return result
    # The write rule keeps a Partial destination's placements (the value on one
    # rank of its mesh dim, the op's identity on the others).
    x[...] = result
    return x


@_registry.implements(np.astype, takes_strided=True)
def astype(x, dtype, /, *, copy=True, device=None):
    """``np.astype`` of a DTensor: ``DTensor.astype``, placements kept (a Partial
    only where the cast keeps its sum exact). Local unless a Partial must be
    reduced.

    Example: ``np.astype(dt, np.float32)``.
    """
    name = "numpy.astype"
    x = _dtensor(name, x)
    if device not in (None, "cpu"):
        raise ValueError(f'Device not understood. Only "cpu" is allowed, but received: '
                         f'{device}')
    return _astype(x, dtype, copy=bool(copy))


@_registry.implements(np.piecewise)
def piecewise(x, condlist, funclist, *args, **kw):
    """``np.piecewise`` of a DTensor with DTensor conditions of its shape and
    constant pieces: NumPy's own piecewise on every rank's blocks, placed as the
    elementwise rule places ``x`` with the conditions. A callable piece is NumPy's
    call on the selected values of the whole array, which no rank holds (the
    function need not work element by element), so it goes to the fallback.
    Local when the conditions are laid out as ``x``.

    Example: ``np.piecewise(dt, [dt < 0, dt > 5], [-1.0, 1.0, 0.0])``.
    """
    name = "numpy.piecewise"
    x = _dtensor(name, x)
    funcs = tuple(funclist)
    if any(callable(f) for f in funcs):
        raise _registry.NoRule(f"{name}: a callable piece sees the selected values of the "
                               f"whole array; only constant pieces have a distributed rule")
    if type(condlist) is DTensor:
        # NumPy takes one condition of one dim as a list of it, and the rows of one
        # of more dims as the conditions.
        if condlist.ndim != 1 or x.ndim == 0:
            raise _registry.NoRule(f"{name}: a condition of {condlist.ndim} dims as the "
                                   f"list of its rows has no distributed rule")
        condlist = [condlist]
    conds = list(condlist)
    if not conds or any(type(c) is not DTensor or c.shape != x.shape for c in conds):
        raise _registry.NoRule(f"{name}: conditions other than DTensors of x's shape have "
                               f"no distributed rule")
    if len(conds) + 1 > D.MAX_INPUTS:
        raise _registry.NoRule(f"{name}: at most {D.MAX_INPUTS - 1} conditions on DTensors")
    n = len(conds)
    if len(funcs) not in (n, n + 1):
        raise ValueError(f"with {n} condition(s), either {n} or {n + 1} functions are "
                         f"expected")
    for f in funcs:
        if not D.is_scalar(f):
            raise _registry.NoRule(f"{name}: pieces that are arrays have no distributed rule")
    D.same_mesh(name, [x, *conds])
    return _run_elementwise(
        name, ("piecewise", n, funcs), (x, *conds),
        lambda v, *cs: np.piecewise(v, [np.asarray(c, bool) for c in cs], list(funcs)))


def _spaced(func, name, start, stop, num, axis, **kwargs):
    """``func`` (linspace, logspace, geomspace) of DTensor ``start`` and ``stop``:
    each sequence depends only on its own pair of endpoints, so NumPy's function
    runs on every rank's blocks, the new dim of length ``num`` whole on every rank
    and the others placed as the endpoints. The endpoints are DTensors of one shape
    or scalars; NumPy's dtype and errors come from a call on one-element stand-ins
    first."""
    operands = D.implicit((start, stop))
    dts = [o for o in operands if type(o) is DTensor]
    if any(type(o) is not DTensor and not D.is_scalar(o) for o in operands):
        raise _registry.NoRule(f"{name}: endpoints that are not DTensors or scalars have "
                               f"no distributed rule")
    shape = dts[0].shape
    if any(o.shape != shape for o in dts):
        raise _registry.NoRule(f"{name}: endpoints of different shapes (broadcast) have no "
                               f"distributed rule")
    D.same_mesh(name, dts)
    n = len(shape)
    num = operator.index(num)
    ax = normalize_axis_index(operator.index(axis), n + 1)
    stand = [np.ones((1,) * n, o.dtype) if type(o) is DTensor else o for o in operands]
    dtype = np.asarray(func(*stand, num=num, axis=ax, **kwargs)).dtype

    def build():
        out = list(range(n))
        out.insert(ax, n)
        return D.dimmap([range(n)] * len(dts), out, [D.KEEP] * n + [D.REPLICATE],
                        sizes={n: num})

    return D.execute((name, num, ax, tuple(type(o) is DTensor for o in operands),
                      tuple(o for o in operands if type(o) is not DTensor),
                      tuple(sorted(kwargs.items()))), dts, build,
                     lambda *ls: _spaced_local(func, operands, ls, num, ax, dtype, kwargs))


def _spaced_local(func, operands, locals_, num, ax, dtype, kwargs):
    it = iter(locals_)
    args = [next(it) if type(o) is DTensor else o for o in operands]
    return np.ascontiguousarray(func(*args, num=num, axis=ax, **kwargs), dtype)


@_registry.implements(np.linspace)
def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0, *,
             device=None):
    """``np.linspace`` between DTensor endpoints: one sequence per pair, made on the
    rank that holds the pair; the new dim whole on every rank, the others placed
    as the endpoints. Local.

    Example: ``np.linspace(lo, hi, 5, axis=-1)`` of ``(n,)`` DTensors is ``(n, 5)``.
    """
    if retstep:
        raise _registry.NoRule("numpy.linspace: retstep=True has no distributed rule")
    if device not in (None, "cpu"):
        raise ValueError(f'Device not understood. Only "cpu" is allowed, but received: '
                         f'{device}')
    return _spaced(np.linspace, "numpy.linspace", start, stop, num, axis,
                   endpoint=bool(endpoint), dtype=dtype)


@_registry.implements(np.logspace)
def logspace(start, stop, num=50, endpoint=True, base=10.0, dtype=None, axis=0):
    """``np.logspace`` between DTensor endpoints (a scalar ``base``), as
    ``np.linspace``'s rule. Local.

    Example: ``np.logspace(lo, hi, 4, base=2.0)``.
    """
    if not D.is_scalar(base):
        raise _registry.NoRule("numpy.logspace: an array base has no distributed rule")
    return _spaced(np.logspace, "numpy.logspace", start, stop, num, axis,
                   endpoint=bool(endpoint), base=base, dtype=dtype)


@_registry.implements(np.geomspace)
def geomspace(start, stop, num=50, endpoint=True, dtype=None, axis=0):
    """``np.geomspace`` between DTensor endpoints, as ``np.linspace``'s rule; NumPy's
    ValueError for a zero endpoint on every rank, agreed by one all-reduce of a
    flag. Collective on the mesh.

    Example: ``np.geomspace(lo, hi, 8, axis=1)``.
    """
    name = "numpy.geomspace"
    ends = []
    for o in D.implicit((start, stop)):
        if type(o) is DTensor:
            pls = o._spec.placements
            o = D.relayout(name, o, [Replicate() if p.is_partial() else p for p in pls])
        ends.append(o)
    start, stop = ends
    dts = [o for o in ends if type(o) is DTensor]
    if dts:
        nonzero = all(bool(np.all(o.to_local() != 0)) for o in dts)
        if not _everywhere(dts[0].device_mesh, nonzero):
            raise ValueError("Geometric sequence cannot include zero")
    return _spaced(np.geomspace, "numpy.geomspace", start, stop, num, axis,
                   endpoint=bool(endpoint), dtype=dtype)


def _replicated_bins(name, bins, mesh):
    """``bins`` as the plain array every rank holds: a DTensor is made Replicate
    (it is small beside ``x``: the bins, never the data, move)."""
    if type(bins) is DTensor:
        if bins._spec.mesh != mesh:
            raise _registry.mesh_error(name, mesh, bins._spec.mesh)
        return D.relayout(name, bins, [Replicate()] * mesh.ndim).to_local()
    return np.asarray(bins)


@_registry.implements(np.digitize)
def digitize(x, bins, right=False):
    """``np.digitize`` of a DTensor ``x`` with ``bins`` that every rank passes alike
    (a plain array, or a DTensor made Replicate first): each rank bins its own
    block, the output placed as ``x``; NumPy's errors for complex ``x`` and bins
    that are not monotonic on every rank. Local when the bins are plain or
    Replicate.

    Example: ``np.digitize(dt, np.array([0.0, 1.0, 2.5]))``.
    """
    name = "numpy.digitize"
    x = _dtensor(name, D.implicit((x, bins))[0])
    bins = _replicated_bins(name, bins, x.device_mesh)
    right = bool(right)
    return per_element(name, ("digitize", bins.tobytes(), bins.shape, bins.dtype.str, right),
                       x, lambda v: np.digitize(v, bins, right))


@_registry.implements(np.real_if_close)
def real_if_close(a, tol=100):
    """``np.real_if_close`` of a DTensor: its real part when every imaginary part is
    below the tolerance, found locally and agreed by one all-reduce of a flag;
    else ``a``. Collective on the mesh for complex values.

    Example: ``np.real_if_close(dt + 0j).dtype == np.float64``.
    """
    name = "numpy.real_if_close"
    a = _dtensor(name, a)
    if a.dtype.kind != "c":
        return a
    if tol > 1:
        tol = np.finfo(a.dtype).eps * tol
    if any(p.is_partial() for p in a.placements):
        a = D.relayout(name, a, [Replicate() if p.is_partial() else p for p in a.placements])
    small = bool(np.all(np.absolute(a.to_local().imag) < tol))
    return np.real(a) if _everywhere(a.device_mesh, small) else a
