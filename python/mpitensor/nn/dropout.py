"""Dropout: random zeroing in training, identity in eval mode."""

from __future__ import annotations

from . import functional as F
from .module import Module

__all__ = ["Dropout"]


class Dropout(Module):
    """torch.nn.Dropout for NumPy. The mask depends only on the seed and each
    element's global index, so a sharded input drops what the whole array would.

    Local: construction and forward never communicate (the mask needs none).

    Example::

        >>> Dropout(0.1).eval()(np.ones(3))
        array([1., 1., 1.])
    """

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = float(p)

    def forward(self, input):
        return F.dropout(input, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
