"""The operations that may leave their block to be computed later
(mpitensor._deferred), and the reductions that read such a block's operands.

``np.isnan(x)`` and ``np.where(mask, s, x)`` (a bool mask laid out as ``x``, a
scalar ``s``) defer on a rank whose blocks are their DTensors' own arrays and large
enough, while no tool traces and NumPy's error state raises on nothing. Nothing
moves either way, so each rank may choose by itself. ``max``/``min`` of such a
where, whose scalar is the extreme's identity (-inf, +inf), read the operands: with
``isnan(x)`` as the mask, the extreme of ``x`` itself where it holds no NaN (and
then the mask is known all False); with a mask array, the extreme of ``x`` over the
elements the mask leaves it. A result with a zero or a NaN, whose bits follow the
order of the comparisons, is the eager one, from the blocks computed.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _C, _modes
from .._deferred import Deferred
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._algorithms import _dispatch as D
from ..placement_types import Replicate, Shard

__all__ = ["isnan", "where", "extreme"]

# Below this many elements a block is as quick to write as to defer (the C door
# sends isnan of a block this large here).
MIN_SIZE = _C.DEFER_MIN_SIZE
_BOOL = np.dtype(np.bool_)
_PLAIN = (Shard, Replicate)


def _plain(t) -> bool:
    """A DTensor this rank may defer on: no gradient, Shard or Replicate placements
    only (its reduction then reads the block as it is), C-contiguous."""
    spec = t._spec
    return (not t._requires_grad and spec.stride == contiguous_strides(spec.shape)
            and all(type(p) in _PLAIN for p in spec.placements))


def _quiet() -> bool:
    """No tool traces, and NumPy's error state raises on nothing: then the eager
    call makes no collective either (the executor agrees after a local function
    only under a raising error state)."""
    return not _modes.tracing and not _C.errstate_raises()


def _owned(t):
    """``t``'s block when only ``t`` holds it (no view, no copy-view: _C.exclusive)
    and it is large enough, else None."""
    if not _C.exclusive(t):
        return None
    block = t._local_tensor
    return block if block.size >= MIN_SIZE else None


def isnan(x):
    """``np.isnan(x)`` as a DTensor whose block waits, or None to compute it now.
    Local.

    Example: ``isnan(x)`` is None for an ``x`` of a few elements.
    """
    if type(x) is not DTensor or x._spec.dtype.kind != "f" or not _plain(x) or not _quiet():
        return None
    _C.settle_deferred()
    block = _owned(x)
    if block is None:
        return None
    pending = Deferred(np.isnan, (block,))
    _C.defer(pending)
    spec = x._spec
    return DTensor(pending, DTensorSpec(spec.mesh, spec.placements, spec.shape, _BOOL,
                                        spec.stride))


def where(condition, x, y):
    """``np.where(condition, x, y)`` as a DTensor whose block waits, or None to
    compute it now. Local.

    Example: ``where(mask, np.inf, x)`` for a mask and an ``x`` that own their blocks.
    """
    # First what costs least and turns most calls away: a small mask (one of
    # another shape than the tensor's is turned away below anyway).
    if type(condition) is not DTensor or math.prod(condition._spec.shape) < MIN_SIZE:
        return None
    tensor, scalar = (x, y) if type(x) is DTensor and type(y) is not DTensor else (y, x)
    if type(tensor) is not DTensor or not _plain(condition) or not _plain(tensor) or not _quiet():
        return None
    spec, cspec = tensor._spec, condition._spec
    if (cspec.dtype != _BOOL or cspec.shape != spec.shape or cspec.mesh is not spec.mesh
            or cspec.placements != spec.placements):
        return None
    # A waiting isnan of `tensor` is the mask as it is: taken out while this is
    # decided, and back if it is not deferred.
    mask = _C.claim_deferred(condition)
    made = None
    try:
        made = _where(condition, tensor, scalar, x is tensor, mask)
    finally:
        if mask is not None and made is None:
            _C.defer(mask)
    return made


def _where(condition, tensor, scalar, tensor_first, mask):
    spec = tensor._spec
    if type(scalar) is DTensor:
        if (scalar.ndim or scalar._requires_grad or scalar._spec.mesh is not spec.mesh
                or not all(p.is_replicate() for p in scalar._spec.placements)):
            return None
        scalar = scalar._data()
    if type(scalar) is np.ndarray:
        if scalar.ndim:
            return None
        scalar = scalar.copy()
    elif not D.is_scalar(scalar):
        return None
    if np.result_type(scalar, spec.dtype) != spec.dtype:
        return None
    if mask is not None:
        if mask.func is not np.isnan or mask.operands[0] is not tensor._local_tensor:
            return None
        block = mask.operands[0]  # frozen since the isnan, by it
    else:
        _C.settle_deferred()
        block, mask = _owned(tensor), _owned(condition)
        if block is None or mask is None:
            return None
    pending = Deferred(np.where, (mask, block, scalar) if tensor_first else (mask, scalar, block))
    _C.defer(pending)
    return DTensor(pending, spec)


def extreme(func, local, a, axes, keepdims, largest):
    """max (``largest``) or min (``func``, whose local reduction is ``local``) of
    ``a`` along ``axes``, read from the operands of its waiting where, or None to
    reduce ``a`` as it is. Collective as the reduction is.

    Example: ``extreme(np.min, local_min, np.where(mask, np.inf, x), (0,), False, False)``.
    """
    pending = _C.claim_deferred(a)
    if pending is None:
        return None
    try:
        return _extreme(func, local, a, pending, axes, keepdims, largest)
    finally:
        _C.defer(pending)


def _extreme(func, local, a, pending, axes, keepdims, largest):
    if pending.func is not np.where or a._spec.dtype.kind != "f":
        return None
    mask, first, second = pending.operands
    block, scalar = (second, first) if np.ndim(first) == 0 else (first, second)
    if scalar != (-np.inf if largest else np.inf):
        return None
    if type(mask) is Deferred:
        def reduce(arr, axis=None, keepdims=False):
            r = local(_same(arr, block), axis=axis, keepdims=keepdims)
            if np.isnan(r).any():
                return local(pending.result(), axis=axis, keepdims=keepdims)
            mask.nan_free = True  # every element of the block lies in a lane of r
            return r
    else:
        # The selection takes `block` everywhere when the scalar stands first and
        # the mask is all False, or stands second and the mask is all True.
        if not mask.any() if np.ndim(first) == 0 else mask.all():
            def reduce(arr, axis=None, keepdims=False):
                return local(_same(arr, block), axis=axis, keepdims=keepdims)
        else:
            taken = ~mask if np.ndim(first) == 0 else mask
            ufunc = np.maximum if largest else np.minimum

            def reduce(arr, axis=None, keepdims=False):
                r = ufunc.reduce(_same(arr, block), axis=axis, keepdims=keepdims,
                                 where=taken, initial=scalar)
                if np.count_nonzero(r) == np.size(r) and not np.isnan(r).any():
                    return r
                return local(pending.result(), axis=axis, keepdims=keepdims)
    return D.execute(func, (DTensor(block, a._spec),), local=reduce, axis=axes,
                     keepdims=keepdims)


def _same(arr, block):
    """``block``, which the executor passes on unmoved: the reduction of a Shard or
    Replicate input moves nothing."""
    if arr is not block:
        raise RuntimeError("a deferred selection's operand was moved before its reduction")
    return arr
