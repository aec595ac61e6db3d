"""LayerNorm and RMSNorm over the trailing dims."""

from __future__ import annotations

import numpy as np

from . import functional as F
from .module import Module, Parameter

__all__ = ["LayerNorm", "RMSNorm"]


def _shape(normalized_shape):
    if isinstance(normalized_shape, (int, np.integer)):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


class LayerNorm(Module):
    """torch.nn.LayerNorm for NumPy: weight ones and bias zeros of
    ``normalized_shape`` (with ``elementwise_affine``). Under SequenceParallel the
    parameters are Replicate and the input is sharded on the sequence dim: no
    communication.

    Construction is local. The forward is local on ndarrays and on DTensors that
    need no communication; collective on the mesh otherwise (as laid out by
    :func:`~mpitensor.parallel.parallelize_module`).

    Example::

        >>> LayerNorm(4)(np.arange(8.0).reshape(2, 4)).shape
        (2, 4)
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, dtype=np.float64):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        if elementwise_affine:
            self.weight = Parameter(np.ones(self.normalized_shape, dtype))
            self.bias = Parameter(np.zeros(self.normalized_shape, dtype)) if bias else None
            if not bias:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    """torch.nn.RMSNorm for NumPy: ``x / sqrt(mean(x**2) + eps) * weight``, weight
    ones of ``normalized_shape``.

    Construction is local. The forward is local on ndarrays and on DTensors that
    need no communication; collective on the mesh otherwise (as laid out by
    :func:`~mpitensor.parallel.parallelize_module`).

    Example::

        >>> RMSNorm(4)(np.ones((2, 4))).shape
        (2, 4)
    """

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, dtype=np.float64):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        if elementwise_affine:
            self.weight = Parameter(np.ones(self.normalized_shape, dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, input):
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"
