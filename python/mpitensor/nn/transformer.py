"""A pre-norm GPT-style transformer block and its feed-forward network."""

from __future__ import annotations

import numpy as np

from .activation import GELU, ReLU
from .attention import MultiheadAttention
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .normalization import LayerNorm, RMSNorm

__all__ = ["FeedForward", "TransformerBlock"]


class FeedForward(Module):
    """``w2(act(w1(x)))``: the MLP of a transformer block. Megatron's plan shards
    ``w1`` column-wise and ``w2`` row-wise: one all-reduce per forward.

    Construction is local. The forward is local on ndarrays and on DTensors that
    need no communication; collective on the mesh otherwise (as laid out by
    :func:`~mpitensor.parallel.parallelize_module`).

    Example::

        >>> FeedForward(8, 32)(np.ones((2, 8))).shape
        (2, 8)
    """

    def __init__(self, dim: int, hidden_dim: int, bias: bool = True,
                 activation: str = "gelu", dtype=np.float64):
        super().__init__()
        self.w1 = Linear(dim, hidden_dim, bias, dtype)
        if activation == "gelu":
            self.act = GELU()
        elif activation == "gelu_tanh":
            self.act = GELU(approximate="tanh")
        elif activation == "relu":
            self.act = ReLU()
        else:
            raise ValueError(f"activation must be 'gelu', 'gelu_tanh' or 'relu', got "
                             f"{activation!r}")
        self.w2 = Linear(hidden_dim, dim, bias, dtype)

    def forward(self, x):
        return self.w2(self.act(self.w1(x)))


class TransformerBlock(Module):
    """``h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))``.

    Children: ``attention_norm``, ``attention`` (:class:`MultiheadAttention`,
    causal), ``ffn_norm``, ``feed_forward`` (:class:`FeedForward`, hidden
    ``4 * dim`` by default) and ``dropout`` on both residual branches. ``norm`` is
    "layer" or "rms".

    Construction is local. The forward is local on ndarrays and on DTensors that
    need no communication; collective on the mesh otherwise (as laid out by
    :func:`~mpitensor.parallel.parallelize_module`).

    Example::

        >>> TransformerBlock(16, 4)(np.ones((1, 6, 16))).shape
        (1, 6, 16)
    """

    def __init__(self, dim: int, num_heads: int, hidden_dim: int | None = None,
                 norm: str = "layer", activation: str = "gelu", bias: bool = True,
                 fused_qkv: bool = False, causal: bool = True, dropout: float = 0.0,
                 dtype=np.float64):
        super().__init__()
        if norm not in ("layer", "rms"):
            raise ValueError(f"norm must be 'layer' or 'rms', got {norm!r}")
        make_norm = LayerNorm if norm == "layer" else RMSNorm
        self.attention_norm = make_norm(dim, dtype=dtype)
        self.attention = MultiheadAttention(dim, num_heads, bias, fused_qkv, causal,
                                            dropout, dtype)
        self.ffn_norm = make_norm(dim, dtype=dtype)
        self.feed_forward = FeedForward(dim, hidden_dim or 4 * dim, bias, activation, dtype)
        self.dropout = Dropout(dropout)

    def forward(self, x):
        h = x + self.dropout(self.attention(self.attention_norm(x)))
        return h + self.dropout(self.feed_forward(self.ffn_norm(h)))
