"""RMSprop (smoothing constant, weight decay, momentum, centered, maximize), as
torch.optim.RMSprop."""

from __future__ import annotations

import numpy as np

from .adam import _real_view
from .optimizer import Optimizer, check_implementation, lerp_, zeros_like_param

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """RMSprop, torch.optim.RMSprop's update on each local shard::

        g = -grad if maximize else grad;  g += weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        mean_g = lerp(mean_g, g, 1 - alpha)                         (centered)
        avg = sqrt(v - mean_g**2) if centered else sqrt(v)
        buf = momentum * buf + g / (avg + eps);  p -= lr * buf     (momentum > 0)
        p -= lr * g / (avg + eps)                                   (otherwise)

    State: ``"step"`` (a float), ``"square_avg"``, and ``"momentum_buffer"``
    (momentum > 0) and ``"grad_avg"`` (centered): DTensors with the parameter's
    placements. A complex parameter is a pair of reals, as in torch. A parameter
    whose ``.grad`` is None is skipped. ``foreach``, ``fused`` and ``capturable``
    are accepted, as torch scripts pass them, and change nothing: every update is
    one pass of NumPy statements per local shard. A step moves only a gradient
    backward left in other placements than its parameter (once); it agrees
    with the other ranks that they step alike (:meth:`Optimizer.step`).

    Example::

        >>> opt = mpitensor.optim.RMSprop(model.parameters(), lr=1e-3, momentum=0.9)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 capturable: bool = False, foreach=None, maximize: bool = False,
                 differentiable: bool = False, *, fused=None) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        check_implementation(foreach, fused, differentiable)
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps,
                                      centered=centered, weight_decay=weight_decay,
                                      capturable=capturable, foreach=foreach,
                                      maximize=maximize, differentiable=differentiable,
                                      fused=fused))

    def _update(self, p, g, state, group) -> None:
        local = p._data()
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        wd, momentum = group["weight_decay"], group["momentum"]
        if not state:
            state["step"] = 0.0
            state["square_avg"] = zeros_like_param(p)
        state["step"] = float(state["step"]) + 1
        # Made when first needed: a scheduler (OneCycleLR) may turn momentum on later.
        if momentum > 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = zeros_like_param(p)
        if group["centered"] and "grad_avg" not in state:
            state["grad_avg"] = zeros_like_param(p)
        if group["maximize"]:
            g = -g
        if wd != 0:
            g = g + wd * local
        v = state["square_avg"]._data()
        mean = state["grad_avg"]._data() if group["centered"] else None
        buf = state["momentum_buffer"]._data() if momentum > 0 else None
        param = local
        if local.dtype.kind == "c":
            # A local array that is not C-contiguous is updated through a copy.
            local = _real_view(np.ascontiguousarray(local))
            g = _real_view(np.ascontiguousarray(g))
            v, mean, buf = (None if a is None else _real_view(a) for a in (v, mean, buf))
        v *= alpha
        v += (1 - alpha) * g * g
        if mean is not None:
            lerp_(mean, g, 1 - alpha)
            avg = np.sqrt(v - mean * mean)
        else:
            avg = np.sqrt(v)
        avg += eps
        if buf is not None:
            buf *= momentum
            buf += g / avg
            local -= lr * buf
        else:
            local -= lr * (g / avg)
        if not np.shares_memory(local, param):
            np.copyto(param, local.view(param.dtype).reshape(param.shape))
