"""TensorParallelMultiheadAttention: the attention module of the 2023 API."""

from __future__ import annotations

import numpy as np

from ..nn.attention import MultiheadAttention

__all__ = ["TensorParallelMultiheadAttention"]


class TensorParallelMultiheadAttention(MultiheadAttention):
    """Multi-head attention whose heads split over a 1-D mesh, as torch 2.0's
    module of the same name: q/k/v projections (or a fused ``qkv_proj``) and an
    output projection ``out_proj``, which ``PairwiseParallel`` shards column- and
    row-wise. ``forward(query, key=None, value=None, attn_mask=None)`` computes
    attention of ``query`` over ``key``/``value`` (self-attention when they are
    omitted; a fused projection requires it). :class:`mpitensor.nn.MultiheadAttention`
    modules are swapped for this one by ``PairwiseParallel``, keeping their
    parameters.

    Construction is local; once parallelized its forward is collective on the mesh
    (one all-reduce, in ``out_proj``).

    Example::

        >>> mha = TensorParallelMultiheadAttention(16, 4)
        >>> mha(np.ones((2, 5, 16))).shape
        (2, 5, 16)
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True, causal: bool = False, fused_qkv: bool = False,
                 tp_size: int = 1, dtype=np.float64):
        super().__init__(embed_dim, num_heads, bias, fused_qkv, causal, dropout, dtype)
        if tp_size <= 0 or num_heads % tp_size:
            raise ValueError(f"num_heads {num_heads} must be a multiple of tp_size {tp_size}")
        self.tp_size = tp_size

    @classmethod
    def from_module(cls, module: MultiheadAttention) -> "TensorParallelMultiheadAttention":
        """A TensorParallelMultiheadAttention with ``module``'s configuration, child
        modules and hooks (the parameters are shared, not copied). Local.

        Example: ``TensorParallelMultiheadAttention.from_module(MultiheadAttention(16, 4))``.
        """
        new = cls.__new__(cls)
        new.__dict__.update(module.__dict__)
        new.__dict__["tp_size"] = 1
        return new

    def forward(self, query, key=None, value=None, attn_mask=None):
        if key is None and value is None:
            return super().forward(query, attn_mask)
        key = query if key is None else key
        value = key if value is None else value
        if self.fused_qkv:
            raise ValueError("a fused qkv projection computes self-attention only: call "
                             "forward(query) or use separate q/k/v projections")
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            self._check_heads(proj, 1)
        projected = (self.q_proj(query), self.k_proj(key), self.v_proj(value))
        return self.out_proj(self._attend(projected, attn_mask))
