"""A DTensor's local block not computed yet: ``np.isnan(x)`` or ``np.where(
condition, x, y)``, whose next reduction may read the operands instead.

scikit-learn's NaN-aware extremes on an array API namespace are
``min(where(isnan(X), inf, X), axis=0)``: written out, the mask and the where are
new arrays the reduction reads once. Deferred, the reduction reads X where it is
(mpitensor._ops._deferring).

Nothing may change what the block will be before it is computed, so a Deferred is
made only of arrays no other object can write (``_C.exclusive``: each owns its
memory and only its DTensor references it), and it makes them read-only until it
is settled. One Deferred waits at a time, with the Deferred operands it was made
of; the C executor settles it (ext_deferred.c) before any operation reads or
writes a DTensor's data, before any local array is handed out (``_local_tensor``,
``_data()``, ``to_local()``) and before the next one waits. Settling computes the
block if a DTensor still holds it (and each Deferred operand's), then gives the
operands their writes back. The block is NumPy's own function of the same arrays,
so its bits are the ones the eager call gives.
"""

from __future__ import annotations

import numpy as np


class Deferred:
    """``func(*operands)`` on local arrays, computed when first needed; an operand
    may be another Deferred (the mask of a where).

    Example: ``Deferred(np.where, (mask, np.inf, block)).result()`` is
    ``np.where(mask, np.inf, block)``.
    """

    __slots__ = ("func", "operands", "frozen", "value", "nan_free")

    def __init__(self, func, operands: tuple):
        self.func, self.operands, self.value = func, operands, None
        # An isnan whose operand a reduction found without NaNs: all False.
        self.nan_free = False
        frozen = {id(a): a for a in operands
                  if type(a) is np.ndarray and a.ndim and a.flags.writeable}
        self.frozen = tuple(frozen.values())
        for a in self.frozen:
            a.flags.writeable = False

    def _compute(self) -> np.ndarray:
        if self.operands is None:
            raise RuntimeError("a deferred local was released before it was computed")
        if self.nan_free:
            return np.zeros(self.operands[0].shape, np.bool_)
        return self.func(*(o.result() if type(o) is Deferred else o for o in self.operands))

    def settle(self, needed: bool) -> None:
        """Computes the block when ``needed`` (a DTensor holds it), and each Deferred
        operand's (their DTensors may live on), then thaws the operands."""
        try:
            if needed and self.value is None:
                self.value = self._compute()
            for o in self.operands or ():
                if type(o) is Deferred:
                    o.settle(True)
        finally:
            for a in self.frozen:
                a.flags.writeable = True
            self.frozen, self.operands = (), None

    def result(self) -> np.ndarray:
        """The block, computed now if it was not (its operands still frozen)."""
        if self.value is None:
            self.value = self._compute()
        return self.value

    def __repr__(self) -> str:
        return (f"Deferred(numpy.{self.func.__name__})" if self.value is None
                else repr(self.value))
