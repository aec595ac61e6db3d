"""``reduce``, ``accumulate`` and ``reduceat`` of the two-operand ufuncs whose
steps may not be regrouped (``subtract``, ``divide``, ``power``, ``arctan2``, ...)
as NumPy computes them: a left fold along the axis, ``x0 op x1 op x2 ...``,
elementwise over the other dims. A fold over blocks in rank order is that fold
bit for bit, so the ranks of the mesh dim that shards the axis make it a chain:
each rank continues the fold from the carry the rank before it sent, and sends
its own on. What moves, over that mesh dim only, never the array:

- ``accumulate``: one slice (the axis taken out) from each rank to the next,
  P - 1 shifts, placements as ``a``'s;
- ``reduceat`` (and ``reduce``, its one segment of the whole axis): the
  ``len(indices)`` slices of the result so far from each rank to the next, and
  from the last to the first, P shifts, then one broadcast of them from the
  first; the result is Replicate over that mesh dim.

A rank with an empty block passes the carry on. The result dtype and NumPy's
errors (no loop for a dtype) come from NumPy's own call on a one-element array
on every rank before anything moves; under ``np.errstate(...="raise")`` a
FloatingPointError of one rank is raised on every member after the chain.
"""

from __future__ import annotations

import numpy as np

from .. import _comm
from .._layout import compute_local_shape_and_global_offset


def foldable(ufunc) -> bool:
    """Whether ``ufunc``'s reduce and accumulate are a left fold this module
    computes: an elementwise ufunc of two operands and one result. Local.

    Example: ``foldable(np.subtract)`` is True, ``foldable(np.divmod)`` False.
    """
    return ufunc.nin == 2 and ufunc.nout == 1 and ufunc.signature is None


# Where NumPy's own reduce is not a fold of its elementwise steps, so a chain of
# them would not give its bits: float arctan2 (its vector and scalar loops round
# apart) and float power (its reduce loop takes the first operand for a scalar).
# float16 reductions keep a float32 accumulator; long double and complex results
# are left to the fallback too.
_FLOATS_NOT_FOLDED = frozenset((np.arctan2, np.power))


def exact(ufunc, out_kind) -> bool:
    """Whether this module gives NumPy's bits for ``ufunc`` with results of dtype
    ``out_kind``: integers and booleans always, float32 and float64 but for the
    ufuncs above. Local.

    Example: ``exact(np.subtract, np.dtype(np.float64))`` is True.
    """
    out_kind = np.dtype(out_kind)
    if out_kind.kind in "biu":
        return True
    return out_kind in (np.float32, np.float64) and ufunc not in _FLOATS_NOT_FOLDED


def kind(ufunc, dtype_in, dtype):
    """The result dtype of ``ufunc.accumulate`` of ``dtype_in`` with ``dtype=``,
    or NumPy's own error, from a one-element call (so alike on every rank). Local."""
    return ufunc.accumulate(np.zeros((1,), dtype_in), dtype=dtype).dtype


def _line(mesh, m: int) -> tuple[int, int]:
    """(this rank's coordinate on mesh dim ``m``, the dim's size)."""
    return mesh.get_coordinate()[m], mesh.shape[m]


def _shift(mesh, m: int, k: int, me: int, n: int, sends: list, recvs: list) -> None:
    """Step ``k`` of the chain: coordinate ``k`` sends ``sends`` to ``k + 1`` (mod
    ``n``), which fills ``recvs``; the others move nothing. Collective on the dim."""
    empty = np.empty((0,), np.uint8)
    out = sends if me == k else [empty] * len(sends)
    into = recvs if me == (k + 1) % n else [np.empty((0,), np.uint8)] * len(recvs)
    _comm.ring_shift_start(mesh._handle, m, out, into).wait()


class _Steps:
    """Runs this rank's local NumPy work of the chain under the caller's errstate;
    a FloatingPointError it raises is kept (the work is redone with errors
    ignored, so the chain goes on) and raised on every member by ``settle``."""

    def __init__(self):
        self.error = None

    def run(self, work):
        if self.error is None:
            try:
                return work()
            except FloatingPointError as e:
                self.error = e
        with np.errstate(all="ignore"):
            return work()

    def settle(self, mesh) -> None:
        """Collective on the mesh when some errstate raises, else Local."""
        if "raise" not in np.geterr().values():
            return
        try:
            _comm.agree(mesh._handle, self.error is None, 0, str(self.error),
                        FloatingPointError)
        except Exception as agreed:  # noqa: BLE001 - NumPy's type, every rank
            raise self.error or FloatingPointError(str(agreed)) from None


