"""Megatron-style multi-head self-attention whose heads split over ranks.

The projections are Linear modules, so a tensor-parallel plan shards them like
any Linear: q/k/v (or the fused qkv) column-wise, the output projection row-wise.
Each rank then holds whole heads: the forward infers its number of heads from the
width of its projection outputs (``width // head_dim``), as Megatron does with
``num_heads // tp_size``, and computes attention for its heads only.

The fused projection ``qkv_proj`` has ``3 * embed_dim`` output rows laid out per
head as ``(num_heads, 3, head_dim)`` (q, k, v of head 0, then of head 1, ...), so
that a column-wise split keeps each head's q, k and v together.
"""

from __future__ import annotations

import numpy as np

from .. import _modes
from .._bind import core
from ..autograd import Function
from . import _kernels
from . import functional as F
from .linear import Linear
from .module import Module

__all__ = ["MultiheadAttention"]


class MultiheadAttention(Module):
    """Self-attention: ``out_proj(sdpa(q_proj(x), k_proj(x), v_proj(x)))`` over
    ``num_heads`` heads of ``embed_dim // num_heads``, on inputs ``(..., S, E)``.

    ``fused_qkv=True`` uses one ``qkv_proj`` Linear(E, 3E) instead of three;
    ``causal=True`` masks future positions. Under tensor parallelism a rank must
    hold whole heads: a split of the projections that cuts a head is a ValueError
    on every rank (e.g. 3 heads of size 4 over 2 ranks: torch.chunk gives each rank
    6 rows, one and a half heads).

    Construction is local. The forward is local on ndarrays and on DTensors that
    need no communication; collective on the mesh otherwise (as laid out by
    :func:`~mpitensor.parallel.parallelize_module`). Inside
    ``context_parallel`` its attention is ring attention, and on DTensors it
    trains through ring attention's backward.

    Example::

        >>> attn = MultiheadAttention(8, 2, causal=True)
        >>> attn(np.ones((1, 5, 8))).shape
        (1, 5, 8)
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True,
                 fused_qkv: bool = False, causal: bool = False, dropout: float = 0.0,
                 dtype=np.float64):
        super().__init__()
        if num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} must be a positive multiple of "
                             f"num_heads {num_heads}")
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.fused_qkv, self.causal, self.dropout = bool(fused_qkv), bool(causal), dropout
        if fused_qkv:
            self.qkv_proj = Linear(embed_dim, 3 * embed_dim, bias, dtype)
        else:
            self.q_proj = Linear(embed_dim, embed_dim, bias, dtype)
            self.k_proj = Linear(embed_dim, embed_dim, bias, dtype)
            self.v_proj = Linear(embed_dim, embed_dim, bias, dtype)
        self.out_proj = Linear(embed_dim, embed_dim, bias, dtype)

    def forward(self, x, attn_mask=None):
        if self.fused_qkv:
            self._check_heads(self.qkv_proj, 3)
            projected = (self.qkv_proj(x),)
        else:
            for proj in (self.q_proj, self.k_proj, self.v_proj):
                self._check_heads(proj, 1)
            projected = (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        return self.out_proj(self._attend(projected, attn_mask))

    def _attend(self, projected, attn_mask):
        """Attention of this rank's heads, on local arrays; DTensor projections
        give a DTensor of the query's placements (its last dim is whole heads)."""
        if not F._is_dt(projected[0]):
            return self._attend_local([np.asarray(p) for p in projected], attn_mask)
        return _Attend.apply(self, attn_mask, *projected)

    def _heads(self, projected):
        """q, k, v as contiguous (..., heads, L, head_dim) arrays of local projections."""
        d = self.head_dim
        if self.fused_qkv:
            (y,) = projected
            width = self._local_width(y.shape[-1], 3 * d)
            y = y.reshape(y.shape[:-1] + (width // (3 * d), 3, d))
            return [np.ascontiguousarray(np.moveaxis(y[..., i, :], -2, -3)) for i in range(3)]
        heads = [p.reshape(p.shape[:-1] + (p.shape[-1] // d, d)) for p in projected]
        return [np.ascontiguousarray(np.moveaxis(h, -2, -3)) for h in heads]

    def _attend_local(self, projected, attn_mask, saved=None):
        d = self.head_dim
        if self.fused_qkv:
            q, k, v = self._heads(projected)
        else:
            for p in projected:
                self._local_width(p.shape[-1], d)
            heads = [p.reshape(p.shape[:-1] + (p.shape[-1] // d, d)) for p in projected]
            p = self.dropout if self.training else 0.0
            if attn_mask is None and p == 0.0 and _modes.context_parallel() is None:
                # The C kernel reads each head where the projection wrote it and
                # writes the heads side by side: no transposing copies.
                out = _kernels.attention_heads(*heads, 1.0 / np.sqrt(d), self.causal)
                if out is not None:
                    return out
            # Contiguous heads: the batched matmuls run faster than on strided views.
            q, k, v = (np.ascontiguousarray(np.moveaxis(h, -2, -3)) for h in heads)
        p = self.dropout if self.training else 0.0
        causal = self.causal and attn_mask is None
        if saved is None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask, p, causal)
        else:  # what that gives on ndarrays, keeping the dropout mask for backward
            o = F._sdpa_local(q, k, v, attn_mask, p, causal, None, None, saved)
        o = np.moveaxis(o, -3, -2)
        return np.ascontiguousarray(o.reshape(o.shape[:-2] + (-1,)))

    def _grads_in_place(self, projected, g, attn_mask, p):
        """The projections' gradients for the attention output's gradient ``g``
        (local arrays), each in its projection's layout, by the C kernel reading
        the heads where the projections wrote them (the fused qkv's three slices
        of one array); None when it does not apply (a mask, dropout, other dtypes)."""
        if attn_mask is not None or p > 0.0:
            return None
        d = self.head_dim
        if self.fused_qkv:
            (y,) = projected
            y = y.reshape(y.shape[:-1] + (y.shape[-1] // (3 * d), 3, d))
            gy = np.empty(y.shape, y.dtype)
            out = [gy[..., i, :] for i in range(3)]
            done = _kernels.attention_heads_backward(
                *(y[..., i, :] for i in range(3)), g, 1.0 / np.sqrt(d), self.causal, out)
            return None if done is None else [gy.reshape(gy.shape[:-3] + (-1,))]
        heads = [a.reshape(a.shape[:-1] + (a.shape[-1] // d, d)) for a in projected]
        grads = _kernels.attention_heads_backward(*heads, g, 1.0 / np.sqrt(d), self.causal)
        return None if grads is None else [x.reshape(x.shape[:-2] + (-1,)) for x in grads]

    def _local_width(self, width: int, unit: int) -> int:
        if width % unit:
            raise ValueError(
                f"MultiheadAttention: this rank's projection output has {width} features, "
                f"not a multiple of {unit} (whole heads of head_dim {self.head_dim}); "
                f"the tensor-parallel split must not cut a head")
        return width

    def _check_heads(self, proj: Linear, per_head: int) -> None:
        """Every rank's rows of a sharded projection weight must be whole heads; the
        verdict depends only on the spec, so every rank raises together."""
        w = proj.weight
        if not F._is_dt(w):
            return
        unit = per_head * self.head_dim
        rows = w.shape[0]
        for m, p in enumerate(w.placements):
            if p.is_shard(0):
                n = w.device_mesh.size(m)
                sizes = list(core.chunk_sizes(rows, n))
                if any(s % unit for s in sizes):
                    raise ValueError(
                        f"MultiheadAttention with {self.num_heads} heads of size "
                        f"{self.head_dim}: sharding {rows} projection rows over {n} ranks "
                        f"gives {sizes} rows per rank, which cuts a head (each rank needs a "
                        f"multiple of {unit}); use a number of heads the ranks can split")

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"fused_qkv={self.fused_qkv}, causal={self.causal}")


class _Attend(Function):
    """MultiheadAttention's attention of this rank's heads on DTensor projections,
    on local arrays: the output has the query's placements, and the backward gives
    each projection's gradient in that projection's placements (whole heads per
    rank, so no communication beyond making the output's gradient match)."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, module, attn_mask, *projected):
        outs = [F._without_partial(p) for p in projected]
        q = outs[0]  # the output has the query's positions and layout
        saved = {} if any(ctx.needs_input_grad) else None
        cp = _modes.context_parallel()
        ctx.module, ctx.attn_mask, ctx.outs = module, attn_mask, outs
        ctx.p = module.dropout if module.training else 0.0
        ctx.ring = None
        if saved is not None and cp is not None:
            # Ring attention keeps its own state (q, k, v, out, log-sum-exp) for a
            # backward that goes around the ring again.
            for p in outs:
                module._local_width(p.to_local().shape[-1], module.head_dim)
            heads = module._heads([p.to_local() for p in outs])
            o, ctx.ring = cp.sdpa_forward(*heads, attn_mask, ctx.p, module.causal, None,
                                          cp.layout_problem(outs))
            ctx.cp = cp
            o = np.moveaxis(o, -3, -2)
            local = np.ascontiguousarray(o.reshape(o.shape[:-2] + (-1,)))
        else:
            local = module._attend_local([p.to_local() for p in outs], attn_mask, saved)
        ctx.keep = None if saved is None else saved.get("keep")
        # The output is as wide as the query's heads: embed_dim on the query's mesh,
        # this rank's heads when the projections are local DTensors (grad-mode
        # to_local of a tensor-parallel projection), whose shape is the local one.
        width = q.shape[-1] // 3 if module.fused_qkv else q.shape[-1]
        shape = tuple(q.shape[:-1]) + (width,)
        return F._wrap_like(q.device_mesh, q.placements, shape, local)

    @staticmethod
    def backward(ctx, g):
        module, outs = ctx.module, ctx.outs
        q = outs[0]
        mesh = q.device_mesh
        if g.placements != q.placements:
            g = g.redistribute(mesh, q.placements)
        if mesh.get_coordinate() is None:
            return (None, None) + tuple(
                F._wrap_like(mesh, o.placements, o.shape, np.empty((0,), o.dtype))
                for o in outs)
        d = module.head_dim
        gl = g._data()
        gh = np.moveaxis(gl.reshape(gl.shape[:-1] + (gl.shape[-1] // d, d)), -2, -3)
        local = None if ctx.ring is not None else module._grads_in_place(
            [o._data() for o in outs], gl, ctx.attn_mask, ctx.p)
        if local is not None:
            return (None, None) + tuple(F._wrap_like(mesh, o.placements, o.shape, x)
                                        for o, x in zip(outs, local))
        if ctx.ring is not None:
            grads = ctx.cp.sdpa_backward(ctx.ring, gh)
        else:
            heads = module._heads([o._data() for o in outs])
            causal = module.causal and ctx.attn_mask is None
            grads = F._sdpa_backward(*heads, gh, ctx.attn_mask, ctx.p, causal, None,
                                     ctx.keep)
        grads = [np.moveaxis(x, -3, -2) for x in grads]
        if module.fused_qkv:
            y = np.stack(grads, axis=-2)
            grads = [y.reshape(y.shape[:-3] + (-1,))]
        else:
            grads = [x.reshape(x.shape[:-2] + (-1,)) for x in grads]
        return (None, None) + tuple(
            F._wrap_like(mesh, o.placements, o.shape, np.ascontiguousarray(x, o.dtype))
            for o, x in zip(outs, grads))
