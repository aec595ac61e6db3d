"""The part of a stored array that ``load(..., index=)`` names: a box of the file
(slices of step 1 and integers, as NumPy's basic indexing), and each rank's box of
the result placed in it, so that a rank reads its part of the slice and nothing
else. Every function here is Local.
"""

from __future__ import annotations

import operator
from typing import NamedTuple


class Region(NamedTuple):
    """The stored box ``starts`` + ``sizes`` (one per stored dim); the result keeps
    the dims in ``kept`` (an integer index drops its dim, as NumPy does)."""

    starts: tuple
    sizes: tuple
    kept: tuple

    @property
    def shape(self) -> tuple:
        """The result's shape."""
        return tuple(self.sizes[d] for d in self.kept)

    @property
    def whole(self) -> bool:
        return len(self.kept) == len(self.sizes) and not any(self.starts)

    def box(self, sizes, offsets) -> tuple:
        """(offsets, sizes) in the file of the result's box (``sizes`` at
        ``offsets``)."""
        off, size = list(self.starts), [1] * len(self.sizes)
        for k, d in enumerate(self.kept):
            off[d] += offsets[k]
            size[d] = sizes[k]
        return tuple(off), tuple(size)


def whole(shape) -> Region:
    """The region of the whole array of ``shape``."""
    return Region((0,) * len(shape), tuple(shape), tuple(range(len(shape))))


def _items(index, ndim: int) -> list:
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(i is Ellipsis for i in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (ndim - len(items) + 1)
    if len(items) > ndim:
        raise IndexError(f"too many indices for an array of {ndim} dims: {len(items)} "
                         f"were given")
    return items + [slice(None)] * (ndim - len(items))


def _one(item, size: int, dim: int):
    """(start, size, kept) of one dim's index."""
    if isinstance(item, slice):
        start, stop, step = item.indices(size)
        if step != 1:
            raise ValueError(f"index= takes slices of step 1 (a box of the file); dim "
                             f"{dim} has step {step}: load the box and slice it")
        return start, max(0, stop - start), True
    if isinstance(item, bool) or not hasattr(item, "__index__"):
        raise TypeError(f"index= takes integers, slices and '...', as NumPy's basic "
                        f"indexing; dim {dim} has {item!r}")
    i = operator.index(item)
    if not -size <= i < size:
        raise IndexError(f"index {i} is out of bounds for dim {dim} of size {size}")
    return i % size, 1, False


def region_of(index, shape) -> Region:
    """The region ``index`` names in an array of ``shape`` (None: all of it).
    IndexError, ValueError or TypeError for an index that is not a box.

    Example::

        >>> region_of((slice(2, 5), 0), (10, 4)).shape
        (3,)
    """
    if index is None:
        return whole(shape)
    starts, sizes, kept = [], [], []
    for d, item in enumerate(_items(index, len(shape))):
        start, size, keep = _one(item, shape[d], d)
        starts.append(start)
        sizes.append(size)
        if keep:
            kept.append(d)
    return Region(tuple(starts), tuple(sizes), tuple(kept))
