"""SGD with momentum, dampening, Nesterov momentum, weight decay and maximize, as
torch.optim.SGD."""

from __future__ import annotations

import numpy as np

from .optimizer import Optimizer, check_implementation, required, zeros_like_param

__all__ = ["SGD"]


class SGD(Optimizer):
    """Stochastic gradient descent, torch.optim.SGD's update on each local shard::

        g = -grad if maximize else grad;  g += weight_decay * p
        buf = g (first step) or momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf   (when momentum != 0)
        p -= lr * g

    ``state[p]["momentum_buffer"]`` is a DTensor with ``p``'s placements (only
    when momentum is not 0). A parameter whose ``.grad`` is None is skipped.
    ``foreach`` and ``fused`` are accepted, as torch scripts pass them, and
    change nothing.
    A step moves only a gradient backward left in other placements than its
    parameter (once, as torch's); it agrees with the other ranks that they step alike
    (:meth:`Optimizer.step`).

    Example::

        >>> opt = mpitensor.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 *, maximize: bool = False, foreach=None, differentiable: bool = False,
                 fused=None) -> None:
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        check_implementation(foreach, fused, differentiable)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize, foreach=foreach,
                                      differentiable=differentiable, fused=fused))

    def _update(self, p, g, state, group) -> None:
        local = p._data()
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        if group["maximize"]:
            g = -g
        if wd != 0:
            g = g + wd * local
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = zeros_like_param(p)
                np.copyto(buf._data(), g)
            else:
                b = buf._data()
                b *= momentum
                b += (1 - group["dampening"]) * g
            g = g + momentum * buf._data() if group["nesterov"] else buf._data()
        local -= lr * g
