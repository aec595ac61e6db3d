"""Elementwise lookups of a DTensor's values in a small table every rank holds:
``np.isin`` (the table: the test elements) and ``np.interp`` (the table: the
points ``xp`` and values ``fp``).

The looked-up DTensor keeps its placements (a Partial is reduced first: a lookup
is not linear) and each rank looks up its own elements, with no communication. A
table given as an array is taken as every rank's (each rank passes the same, as
NumPy's call on each would); a replicated DTensor table is read where it is; a
sharded one of ``np.isin`` stays sharded and the elements are looked up where its
values lie (``_setops``), and one of ``np.interp`` is gathered, which moves the
table, not the data.
"""

from __future__ import annotations

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate
from .._algorithms import _dispatch as D
from . import _setops

__all__ = ["isin", "interp"]


def _table(name, t):
    """The whole of a table argument: a DTensor gathered (collective), else as is."""
    if type(t) is DTensor:
        mesh = t._spec.mesh
        whole = D.relayout(name, t, [Replicate()] * mesh.ndim)
        return whole.to_local() if mesh.get_coordinate() is not None else np.empty(0, t.dtype)
    return t


def _lookup(name, x, compute):
    """``compute(local)`` on each rank's elements of ``x``, in ``x``'s placements
    (its Partials reduced first)."""
    x = D.relayout(name, x, [Replicate() if p.is_partial() else p
                             for p in x._spec.placements])
    spec = x._spec
    local = x.to_local() if spec.mesh.get_coordinate() is not None else \
        np.zeros((0,) * len(spec.shape), spec.dtype)
    out = np.asarray(compute(local))
    if spec.mesh.get_coordinate() is None:
        out = D.outside_local(spec.shape, out.dtype)
    return DTensor(np.ascontiguousarray(out), DTensorSpec(
        spec.mesh, spec.placements, spec.shape, out.dtype, contiguous_strides(spec.shape)))


@_registry.implements(np.isin)
def isin(element, test_elements, assume_unique=False, invert=False, *, kind=None):
    """``np.isin`` of a DTensor: whether each element is among ``test_elements`` (an
    array every rank passes alike, or a DTensor). Local when the test elements
    are not a sharded DTensor; sharded ones are not gathered: the elements are
    looked up where the test elements' unique values lie (``_setops``). The
    result has ``element``'s placements.

    Example: ``np.isin(dt, [1, 3])``.
    """
    name = "numpy.isin"
    if type(test_elements) is DTensor and (type(element) is not DTensor or any(
            p.is_shard() and test_elements._spec.mesh.shape[i] > 1
            for i, p in enumerate(test_elements._spec.placements))):
        # Sharded test elements stay where they are: the elements visit them.
        return _setops.isin_sharded(name, element, test_elements, invert, kind)
    if type(element) is not DTensor:
        raise _registry.NoRule(f"{name}: the elements must be the DTensor")
    table = _table(name, test_elements)
    return _lookup(name, element, lambda x: np.isin(
        x, table, assume_unique=assume_unique, invert=invert, kind=kind))


@_registry.implements(np.interp)
def interp(x, xp, fp, left=None, right=None, period=None):
    """``np.interp`` at a DTensor's values: the piecewise-linear function through
    (``xp``, ``fp``) (arrays every rank passes alike, or DTensors, gathered).
    Local when the table is not a sharded DTensor; the result has ``x``'s
    placements.

    Example: ``np.interp(dt, [0.0, 1.0], [10.0, 20.0])``.
    """
    name = "numpy.interp"
    if type(x) is not DTensor:
        raise _registry.NoRule(f"{name}: the points must be the DTensor")
    xp, fp = _table(name, xp), _table(name, fp)
    return _lookup(name, x, lambda v: np.interp(v, xp, fp, left=left, right=right,
                                                period=period))
