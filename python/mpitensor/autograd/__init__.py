"""Reverse-mode automatic differentiation of programs on DTensors (torch.autograd's
semantics, torch DTensor's gradient placements).

Importing it installs the engine (mpitensor._modes.autograd) and the backward
rules of the operations (``_rules``). See docs/training.md for the rules and their
placements.

Example (``mpiexec -n 2``)::

    >>> w = mpitensor.distribute_tensor(np.ones((4, 3)), mesh, [Shard(0)],
    ...                                 requires_grad=True)
    >>> (w * w).sum().backward()
    >>> w.grad.placements
    (Shard(dim=0),)
"""

from __future__ import annotations

from .. import _modes
# Each rules module registers its backwards when imported.
from . import _engine, _fft_rules, _order_rules, _rules, _shape_rules  # noqa: F401
from ._engine import Node, backward, grad
from ._function import Function, FunctionCtx
from ._grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled

__all__ = ["Node", "Function", "FunctionCtx", "backward", "grad", "no_grad", "enable_grad", "set_grad_enabled",
           "is_grad_enabled"]

_modes.install_autograd(_engine)
