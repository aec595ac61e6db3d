"""loss_parallel: cross entropy on logits sharded on the class dim, without
gathering them (the vocabulary-parallel loss of Megatron)."""

from __future__ import annotations

import contextlib

import numpy as np

from .. import _modes
from .._dtensor import DTensor
from .._dtensor_spec import contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..autograd import Function
from ..nn import functional as F
from ..placement_types import Partial, Replicate

__all__ = ["loss_parallel"]


@contextlib.contextmanager
def loss_parallel():
    """Inside this context, :func:`mpitensor.nn.functional.cross_entropy` on a DTensor
    of logits sharded on the class dim (``Shard(1)``, or ``Shard(0)`` for a 1-D
    input; the usual output of ``ColwiseParallel(use_local_output=False)``) computes
    the loss without gathering the logits: each rank finds its part of the
    log-sum-exp and of the target logits, combined by two all-reduces of one value
    per item (with ``label_smoothing``, the second also carries each rank's part
    of the weighted logit sum, so it stays two). The result is a Replicate
    DTensor. Collective on the logits' mesh.

    Example (``mpiexec -n 2``)::

        >>> logits = distribute_tensor(x, mesh, [Shard(1)])
        >>> with loss_parallel():
        ...     loss = F.cross_entropy(logits, target)      # loss.placements == (Replicate(),)
    """
    _modes.push_loss_parallel(sharded_cross_entropy)
    try:
        yield
    finally:
        _modes.pop_loss_parallel()


def sharded_cross_entropy(input, target, weight, ignore_index, reduction,
                          label_smoothing=0.0):
    """cross_entropy of a DTensor whose class dim is sharded; see loss_parallel.
    Its backward is local: each rank's part of ``softmax - onehot`` from the
    log-sum-exp the forward reduced, in the logits' placements (torch's
    loss_parallel backward communicates nothing either)."""
    return _ShardedCrossEntropy.apply(input, target, weight, ignore_index, reduction,
                                      label_smoothing)


class _ShardedCrossEntropy(Function):
    _gives_up_results = True

    @staticmethod
    def forward(ctx, input, target, weight, ignore_index, reduction, label_smoothing):
        return _forward(ctx, input, target, weight, ignore_index, reduction,
                        label_smoothing)

    @staticmethod
    def backward(ctx, g):
        local, big, total, lo, cd, pl = ctx.saved
        mesh = g.device_mesh
        p = np.exp(local - np.expand_dims(big, cd)) / np.expand_dims(total, cd)
        grad = F.softmax_grad(p, cd, g, lo, *ctx.args, ctx.n_classes)
        return (DTensor(grad.astype(local.dtype, copy=False), ctx.spec),
                None, None, None, None, None)


def _forward(ctx, input, target, weight, ignore_index, reduction, label_smoothing):
    F.check_target(input.shape, target, ignore_index)
    cd = F.class_dim(input.ndim)
    mesh = input.device_mesh
    x = F._without_partial(input)
    class_dims = [m for m, p in enumerate(x.placements) if p.is_shard(cd)]
    if any(not (p.is_replicate() or p.is_shard(cd)) for p in x.placements):
        raise ValueError(f"loss_parallel: the logits must be sharded on the class dim "
                         f"{cd} only (other mesh dims Replicate), got {x.placements}")
    item_shape = tuple(target.shape)
    pl = [Replicate()] * mesh.ndim

    def reduce(local, op):
        for m in class_dims:
            pl[m] = Partial(op)
        shape = local.shape
        dt = DTensor.from_local(np.ascontiguousarray(local), mesh, pl, shape=shape,
                                stride=contiguous_strides(shape))
        return dt.redistribute(mesh, [Replicate()] * mesh.ndim).to_local()

    local = F._float(x.to_local())
    _, offset = compute_local_shape_and_global_offset(x.shape, mesh, x.placements)
    lo, n = offset[cd] if local.shape[cd] else 0, local.shape[cd]
    if n:
        big = reduce(np.max(local, axis=cd), "max")
        summed = np.sum(np.exp(local - np.expand_dims(big, cd)), axis=cd)
        mine = (target >= lo) & (target < lo + n)
        idx = np.expand_dims(np.where(mine, target - lo, 0), cd)
        picked = np.where(mine, np.squeeze(np.take_along_axis(local, idx, cd), cd), 0.0)
    else:
        big = reduce(np.full(item_shape, -np.inf, local.dtype), "max")
        summed = np.zeros(item_shape, local.dtype)
        picked = np.zeros(item_shape, local.dtype)
    parts = [summed, picked]
    if label_smoothing:
        # Σ_c w_c x_c over this rank's classes, reduced with the others:
        # Σ_c -w_c log p_c = W lse - Σ_c w_c x_c, W the weight sum (C without).
        w_c = np.ones(n, local.dtype) if weight is None else \
            np.asarray(weight, local.dtype)[lo:lo + n]
        shape = [1] * local.ndim
        shape[cd] = n
        parts.append(np.sum(local * w_c.reshape(shape), axis=cd) if n
                     else np.zeros(item_shape, local.dtype))
    both = reduce(np.stack(parts), "sum")
    n_classes = input.shape[cd]
    ctx.saved = (local, big, both[0], lo, cd, x.placements)
    ctx.args = (target, weight, ignore_index, reduction, label_smoothing)
    ctx.n_classes = n_classes
    ctx.spec = x._spec._replace(dtype=local.dtype)
    lse = big + np.log(both[0])
    smooth = None
    if label_smoothing:
        total_w = n_classes if weight is None else float(np.sum(np.asarray(weight)))
        smooth = total_w * lse - both[2]
    out = F.reduce_loss(lse - both[1], target, weight, ignore_index, reduction, smooth,
                        label_smoothing, n_classes)
    return DTensor.from_local(np.asarray(out), mesh)
