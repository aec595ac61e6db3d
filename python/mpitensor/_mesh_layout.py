"""Where a mesh's dims step through the ranks of the mesh it came from.

Every mesh derived from a root mesh (a slice, a flattened dim, an unflattened one, a
concatenation) describes each of its dims by its offsets: the row-major positions in
the root's rank array that the dim's coordinates 0, 1, ... add to this rank's
starting position (offsets[0] is 0). A dim of the root of shape ``s`` with row-major
stride ``t`` has offsets ``t * arange(s)``; flattening dims adds their offsets in
row-major order; unflattening a dim splits its offsets by the new sizes. The same
offsets name the same communicator groups, which is how a derived mesh finds an
existing mesh whose dims it can slice instead of making new communicators. As
torch's ``_MeshLayout`` (CuTe layouts) does, with explicit offsets in place of
(size, stride) pairs: a mesh has at most a few hundred ranks per dim.

Pure NumPy; no MPI.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["root_offsets", "flattened", "unflattened", "positions", "cosets",
           "same_offsets"]


def root_offsets(shape) -> tuple[np.ndarray, ...]:
    """The offsets of each dim of a mesh of ``shape`` over itself.

    Example: ``[o.tolist() for o in root_offsets((2, 3))] == [[0, 3], [0, 1, 2]]``.
    """
    strides, step = [], 1
    for n in reversed(shape):
        strides.insert(0, step)
        step *= n
    return tuple(np.arange(n, dtype=np.int64) * t for n, t in zip(shape, strides))


def positions(offsets) -> np.ndarray:
    """The offset of every coordinate of dims with ``offsets``, as an array of their
    shape (the dims' offsets added, row-major).

    Example: ``positions(root_offsets((2, 2))).tolist() == [[0, 1], [2, 3]]``.
    """
    out = np.zeros((), np.int64)
    for o in offsets:
        out = out[..., None] + np.asarray(o, np.int64)
    return out


def flattened(offsets) -> np.ndarray:
    """The offsets of one dim that runs through dims with ``offsets`` in row-major
    order (the first dim slowest), as torch's flatten.

    Example: ``flattened(root_offsets((2, 3))).tolist() == [0, 1, 2, 3, 4, 5]``.
    """
    return positions(offsets).ravel()


def unflattened(offsets: np.ndarray, sizes) -> tuple[np.ndarray, ...] | None:
    """The offsets of dims of ``sizes`` that together run through a dim with
    ``offsets`` in row-major order, or None when they are no product of dims (a
    split that cuts across the dim's own flattened parts unevenly).

    Example: ``[o.tolist() for o in unflattened(np.arange(4), (2, 2))] == [[0, 2], [0, 1]]``.
    """
    offsets = np.asarray(offsets, np.int64)
    weights = [math.prod(sizes[j + 1:]) for j in range(len(sizes))]
    parts = tuple(offsets[np.arange(n, dtype=np.int64) * w] for n, w in zip(sizes, weights))
    if not np.array_equal(positions(parts).ravel(), offsets):
        return None
    return parts


def same_offsets(a, b) -> bool:
    """Whether two dims step through the same positions, in the same order.

    Example: ``same_offsets(np.arange(2), [0, 1])``.
    """
    return len(a) == len(b) and bool(np.array_equal(a, b))


def cosets(offsets, numel: int) -> np.ndarray | None:
    """The starting positions of the groups that dims with ``offsets`` cut a root
    of ``numel`` ranks into, in increasing order (each group is a start plus
    :func:`positions`), or None when the dims overlap or cut no partition of the
    root.

    Example: ``cosets(root_offsets((2, 2))[1:], 4).tolist() == [0, 2]``.
    """
    flat = flattened(offsets) if len(offsets) else np.zeros(1, np.int64)
    if np.unique(flat).size != flat.size or flat.min() < 0 or flat.max() >= numel:
        return None
    covered = np.zeros(numel, bool)
    starts = []
    for p in range(numel):
        if covered[p]:
            continue
        at = p + flat
        if at.max() >= numel or covered[at].any():
            return None
        covered[at] = True
        starts.append(p)
    return np.array(starts, np.int64)