def accumulate(ufunc, a, axis: int, dtype, m: int, out_kind) -> np.ndarray:
    """This rank's block of ``ufunc.accumulate(a, axis, dtype=dtype)``, mesh dim
    ``m`` sharding ``axis``: each rank scans ``[carry] + its block`` in coordinate
    order. Collective on the dim (P - 1 shifts of one slice)."""
    spec, local = a._spec, a.to_local()
    mesh = spec.mesh
    me, n = _line(mesh, m)
    steps = _Steps()
    slab = local.shape[:axis] + (1,) + local.shape[axis + 1:]
    carry, have = np.zeros(slab, out_kind), np.zeros((1,), np.uint8)
    res = np.zeros(local.shape, out_kind)
    for k in range(n - 1):
        if me == k:
            res, carry, have = _scan_block(ufunc, local, axis, dtype, out_kind, carry,
                                           have, steps)
        _shift(mesh, m, k, me, n, [carry, have], [carry, have])
    if me == n - 1:
        res, _, _ = _scan_block(ufunc, local, axis, dtype, out_kind, carry, have, steps)
    steps.settle(mesh)
    return res


def _scan_block(ufunc, local, axis, dtype, out_kind, carry, have, steps):
    """(this block's scan, the carry after it, whether there is one)."""
    if local.shape[axis] == 0:
        return np.zeros(local.shape, out_kind), carry, have
    if have[0]:
        whole = np.concatenate([carry, local.astype(out_kind, copy=False)], axis=axis)
        res = steps.run(lambda: ufunc.accumulate(whole, axis=axis, dtype=dtype))
        res = np.delete(res, 0, axis=axis)
    else:
        res = steps.run(lambda: ufunc.accumulate(local, axis=axis, dtype=dtype))
    res = res.astype(out_kind, copy=False)
    last = np.ascontiguousarray(np.take(res, [-1], axis=axis))
    return res, last, np.ones((1,), np.uint8)


def segments(ufunc, a, idx: np.ndarray, axis: int, dtype, m: int, out_kind) -> np.ndarray:
    """This rank's block of ``ufunc.reduceat(a, idx, axis, dtype=dtype)``, mesh dim
    ``m`` sharding ``axis`` (Replicate over it): the result so far, segment by
    segment, goes along the chain and back to the first rank, which broadcasts it.
    Collective on the dim (P shifts and one broadcast of ``len(idx)`` slices)."""
    spec, local = a._spec, a.to_local()
    mesh = spec.mesh
    me, n = _line(mesh, m)
    total = spec.shape[axis]
    _, offsets = compute_local_shape_and_global_offset(spec.shape, mesh, spec.placements)
    lo, hi = offsets[axis], offsets[axis] + local.shape[axis]
    rest = local.shape[:axis] + local.shape[axis + 1:]
    acc = np.zeros((len(idx),) + rest, out_kind)
    have = np.zeros((len(idx),), np.uint8)
    steps = _Steps()
    ends = idx[1:].tolist() + [total]
    for k in range(n):
        if me == k:
            for i, (s, e) in enumerate(zip(idx.tolist(), ends)):
                b, c = max(s, lo), min(e if e > s else s + 1, hi)  # e <= s: a[s]
                if b < c:
                    part = np.take(local, np.arange(b - lo, c - lo), axis=axis)
                    acc[i], have[i] = _fold(ufunc, part, axis, dtype, out_kind,
                                            acc[i] if have[i] else None, steps), 1
        if n > 1:
            _shift(mesh, m, k, me, n, [acc, have], [acc, have])
    if n > 1:
        mesh._handle.bcast(acc, m)
    steps.settle(mesh)
    return np.moveaxis(acc, 0, axis)


def _fold(ufunc, part, axis, dtype, out_kind, carry, steps) -> np.ndarray:
    """``part`` folded along ``axis`` (removed), from ``carry`` when there is one."""
    if carry is not None:
        part = np.concatenate([np.expand_dims(carry, axis),
                               part.astype(out_kind, copy=False)], axis=axis)
    return steps.run(lambda: ufunc.reduce(part, axis=axis, dtype=dtype)).astype(
        out_kind, copy=False)
