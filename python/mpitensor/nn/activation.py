"""Pointwise activations: GELU, ReLU and SiLU."""

from __future__ import annotations

from . import functional as F
from .module import Module

__all__ = ["GELU", "ReLU", "SiLU"]


class GELU(Module):
    """torch.nn.GELU: exact (``approximate="none"``) or tanh-approximated.

    Local: construction and forward never communicate (element-wise).

    Example::

        >>> GELU(approximate="tanh")(np.zeros(2))
        array([0., 0.])
    """

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class ReLU(Module):
    """torch.nn.ReLU: max(x, 0).

    Local: construction and forward never communicate (element-wise).

    Example::

        >>> ReLU()(np.array([-1.0, 2.0]))
        array([0., 2.])
    """

    def forward(self, input):
        return F.relu(input)


class SiLU(Module):
    """torch.nn.SiLU: x * sigmoid(x) (the gate of SwiGLU).

    Local: construction and forward never communicate (element-wise).

    Example::

        >>> SiLU()(np.array([0.0]))
        array([0.])
    """

    def forward(self, input):
        return F.silu(input)
