"""Adam and AdamW (amsgrad, weight decay, maximize), as torch.optim.Adam/AdamW."""

from __future__ import annotations

import math

import numpy as np

from ..nn import _ckernels, _kernels
from .optimizer import Optimizer, check_implementation, zeros_like_param

__all__ = ["Adam", "AdamW"]


_FLOAT = (np.dtype(np.float32), np.dtype(np.float64))


def _real_view(a: np.ndarray) -> np.ndarray:
    """A C-contiguous complex array as its (real, imaginary) pairs, sharing its
    memory."""
    return a.reshape(-1).view(a.real.dtype)


def _fused_fits(*arrays) -> bool:
    """Whether mpitensor.nn._ckernels.adam_update takes these local arrays (None allowed):
    C-contiguous, aligned, writeable float32/float64 of one dtype and size, with the
    kernels on (``MPITENSOR_NN_KERNELS=0`` compares the NumPy statements)."""
    first = arrays[0]
    return _kernels.enabled and first.dtype in _FLOAT and all(
        a is None or (type(a) is np.ndarray and a.dtype == first.dtype
                      and a.size == first.size and a.flags.c_contiguous and a.flags.aligned
                      and a.flags.writeable) for a in arrays)


class Adam(Optimizer):
    """Adam, torch.optim.Adam's update on each local shard::

        g = -grad if maximize else grad;  g += weight_decay * p
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        p -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

    (with ``amsgrad``, ``v``'s running maximum in the denominator). State:
    ``"step"`` (a float), ``"exp_avg"``, ``"exp_avg_sq"`` and, with amsgrad,
    ``"max_exp_avg_sq"``: DTensors with the parameter's placements. A parameter
    whose ``.grad`` is None is skipped. ``foreach``, ``fused`` and ``capturable``
    are accepted, as torch scripts pass them, and change nothing (float32 and
    float64 shards take one C pass whatever they say). A step moves only a gradient
    backward left in other placements than its parameter (once; torch's Adam moves
    it three times); it agrees with the other ranks that they step alike (:meth:`Optimizer.step`).

    Example::

        >>> opt = mpitensor.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *,
                 maximize: bool = False, foreach=None, capturable: bool = False,
                 differentiable: bool = False, fused=None) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        check_implementation(foreach, fused, differentiable)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, foreach=foreach,
                                      capturable=capturable, differentiable=differentiable,
                                      fused=fused))

    def _update(self, p, g, state, group) -> None:
        local = p._data()
        lr, (beta1, beta2), eps, wd = (group["lr"], group["betas"], group["eps"],
                                       group["weight_decay"])
        if not state:
            state["step"] = 0.0
            state["exp_avg"] = zeros_like_param(p)
            state["exp_avg_sq"] = zeros_like_param(p)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = zeros_like_param(p)
        state["step"] = step = float(state["step"]) + 1
        m, v = state["exp_avg"]._data(), state["exp_avg_sq"]._data()
        vmax = state["max_exp_avg_sq"]._data() if group["amsgrad"] else None
        step_size = lr / (1 - beta1 ** step)
        bias_correction2_sqrt = math.sqrt(1 - beta2 ** step)
        if _fused_fits(local, g, m, v, vmax):
            # One pass over the elements instead of about ten NumPy temporaries,
            # with the same operations in the same dtype (the same bits).
            _ckernels.adam_update(local, g, m, v, vmax,
                                  1 - lr * wd if self._decoupled and wd != 0 else 1.0,
                                  0.0 if self._decoupled else float(wd), beta1, beta2,
                                  step_size, bias_correction2_sqrt, eps, group["maximize"])
            return
        if group["maximize"]:
            g = -g
        if wd != 0:
            if self._decoupled:
                local *= 1 - lr * wd
            else:
                g = g + wd * local
        param = local
        if local.dtype.kind == "c":
            # As torch: a complex number is a pair of reals, each with its own moments.
            # A local array that is not C-contiguous is updated through a copy.
            local = np.ascontiguousarray(local)
            local, m, v = (_real_view(a) for a in (local, m, v))
            g = _real_view(np.ascontiguousarray(g))
        m += (1 - beta1) * (g - m)  # torch's lerp for a weight below 0.5
        v *= beta2
        v += (1 - beta2) * g * g
        if vmax is not None:
            vmax = _real_view(vmax) if vmax.dtype.kind == "c" else vmax
            np.maximum(vmax, v, out=vmax)
            v = vmax
        denom = np.sqrt(v) / bias_correction2_sqrt + eps
        local -= step_size * (m / denom)
        if not np.shares_memory(local, param):
            np.copyto(param, local.view(param.dtype).reshape(param.shape))


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay (``p *= 1 - lr * weight_decay``
    before the update, the gradient untouched), as torch.optim.AdamW, whose
    default ``weight_decay`` is 0.01. Making one is Local; a step moves only
    gradients in other placements than their parameters (see :class:`Adam`).

    Example::

        >>> opt = mpitensor.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    """

    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach=None, capturable: bool = False,
                 differentiable: bool = False, fused=None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         foreach=foreach, capturable=capturable,
                         differentiable=differentiable, fused=fused)
