"""matmul (``@``, the ufunc ``np.matmul``) and ``np.dot`` for 1-D and 2-D operands.

Dim map: batch dims broadcast like elementwise inputs (KEEP), the rows ``i`` and
columns ``j`` are KEEP, the inner dim ``k`` is CONTRACT (sharded -> Partial(sum));
a Partial(sum|avg) operand passes through when the other is Replicate (LINEAR_ONE
on both inputs): ``S1 @ S0 -> P(sum)``, ``S0 @ R -> S0``, ``R @ S1 -> S1``.
"""

from __future__ import annotations

import numpy as np

from . import _dispatch as D


def matmul_map(name, shapes):
    a, b = shapes
    if len(a) == 0 or len(b) == 0:
        raise ValueError(f"{name}: operands must have at least one dim (scalars: use *)")
    a_batch, b_batch = a[:-2], b[:-2]
    batch = np.broadcast_shapes(a_batch, b_batch)
    nb = len(batch)
    kinds = [D.KEEP] * nb
    labels = list(range(nb))

    def new(kind):
        kinds.append(kind)
        return len(kinds) - 1

    k = new(D.CONTRACT)
    i = new(D.KEEP) if len(a) >= 2 else None
    j = new(D.KEEP) if len(b) >= 2 else None
    in_labels, bcast = [], []
    for shape, core in ((a, [i, k] if i is not None else [k]),
                        (b, [k, j] if j is not None else [k])):
        bshape = shape[:-2] if len(shape) >= 2 else ()
        first = nb - len(bshape)
        bits = 0
        for d, n in enumerate(bshape):
            if n == 1 and batch[first + d] != 1:
                bits |= 1 << d
        in_labels.append(labels[first:] + core)
        bcast.append(bits)
    out = labels + [x for x in (i, j) if x is not None]
    return D.dimmap(in_labels, out, kinds, in_bcast=bcast, partial_rule=D.P_LINEAR_ONE,
                    partial_inputs=0b11)


@D.implements(np.dot)
def dot(a, b, out=None):
    """np.dot for 1-D and 2-D DTensors (the cases where it equals matmul)."""
    from .._api import DTensor

    if out is not None:
        raise TypeError("numpy.dot: out= is not supported on DTensors")
    for x in (a, b):
        if type(x) is not DTensor:
            if isinstance(x, np.ndarray) and x.ndim > 0:
                raise D.mixed_error("numpy.dot", x)
            raise TypeError("numpy.dot on DTensors takes two DTensors; for a scalar "
                            "factor use *")
        if x.ndim not in (1, 2):
            raise TypeError(
                f"numpy.dot on DTensors supports 1-D and 2-D operands, got {x.ndim}-D; "
                f"use numpy.matmul")
    return np.matmul(a, b)
