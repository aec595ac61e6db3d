"""Linear: ``y = x @ weight.T + bias`` with torch's weight layout (out, in)."""

from __future__ import annotations

import math

import numpy as np

from . import _init
from . import functional as F
from .module import Module, Parameter

__all__ = ["Linear"]


class Linear(Module):
    """torch.nn.Linear for NumPy: weight ``(out_features, in_features)``, bias
    ``(out_features,)``, both uniform in ±1/sqrt(in_features) as torch's default
    (drawn from mpitensor's generator: reproducible with ``manual_seed``).

    ColwiseParallel shards weight and bias on dim 0 (the output features);
    RowwiseParallel shards the weight on dim 1 and replicates the bias.

    Construction is local. The forward is local on ndarrays and on DTensors that
    need no communication; collective on the mesh otherwise (as laid out by
    :func:`~mpitensor.parallel.parallelize_module`).

    Example::

        >>> Linear(3, 4)(np.ones((2, 3))).shape
        (2, 4)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype=np.float64):
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
        self.weight = Parameter(_init.uniform((out_features, in_features), -bound, bound,
                                              dtype))
        if bias:
            self.bias = Parameter(_init.uniform((out_features,), -bound, bound, dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")
