"""``DTensor.flat``: NumPy's flat iterator (``ndarray.flat``) over a DTensor's
elements in C order, as scikit-learn's diagonal idiom writes it:
``a.flat[::n + 1] += value``.

As NumPy's, reading gives new arrays (``a.flat[2:5]`` is a copy) and writing
reaches the DTensor (``a.flat[k] = v``, ``a.flat = v``); a value shorter than
what it is written into is repeated, as NumPy repeats it. The writes go through
the program's ``reshape(-1)`` of the DTensor, a view of it on every placement.
"""

from __future__ import annotations

import operator
import sys

import numpy as np

from . import _registry

__all__ = ["FlatIter"]


class FlatIter:
    """The flat iterator of DTensor ``base``: ``base.flat``.

    Example::

        >>> a = distribute_tensor(np.zeros((3, 3)), mesh, [Shard(0)])
        >>> a.flat[::4] += 1.0  # the diagonal
        >>> a.full_tensor().trace()
        3.0
    """

    __slots__ = ("base",)

    def __init__(self, base):
        self.base = base

    def _raveled(self, caller=None):
        """``base.reshape(-1)``: a view of ``base`` where ``caller`` is the
        program's frame (the call agreed), else mpitensor's own call."""
        return _registry.door(np.reshape, (self.base, -1), {}, None, caller)

    def __getitem__(self, key):
        """``base.flat[key]``: a new DTensor of the elements ``key`` picks from the
        raveled ``base`` (NumPy gives a copy). Collective on the mesh."""
        return self._raveled(sys._getframe(1))[key].copy()

    def __setitem__(self, key, value) -> None:
        """``base.flat[key] = value``: written into ``base``; a ``value`` of fewer
        elements than ``key`` picks is repeated, as NumPy repeats it. Collective on
        the mesh."""
        _write(self._raveled(sys._getframe(1)), key, value)

    def __len__(self) -> int:
        return self.base.size

    def __iter__(self):
        """The elements in C order, each a 0-d DTensor (the raveled ``base``
        gathered once, as iterating a DTensor does). Collective on the mesh."""
        return iter(self._raveled())

    def copy(self):
        """``base.flat.copy()``: the raveled ``base``, a new DTensor. Collective
        on the mesh when elements move."""
        return self._raveled().copy()

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(base.flat)``: the raveled global array, gathered as
        ``np.asarray(base)`` is. Collective on the mesh."""
        return np.asarray(self.copy(), dtype=dtype)

    def __repr__(self) -> str:
        return f"FlatIter({self.base!r})"


def assign(base, value, caller) -> None:
    """``base.flat = value``: every element of ``base``, ``value`` repeated as
    NumPy repeats it. Collective on the mesh."""
    _write(FlatIter(base)._raveled(caller), slice(None), value)


def _picked(size: int, key) -> int:
    """How many of ``size`` flat elements ``key`` (a slice, an index array or a
    boolean mask) picks; a bad index is the write's own IndexError."""
    if isinstance(key, slice):
        return len(range(size)[key])
    key = np.asarray(key)
    return int(np.count_nonzero(key)) if key.dtype == np.bool_ else key.size


def _write(flat, key, value) -> None:
    """``flat[key] = value`` as NumPy assigns through ``flat``: a plain ``value``
    is raveled and repeated or cut to the count ``key`` picks; an int key takes a
    scalar only (NumPy's ValueError for a sequence)."""
    if type(value) is type(flat):
        value = value.reshape(-1) if value.ndim != 1 else value
    else:
        v = np.asarray(value)
        try:
            operator.index(key)
        except TypeError:
            if v.size:
                value = np.resize(v.ravel(), _picked(flat.shape[0], key))
        else:
            if v.ndim:
                raise ValueError("Error setting single item of array.")
    flat[key] = value
