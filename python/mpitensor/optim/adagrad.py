"""Adagrad (learning-rate decay, weight decay, initial accumulator value,
maximize), as torch.optim.Adagrad."""

from __future__ import annotations

import numpy as np

from .._dtensor import DTensor
from .adam import _real_view
from .optimizer import Optimizer, check_implementation

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """Adagrad, torch.optim.Adagrad's update on each local shard::

        g = -grad if maximize else grad;  g += weight_decay * p
        clr = lr / (1 + (step - 1) * lr_decay)
        sum += g * g;  p -= clr * g / (sqrt(sum) + eps)

    State, made when the parameter joins the optimizer as torch's: ``"step"``
    (a float, 0 before the first step) and ``"sum"``, a DTensor with the
    parameter's placements filled with ``initial_accumulator_value``. A complex
    parameter is a pair of reals, as in torch. A parameter whose ``.grad`` is
    None is skipped. ``foreach`` and ``fused`` are accepted, as torch scripts pass
    them, and change nothing. A step moves only a gradient backward left in other
    placements than its parameter (once, see :func:`local_grad`); it agrees with
    the other ranks that they step alike (:meth:`Optimizer.step`).

    Example::

        >>> opt = mpitensor.optim.Adagrad(model.parameters(), lr=0.01, lr_decay=1e-4)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, foreach=None, *, maximize: bool = False,
                 differentiable: bool = False, fused=None) -> None:
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= lr_decay:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= initial_accumulator_value:
            raise ValueError(f"Invalid initial_accumulator_value value: "
                             f"{initial_accumulator_value}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        check_implementation(foreach, fused, differentiable)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      foreach=foreach, maximize=maximize,
                                      differentiable=differentiable, fused=fused))

    def add_param_group(self, param_group: dict) -> None:
        """Adds a group of parameters (see :meth:`Optimizer.add_param_group`) and
        makes their state: step 0 and the accumulator. Local.

        Example: ``opt.add_param_group({"params": [head.weight], "lr": 1e-3})``.
        """
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for p in group["params"]:
            self.state[p] = {"step": 0.0, "sum": self._filled(p, group)}

    @staticmethod
    def _filled(p: DTensor, group: dict) -> DTensor:
        local = p._data()
        value = group["initial_accumulator_value"]
        fill = complex(value, value) if local.dtype.kind == "c" else value
        return DTensor(np.full(local.shape, fill, local.dtype), p._spec)

    def _update(self, p, g, state, group) -> None:
        local = p._data()
        if "sum" not in state:  # a group put in param_groups by hand
            state.update(step=0.0, sum=self._filled(p, group))
        state["step"] = step = float(state["step"]) + 1
        if group["maximize"]:
            g = -g
        if group["weight_decay"] != 0:
            g = g + group["weight_decay"] * local
        clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        acc = state["sum"]._data()
        param = local
        if local.dtype.kind == "c":
            # A local array that is not C-contiguous is updated through a copy.
            local = _real_view(np.ascontiguousarray(local))
            g = _real_view(np.ascontiguousarray(g))
            acc = _real_view(acc)
        acc += g * g
        std = np.sqrt(acc)
        std += group["eps"]
        local -= clr * (g / std)
        if not np.shares_memory(local, param):
            np.copyto(param, local.view(param.dtype).reshape(param.shape))
