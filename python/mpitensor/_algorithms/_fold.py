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

Which of a regrouping (each rank reduces its piece, pieces combined in any
order), this fold and NumPy's gathered call gives NumPy's value is decided here,
from the result's dtype: :func:`regroups` and :func:`exact`.

A rank with an empty block passes the carry on. The result dtype and NumPy's
errors (no loop for a dtype) come from NumPy's own call on a one-element array
on every rank before anything moves; under ``np.errstate(...="raise")`` the door
that runs the entry records a floating-point error of one rank and raises it on
every member once the chain is done (mpitensor._registry).
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
# them would not give its bits: float arctan2 and power (their vector loops round
# apart from their scalar ones, and their reduce loop takes the first operand for
# a scalar, so NumPy's value depends on which loop its iteration of the whole
# array picks); the half-precision add, subtract, multiply and divide (a reduction
# keeps a float32 accumulator and rounds once, where their accumulate rounds every
# step). Long double and complex results are left to the fallback too.
_FLOATS_NOT_FOLDED = frozenset((np.arctan2, np.power))
_HALF_ACCUMULATING = frozenset((np.add, np.subtract, np.multiply, np.divide))


def exact(ufunc, out_kind, method: str = "reduce") -> bool:
    """Whether this module gives NumPy's bits for ``ufunc.<method>`` (reduce,
    reduceat or accumulate) with results of dtype ``out_kind`` (the result's
    dtype, never the input's: uint8 under hypot gives float16): integers and
    booleans always; float16 but for reductions of the ufuncs above; float32 and
    float64 but for arctan2 and power. Local.

    Example: ``exact(np.subtract, np.dtype(np.float64))`` is True,
    ``exact(np.subtract, np.dtype(np.float16))`` False and
    ``exact(np.subtract, np.dtype(np.float16), "accumulate")`` True.
    """
    out_kind = np.dtype(out_kind)
    if not _carries(ufunc, out_kind):
        return False
    if out_kind.kind in "biu":
        return True
    if out_kind == np.float16:
        return method == "accumulate" or ufunc not in _HALF_ACCUMULATING
    return out_kind in (np.float32, np.float64) and ufunc not in _FLOATS_NOT_FOLDED


def _carries(ufunc, out_kind) -> bool:
    """Whether a carry of ``out_kind`` can go on folding: ``ufunc`` has a loop of
    two ``out_kind`` operands (ldexp's reduce of ints gives floats, yet takes no
    float exponent). Local."""
    try:
        with np.errstate(all="ignore"):  # 0 op 0 may be 0 / 0
            ufunc.reduceat(np.zeros(2, out_kind), [0])
    except TypeError:
        return False
    return True


def kind(ufunc, dtype_in, dtype, method: str = "accumulate"):
    """The result dtype of ``ufunc.<method>`` (accumulate, reduce or reduceat) of
    ``dtype_in`` with ``dtype=``, or NumPy's own error, from a one-element call
    (so alike on every rank). Local.

    Example: ``kind(np.hypot, np.uint8, None)`` is float16.
    """
    one = np.zeros((1,), dtype_in)
    if method == "reduceat":
        return ufunc.reduceat(one, [0], dtype=dtype).dtype
    return getattr(ufunc, method)(one, dtype=dtype).dtype


# ufuncs whose reduction may combine the pieces of a segment in any grouping and
# order: each rank reduces its piece, and the pieces are combined across ranks.
# Associative and commutative: exactly for the integer and boolean ones (gcd; equal
# and not_equal, whose only loops of one dtype are boolean: XNOR and XOR), up to
# rounding, as add's, for the float ones (logaddexp: log of a sum; hypot: root of
# a sum of squares). A dtype without a loop fails in NumPy's own call on a tiny
# array of that dtype, made alike on every rank before anything moves. lcm is
# not here: its overflow does not wrap alike in every grouping.
REGROUPABLE = frozenset((np.add, np.multiply, np.maximum, np.minimum, np.fmax, np.fmin,
                         np.logical_and, np.logical_or, np.logical_xor, np.bitwise_and,
                         np.bitwise_or, np.bitwise_xor, np.gcd, np.equal, np.not_equal,
                         np.logaddexp, np.logaddexp2, np.hypot))
# Of those, the ones that pick one of their operands: any grouping gives NumPy's
# bits, in every dtype.
_SELECTING = frozenset((np.maximum, np.minimum, np.fmax, np.fmin))


def regroups(ufunc, out_kind) -> bool:
    """Whether ``ufunc``'s pieces of a segment combine in any grouping into NumPy's
    value for results of dtype ``out_kind`` (the result's dtype, never the
    input's: hypot of uint8 or bool gives float16): exactly for integer and
    boolean results and for the ufuncs that pick an operand; up to the rounding
    of the dtype, as a sharded sum's, for the others' float32, float64, long
    double and complex results. Never for float16 (or bfloat16) results, which
    NumPy rounds to half precision at each step: another grouping differs in the
    last bits, a thousandth of the value; those fold (this module) where that
    gives NumPy's bits (:func:`exact`), or gather. Local.

    Example: ``regroups(np.hypot, np.dtype(np.float16))`` is False.
    """
    if ufunc not in REGROUPABLE:
        return False
    out_kind = np.dtype(out_kind)
    return (out_kind.kind in "biu" or ufunc in _SELECTING
            or (out_kind.kind in "fc" and out_kind != np.float16))


