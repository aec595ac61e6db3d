"""The polynomial arithmetic of NumPy on DTensor coefficients: ``np.polyadd``,
``np.polysub``, ``np.polymul``, ``np.polyder`` and ``np.polyint``, as NumPy's own
steps (zeros prepended by ``concatenate``, ``add``/``subtract``, ``convolve``, a
slice times the powers, a division by them) run on the DTensors, each by its own
rule, so the coefficients are never gathered and the gradient flows through the
steps. Plain operands join as Replicate DTensors of the same mesh (NumPy's
``atleast_1d`` of them). ``poly1d`` operands go to the fallback.
"""

from __future__ import annotations

import operator

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from ..placement_types import Replicate

__all__ = ["polyadd", "polysub", "polymul", "polyder", "polyint"]


def _mesh(name, *xs):
    for x in xs:
        if isinstance(x, np.poly1d):
            raise _registry.NoRule(f"{name}: poly1d operands have no distributed rule")
    found = [x for x in xs if type(x) is DTensor]
    if not found:
        raise _registry.NoRule(f"{name}: the DTensor rule takes DTensor coefficients")
    return found[0].device_mesh


def _vector(x, mesh) -> DTensor:
    """``np.atleast_1d(x)`` as a DTensor of ``mesh`` (a plain ``x`` Replicate)."""
    if type(x) is not DTensor:
        x = DTensor.from_local(np.ascontiguousarray(np.atleast_1d(x)), mesh,
                               [Replicate()] * mesh.ndim)
    return np.atleast_1d(x)


def _plain(x, mesh) -> DTensor:
    return DTensor.from_local(np.ascontiguousarray(x), mesh, [Replicate()] * mesh.ndim)


def _padded(name, a1, a2, op):
    mesh = _mesh(name, a1, a2)
    a1, a2 = _vector(a1, mesh), _vector(a2, mesh)
    diff = a2.shape[0] - a1.shape[0]
    if diff > 0:
        a1 = np.concatenate((_plain(np.zeros(diff, a1.dtype), mesh), a1))
    elif diff < 0:
        a2 = np.concatenate((_plain(np.zeros(-diff, a2.dtype), mesh), a2))
    return op(a1, a2)


@_registry.implements(np.polyadd)
def polyadd(a1, a2):
    """``np.polyadd`` of DTensor coefficients: the shorter padded with leading zeros
    (``concatenate``), then ``add``. Collective on the mesh as those rules are.

    Example: ``np.polyadd(dt, [1.0, 2.0])``.
    """
    return _padded("numpy.polyadd", a1, a2, np.add)


@_registry.implements(np.polysub)
def polysub(a1, a2):
    """``np.polysub`` of DTensor coefficients: the shorter padded with leading zeros
    (``concatenate``), then ``subtract``. Collective on the mesh as those rules are.

    Example: ``np.polysub(dt, [1.0, 2.0])``.
    """
    return _padded("numpy.polysub", a1, a2, np.subtract)


@_registry.implements(np.polymul)
def polymul(a1, a2):
    """``np.polymul`` of DTensor coefficients: ``np.convolve`` by its rule.
    Collective on the mesh as that rule is.

    Example: ``np.polymul(dt, [1.0, -1.0])``.
    """
    mesh = _mesh("numpy.polymul", a1, a2)
    return np.convolve(_vector(a1, mesh), _vector(a2, mesh))


@_registry.implements(np.polyder)
def polyder(p, m=1):
    """``np.polyder`` of DTensor coefficients: NumPy's steps, ``p[:-1]`` times the
    powers ``n, ..., 1`` (a Replicate vector), ``m`` times. Collective on the mesh
    as slicing and multiplying are.

    Example: ``np.polyder(dt, 2)``.
    """
    m = operator.index(m)
    if m < 0:
        raise ValueError("Order of derivative must be positive (see polyint)")
    mesh = _mesh("numpy.polyder", p)
    val = p
    for _ in range(m):
        n = val.shape[0] - 1
        val = val[:-1] * _plain(np.arange(n, 0, -1), mesh)
    return val


@_registry.implements(np.polyint)
def polyint(p, m=1, k=None):
    """``np.polyint`` of DTensor coefficients: NumPy's steps, ``p`` divided by the
    powers ``len(p), ..., 1`` and the constant appended (``concatenate``), ``m``
    times. Collective on the mesh as those rules are.

    Example: ``np.polyint(dt, 1, k=3.0)``.
    """
    m = operator.index(m)
    if m < 0:
        raise ValueError("Order of integral must be positive (see polyder)")
    mesh = _mesh("numpy.polyint", p)
    if type(k) is DTensor:
        raise _registry.NoRule("numpy.polyint: DTensor constants have no distributed rule")
    k = np.zeros(m, float) if k is None else np.atleast_1d(k)
    if len(k) == 1 and m > 1:
        k = k[0] * np.ones(m, float)
    if len(k) < m:
        raise ValueError("k must be a scalar or a rank-1 array of length 1 or >m.")
    val = p
    for i in range(m):
        quotient = val / _plain(np.arange(val.shape[0], 0, -1), mesh)
        val = np.concatenate((quotient, _plain(np.asarray([k[i]]), mesh)))
    return val
