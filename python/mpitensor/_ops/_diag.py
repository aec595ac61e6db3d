"""``np.diag`` of DTensors: the diagonal of a 2-D DTensor, or the 2-D DTensor with
a 1-D one on its diagonal, as torch's ``diag``.

Each is a dim map whose input labels are REPLICATE (a Shard of them is gathered,
as torch gathers) and whose output labels are sized labels no input holds: the
result is Replicate, or Partial where the input is (the diagonal is linear), and
the local function is NumPy's ``diag`` on the whole array. ``diag_into`` places a
diagonal into zeros of a given 2-D shape, for diag's backward.
"""

from __future__ import annotations

import operator

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._algorithms import _dispatch as D
from .._algorithms import _views

__all__ = ["diag_into"]


def _run(key, a, out_shape, compute):
    n, m = a.ndim, len(out_shape)

    def build():
        kinds = [D.REPLICATE] * n + [D.KEEP] * m
        return D.dimmap([range(n)], range(n, n + m), kinds, partial_rule=D.P_LINEAR_ALL,
                        sizes={n + i: size for i, size in enumerate(out_shape)})

    return D.execute(key, (a,), build, compute)


@_registry.implements(np.diag, views=True)
def diag(v, k=0):
    """``np.diag`` of a DTensor: a 1-D one gives the 2-D array with it on diagonal
    ``k``, a 2-D one its diagonal ``k``; Replicate (Partial stays). Local when
    the input is not sharded; else collective on the mesh (the input is
    gathered first, as in torch).

    Example: ``np.diag(dt)`` of a (3, 3) ``[Shard(0)]`` DTensor is a (3,)
    ``[Replicate()]`` DTensor, after one all-gather. A 2-D one's diagonal is a
    program's read-only view, as NumPy's.
    """
    program = _registry.program_call(np.diag)
    out = _diag(v, k)
    if not program or v.ndim != 2:
        return out
    # NumPy's diagonal of a matrix is a read-only view: so is a program's here
    # (mpitensor._algorithms._views), which shows the writes into ``v``.
    return _views.keep(v, out, lambda p: _diag(p, k))


def _diag(v, k):
    """:func:`diag` itself."""
    if type(v) is not DTensor:
        raise TypeError(f"numpy.diag: expected a DTensor, got {type(v).__name__}")
    k = operator.index(k)
    if v.ndim == 1:
        size = v.shape[0] + abs(k)
        return _run(("diag", 1, k), v, (size, size), lambda x: np.diag(x, k))
    if v.ndim == 2:
        rows, cols = v.shape
        size = max(0, min(rows + min(k, 0), cols - max(k, 0)))
        return _run(("diag", 2, k), v, (size,), lambda x: np.diag(x, k))
    raise ValueError("numpy.diag: input must be 1- or 2-d.")


def diag_into(g: DTensor, k: int, shape: tuple) -> DTensor:
    """Zeros of the 2-D ``shape`` with the 1-D ``g`` on diagonal ``k`` (diag's
    backward of a 2-D input), Replicate (Partial stays). Collective on the mesh
    when ``g`` is sharded (it is gathered first).

    Example: ``diag_into(g, 0, (3, 4))`` of a (3,) ``g``.
    """
    rows, cols = shape

    def compute(x):
        out = np.zeros(shape, x.dtype)
        if g.shape[0]:  # a rank outside the mesh sees a one-element stand-in
            i = np.arange(x.shape[0])
            out[i - min(k, 0), i + max(k, 0)] = x
        return out

    return _run(("diag_into", k, rows, cols), g, shape, compute)
