"""The nn kernels of csrc/kernels (mpitensor/kernels/kernels.h) on NumPy arrays, called
through ctypes in the ``_C`` object (:mod:`mpitensor._clib`).

Inputs must already be float32 or float64 of one dtype and laid out as each
function says: :mod:`._kernels` checks that and uses NumPy otherwise, so a
mismatch here is a TypeError or ValueError, never a silent copy. A failing kernel
raises the exception the extension raises for its status. ctypes releases the GIL
while a kernel runs. Every function is Local.

The BLAS that gemm and attention call is an ``mt_blas`` kept here. :func:`set_blas`
replaces it rather than changing it, so a kernel running in another thread keeps
the one it started with.
"""

from __future__ import annotations

import operator

import numpy as np

from .._clib import array as _array, call as _call
from .._bind.kernels import (Blas as _Blas, AttnOperand as _Operand, AttnShape as _Shape,
                             AdamHyper as _AdamHyper, mt_blas_check, mt_blas_available,
                             mt_gemm, mt_gelu, mt_gelu_backward, mt_softmax_rows,
                             mt_layer_norm_rows, mt_adam_update, mt_attention,
                             mt_attention_backward)


_blas = _Blas()


def have_blas() -> bool:
    """Whether gemm and attention can run (a BLAS is set)."""
    return bool(mt_blas_available(_blas))


def set_blas(sgemm: int, dgemm: int, ilp64: bool) -> None:
    """Makes the CBLAS gemms at these addresses (ints, as ctypes gives them from a
    library it loaded, which keeps it loaded) the BLAS of every gemm and attention;
    (0, 0, any) removes it."""
    global _blas
    blas = (_Blas(sgemm64=sgemm, dgemm64=dgemm) if ilp64
            else _Blas(sgemm=sgemm, dgemm=dgemm))
    _call(mt_blas_check, blas)
    _blas = blas


def _row_stride(a, name: str) -> int:
    """The row stride in elements of a 2-D gemm operand whose last dim is
    contiguous (or of size <= 1); its row length where it has no second row or no
    element (NumPy gives such dims any stride, and they are never used)."""
    size = a.itemsize
    if a.ndim != 2 or (a.size and ((a.shape[1] > 1 and a.strides[1] != size)
                                   or a.strides[0] % size)):
        raise ValueError(f"gemm: {name} must be 2-D with a contiguous last dim")
    rows, cols = a.shape
    return a.strides[0] // size if a.size and rows > 1 else max(cols, 1)


def gemm(a, b, c, trans_b: bool, alpha: float, beta: float) -> None:
    """c = alpha a @ (b.T if trans_b else b) + beta c in place, for 2-D arrays
    a (m, k), b (k, n) or (n, k), c (m, n)."""
    dtype, lds = None, []
    for x, name in ((a, "a"), (b, "b"), (c, "c")):
        dtype = _array(x, name, dtype, strided=True)
        lds.append(_row_stride(x, name))
    trans_b = bool(trans_b)
    (m, k), n = a.shape, c.shape[1]
    if b.shape != ((n, k) if trans_b else (k, n)) or c.shape[0] != m:
        raise ValueError("gemm: shapes do not match")
    if not c.flags.writeable:
        raise ValueError("gemm: c must be writable")
    _call(mt_gemm, _blas, dtype, trans_b, m, n, k, float(alpha), a, lds[0], b, lds[1],
          float(beta), c, lds[2])


def gelu(x, approximate: int):
    """GELU of x as a new array: ``approximate`` 0 erf, 1 tanh."""
    dtype = _array(x, "gelu: x")
    y = np.empty(x.shape, x.dtype)
    _call(mt_gelu, dtype, operator.index(approximate), x.size, x, y)
    return y


def gelu_backward(x, g, approximate: int):
    """g * gelu'(x) as a new array; x and g of one dtype and size."""
    dtype = _array(x, "gelu_backward: x")
    _array(g, "gelu_backward: g", dtype)
    if g.size != x.size:
        raise ValueError(f"gelu_backward: g has {g.size} elements, x {x.size}")
    y = np.empty(x.shape, x.dtype)
    _call(mt_gelu_backward, dtype, operator.index(approximate), x.size, x, g, y)
    return y