def _line(mesh, m: int) -> tuple[int, int]:
    """(this rank's coordinate on mesh dim ``m``, the dim's size)."""
    return mesh.get_coordinate()[m], mesh.shape[m]


def _shift(mesh, m: int, k: int, me: int, n: int, sends: list, recvs: list) -> None:
    """Step ``k`` of the chain: coordinate ``k`` sends ``sends`` to ``k + 1`` (mod
    ``n``), which fills ``recvs``; the others move nothing. Collective on the dim."""
    empty = np.empty((0,), np.uint8)
    out = sends if me == k else [empty] * len(sends)
    into = recvs if me == (k + 1) % n else [np.empty((0,), np.uint8)] * len(recvs)
    _comm.ring_shift_start(mesh, m, out, into).wait()


def accumulate(ufunc, a, axis: int, dtype, m: int, out_kind) -> np.ndarray:
    """This rank's block of ``ufunc.accumulate(a, axis, dtype=dtype)``, mesh dim
    ``m`` sharding ``axis``: each rank scans ``[carry] + its block`` in coordinate
    order. Collective on the dim (P - 1 shifts of one slice)."""
    spec, local = a._spec, a.to_local()
    mesh = spec.mesh
    me, n = _line(mesh, m)
    slab = local.shape[:axis] + (1,) + local.shape[axis + 1:]
    carry, have = np.zeros(slab, out_kind), np.zeros((1,), np.uint8)
    res = np.zeros(local.shape, out_kind)
    for k in range(n - 1):
        if me == k:
            res, carry, have = _scan_block(ufunc, local, axis, dtype, out_kind, carry,
                                           have)
        _shift(mesh, m, k, me, n, [carry, have], [carry, have])
    if me == n - 1:
        res, _, _ = _scan_block(ufunc, local, axis, dtype, out_kind, carry, have)
    return res


def _scan_block(ufunc, local, axis, dtype, out_kind, carry, have):
    """(this block's scan, the carry after it, whether there is one)."""
    if local.shape[axis] == 0:
        return np.zeros(local.shape, out_kind), carry, have
    if have[0]:
        whole = np.concatenate([carry, local.astype(out_kind, copy=False)], axis=axis)
        res = ufunc.accumulate(whole, axis=axis, dtype=dtype)
        res = np.delete(res, 0, axis=axis)
    else:
        res = ufunc.accumulate(local, axis=axis, dtype=dtype)
    res = res.astype(out_kind, copy=False)
    last = np.ascontiguousarray(np.take(res, [-1], axis=axis))
    return res, last, np.ones((1,), np.uint8)


def segments(ufunc, a, idx: np.ndarray, axis: int, dtype, m: int, out_kind,
             method: str = "reduceat") -> np.ndarray:
    """This rank's block of ``ufunc.reduceat(a, idx, axis, dtype=dtype)`` (or, with
    ``method`` "reduce" and ``idx`` ``[0]``, of ``ufunc.reduce``), mesh dim ``m``
    sharding ``axis`` (Replicate over it): the result so far, segment by segment,
    goes along the chain and back to the first rank, which broadcasts it.
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
    ends = idx[1:].tolist() + [total]
    for k in range(n):
        if me == k:
            for i, (s, e) in enumerate(zip(idx.tolist(), ends)):
                b, c = max(s, lo), min(e if e > s else s + 1, hi)  # e <= s: a[s]
                if b < c:
                    part = np.take(local, np.arange(b - lo, c - lo), axis=axis)
                    acc[i], have[i] = _fold(ufunc, part, axis, dtype, out_kind,
                                            acc[i] if have[i] else None, method), 1
        if n > 1:
            _shift(mesh, m, k, me, n, [acc, have], [acc, have])
    if n > 1:
        _comm.bcast(mesh, acc, m)
    return np.moveaxis(acc, 0, axis)


def _fold(ufunc, part, axis, dtype, out_kind, carry, method) -> np.ndarray:
    """``part`` folded along ``axis`` (removed), from ``carry`` when there is one.
    A segment's first piece is NumPy's ``method`` of it: reduce starts from the
    ufunc's identity (hypot's reduce of ``[-3]`` is 3), reduceat from the first
    element (-3); the pieces after it continue from the carry, never from the
    identity again."""
    if carry is None and method == "reduce":
        return ufunc.reduce(part, axis=axis, dtype=dtype).astype(out_kind, copy=False)
    if carry is not None:
        part = np.concatenate([np.expand_dims(carry, axis),
                               part.astype(out_kind, copy=False)], axis=axis)
    return np.take(ufunc.reduceat(part, [0], axis=axis, dtype=dtype), 0,
                   axis=axis).astype(out_kind, copy=False)
