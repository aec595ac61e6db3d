"""The nn kernels of ``csrc/kernels`` (mpitensor/kernels/kernels.h): GELU, row
softmax, layer norm, an Adam step, gemm and attention through a BLAS handed in.
Callers: :mod:`mpitensor.nn._ckernels`."""

from __future__ import annotations

from .._clib import A, D, E, I, I64, fn, struct

Blas, AttnOperand, AttnShape, AdamHyper = map(struct, (
    "mt_blas", "mt_attn_operand", "mt_attn_shape", "mt_adam_hyper"))


mt_blas_check = fn("mt_blas_check", I, Blas, E)
mt_blas_available = fn("mt_blas_available", I, Blas)
mt_gemm = fn("mt_gemm", I, Blas, I, I, I64, I64, I64, D, A, I64, A, I64, D, A,
            I64, E)
mt_gelu = fn("mt_gelu", I, I, I, I64, A, A, E)
mt_gelu_backward = fn("mt_gelu_backward", I, I, I, I64, A, A, A, E)
mt_softmax_rows = fn("mt_softmax_rows", I, I, I, I64, I64, A, A, E)
mt_layer_norm_rows = fn("mt_layer_norm_rows", I, I, I64, I64, A, A, A, D, A, E)
mt_adam_update = fn("mt_adam_update", I, I, I64, A, A, A, A, A, AdamHyper, E)
mt_attention = fn("mt_attention", I, Blas, I, AttnShape, *[AttnOperand] * 4, D, I, E)
mt_attention_backward = fn("mt_attention_backward", I, Blas, I, AttnShape, *[AttnOperand] * 7, D,
                          I, E)