def softmax(x, log: bool):
    """softmax (log false) or log_softmax of x along its last dim, as a new array."""
    dtype = _array(x, "softmax: x")
    if x.ndim < 1:
        raise ValueError("softmax: x is 0-d")
    y = np.empty(x.shape, x.dtype)
    cols = x.shape[-1]
    _call(mt_softmax_rows, dtype, bool(log), x.size // cols if cols else 0, cols, x, y)
    return y


def layer_norm(x, cols: int, weight, bias, eps: float):
    """Layer norm over the trailing ``cols`` elements of each row of x, as a new
    array; weight and bias None or ``cols`` elements."""
    dtype = _array(x, "layer_norm: x")
    cols, eps = operator.index(cols), float(eps)
    if cols <= 0 or x.size % cols:
        raise ValueError(f"layer_norm: {cols} columns do not divide x")
    for p, name in ((weight, "layer_norm: weight"), (bias, "layer_norm: bias")):
        if p is not None:
            _array(p, name, dtype)
            if p.size != cols:
                raise ValueError(f"{name} has {p.size} elements, expected {cols}")
    y = np.empty(x.shape, x.dtype)
    _call(mt_layer_norm_rows, dtype, x.size // cols, cols, x, weight, bias, eps, y)
    return y


def adam_update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay: float, l2: float,
                beta1: float, beta2: float, step_size: float, bias_correction2_sqrt: float,
                eps: float, maximize: bool) -> None:
    """One Adam step in place (mt_adam_hyper says what each number means) on
    C-contiguous arrays of one dtype and size; max_exp_avg_sq None without amsgrad."""
    arrays = (param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq)
    names = ("param", "grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    dtype = None
    for i, (a, name) in enumerate(zip(arrays, names)):
        if a is None and i == 4:
            break
        dtype = _array(a, "adam_update: " + name, dtype)
        if a.size != param.size:
            raise ValueError(f"adam_update: {name} has {a.size} elements, "
                             f"the parameter {param.size}")
        if i != 1 and not a.flags.writeable:
            raise ValueError(f"adam_update: {name} is read-only")
    h = _AdamHyper(decay=float(decay), l2=float(l2), beta1=float(beta1),
                   beta2=float(beta2), step_size=float(step_size),
                   bias_correction2_sqrt=float(bias_correction2_sqrt), eps=float(eps),
                   maximize=bool(maximize))
    _call(mt_adam_update, dtype, param.size, *arrays, h)


def _operand(a, name: str) -> _Operand:
    """A 4-D (batch, heads, rows, cols) array as an attention operand: its last dim
    contiguous (or of size <= 1) and its strides whole elements."""
    if a.ndim == 4 and a.size == 0:
        # NumPy gives empty arrays any strides (often 0); none is ever used.
        return _Operand(data=a.ctypes.data, row_stride=a.shape[3])
    size, st = a.itemsize, a.strides
    if a.ndim != 4 or (a.shape[3] > 1 and st[3] != size) or any(s % size for s in st[:3]):
        raise ValueError(f"{name} must be 4-D with a contiguous last dim")
    return _Operand(data=a.ctypes.data, batch_stride=st[0] // size,
                    head_stride=st[1] // size, row_stride=st[2] // size)


def _attention_args(arrays, names, first_out: int):
    """(dtype, shape, operands) of attention's arrays: q, k, v, then the output or
    the output's gradient, then the arrays written from ``first_out`` on."""
    dtype, ops = None, []
    for i, (a, name) in enumerate(zip(arrays, names)):
        dtype = _array(a, name, dtype, strided=True, out=i >= first_out)
        ops.append(_operand(a, name))
    q, k, v, o = (a.shape for a in arrays[:4])
    if (k[:2] != q[:2] or v[:2] != q[:2] or o[:2] != q[:2] or k[3] != q[3] or v[2] != k[2]
            or o[2] != q[2] or o[3] != v[3]):
        raise ValueError("attention: q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev) and "
                         "out (B, H, L, Ev) expected")
    return dtype, _Shape(batch=q[0], heads=q[1], L=q[2], S=k[2], E=q[3], Ev=v[3]), ops


def attention(q, k, v, out, scale: float, causal: bool) -> None:
    """Writes softmax(q k^T scale [causal]) v into out, for 4-D arrays q (B, H, L, E),
    k (B, H, S, E), v (B, H, S, Ev), out (B, H, L, Ev) whose last dims are
    contiguous."""
    names = [f"attention: {n}" for n in ("q", "k", "v", "out")]
    dtype, shape, ops = _attention_args((q, k, v, out), names, 3)
    _call(mt_attention, _blas, dtype, shape, *ops, float(scale), bool(causal))


def attention_backward(q, k, v, g, dq, dk, dv, scale: float, causal: bool) -> None:
    """Writes attention's gradients in q, k, v for the output's gradient g into dq,
    dk, dv (laid out as :func:`attention`'s operands)."""
    arrays = (q, k, v, g, dq, dk, dv)
    names = [f"attention_backward: {n}" for n in ("q", "k", "v", "g", "dq", "dk", "dv")]
    dtype, shape, ops = _attention_args(arrays, names, 4)
    # The gradients have their operands' shapes: the kernel's operands carry strides
    # only, so this is the one place their extents are checked.
    for i in range(4, 7):
        if arrays[i].shape != arrays[i - 4].shape:
            raise ValueError(f"{names[i]} must have the shape of {names[i - 4]}")
    _call(mt_attention_backward, _blas, dtype, shape, *ops, float(scale), bool(causal))
