"""A DTensor's local block not computed yet: ``np.where(condition, x, y)`` whose
next reduction may read its operands instead of a copy of them.

scikit-learn's NaN-aware extremes on an array API namespace are
``min(where(isnan(X), inf, X), axis=0)``: written out, the where is a whole new
copy of X that the reduction reads once. Deferred, the reduction of the selection
reads X and the mask where they are (mpitensor._ops._reductions).

Nothing may change what the block will be before it is computed, so a Deferred is
made only of arrays no other object can write (``_C.exclusive``: each owns its
memory and only its DTensor references it), and it makes them read-only until it
is settled. At most one Deferred waits at a time; the C executor settles it
(ext_deferred.c) before any operation reads or writes a DTensor's data, before any
local array is handed out (``_local_tensor``, ``_data()``, ``to_local()``) and
before the next one waits. Settling computes the block if a DTensor still holds
it, then gives the operands their writes back. The block is NumPy's own
``np.where`` of the same arrays, so its bits are the ones the eager call gives.
"""

from __future__ import annotations

import numpy as np


class Deferred:
    """``np.where(condition, x, y)`` on local arrays, computed when first needed.

    Example: ``Deferred(mask, np.inf, block).result()`` is
    ``np.where(mask, np.inf, block)``.
    """

    __slots__ = ("condition", "x", "y", "frozen", "value")

    def __init__(self, condition, x, y):
        self.condition, self.x, self.y, self.value = condition, x, y, None
        frozen = {id(a): a for a in (condition, x, y)
                  if type(a) is np.ndarray and a.ndim and a.flags.writeable}
        self.frozen = tuple(frozen.values())
        for a in self.frozen:
            a.flags.writeable = False

    def operand(self) -> np.ndarray:
        """The array operand (of x and y, the other is a scalar)."""
        return self.y if np.ndim(self.x) == 0 else self.x

    def scalar(self):
        """The scalar operand."""
        return self.x if np.ndim(self.x) == 0 else self.y

    def scalar_taken(self) -> bool:
        """Whether the selection takes the scalar anywhere."""
        return bool(self.condition.any() if np.ndim(self.x) == 0
                    else not self.condition.all())

    def operand_taken(self) -> np.ndarray:
        """Where the selection takes the array operand (a bool array)."""
        return ~self.condition if np.ndim(self.x) == 0 else self.condition

    def settle(self, needed: bool) -> None:
        """Computes the block when ``needed`` (a DTensor holds it), then thaws."""
        try:
            if needed and self.value is None:
                self.value = np.where(self.condition, self.x, self.y)
        finally:
            for a in self.frozen:
                a.flags.writeable = True
            self.frozen = ()
            self.condition = self.x = self.y = None

    def result(self) -> np.ndarray:
        """The block, computed now if it was not (its operands still frozen)."""
        if self.value is None:
            if self.condition is None:
                raise RuntimeError("a deferred local was released before it was computed")
            self.value = np.where(self.condition, self.x, self.y)
        return self.value

    def __repr__(self) -> str:
        return "Deferred(numpy.where)" if self.value is None else repr(self.value)
