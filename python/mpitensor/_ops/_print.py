"""``np.array2string``, ``np.array_repr`` and ``np.array_str`` of a DTensor.

When NumPy summarises (more items than the ``threshold`` print option), it shows
``edgeitems`` items at each end of every long axis and formats the numbers from
those alone (``_leading_trailing`` in numpy/_core/arrayprint.py). So only those
items move: each long axis is cut to its two ends around one middle item, which
NumPy neither shows nor formats, by ``np.take`` (rows from the ranks that own
them), and NumPy prints that small array as it would the whole one. The repr's
``shape=`` and line breaks come from the DTensor's own shape, through NumPy's
repr with that shape standing in. An array NumPy prints whole is gathered: it
holds at most ``threshold`` items.
"""

from __future__ import annotations

import numpy as np
from numpy._core import arrayprint

from .. import _registry
from .._dtensor import DTensor
from ._composed import _dtensor

__all__ = ["array2string", "array_repr", "array_str"]


def _shown(a: DTensor, threshold, edgeitems) -> tuple:
    """(the ndarray NumPy would format for ``a``, whether NumPy summarises it).
    Collective on ``a``'s mesh."""
    options = np.get_printoptions()
    threshold = options["threshold"] if threshold is None else threshold
    edgeitems = options["edgeitems"] if edgeitems is None else edgeitems
    if a.size <= threshold:
        return a.full_tensor(), False
    for axis, n in enumerate(a.shape):
        if n > 2 * edgeitems:
            keep = np.r_[0:edgeitems + 1, n - edgeitems:n]
            a = np.take(a, keep, axis=axis)
    return a.full_tensor(), True


@_registry.implements(np.array2string)
def array2string(a, *args, **kwargs):
    """``np.array2string`` of a DTensor, the string NumPy gives for the whole
    array on every rank; a summarised one moves only the items it shows.
    Collective on the mesh.

    Example: ``np.array2string(dt)`` of a ``[Shard(0)]`` (10000,) vector gathers
    six items.
    """
    a = _dtensor("numpy.array2string", a)
    shown, summary = _shown(a, kwargs.get("threshold"), kwargs.get("edgeitems"))
    if summary:
        kwargs["threshold"] = 0  # the small array summarises as the whole one does
    return np.array2string(shown, *args, **kwargs)


def _with_shape(a: DTensor, implementation, name, args, kwargs) -> str:
    """NumPy's ``implementation`` (a repr or str) of ``a``: its shape and dtype
    from a stand-in of that shape that holds no data, its items printed from
    the items shown."""
    shown, summary = _shown(_dtensor(name, a), None, None)
    if not summary:
        return implementation(shown, *args, **kwargs)
    stand_in = np.broadcast_to(np.zeros((), a.dtype), a.shape)

    def items(_, *rest, **options):
        return np.array2string(shown, *rest, **options, threshold=0)

    return implementation(stand_in, *args, **kwargs, array2string=items)


@_registry.implements(np.array_repr)
def array_repr(arr, *args, **kwargs):
    """``np.array_repr`` of a DTensor: NumPy's repr of the whole array on every
    rank (``shape=`` included when summarised), moving only the items shown.
    Collective on the mesh.

    Example: ``np.array_repr(dt)`` is ``'array([0, 1, 2])'`` for ``np.arange(3)``.
    """
    return _with_shape(arr, arrayprint._array_repr_implementation, "numpy.array_repr",
                       args, kwargs)


@_registry.implements(np.array_str)
def array_str(a, *args, **kwargs):
    """``np.array_str`` of a DTensor: NumPy's str of the whole array on every
    rank, moving only the items shown. Collective on the mesh.

    Example: ``np.array_str(dt)`` is ``'[0 1 2]'`` for ``np.arange(3)``.
    """
    return _with_shape(a, arrayprint._array_str_implementation, "numpy.array_str",
                       args, kwargs)
