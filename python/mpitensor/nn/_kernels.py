"""The local dense compute of the nn layers: the C kernels (:mod:`._ckernels`) where
the arrays fit them, NumPy otherwise, with the same results to rounding.

The C kernels (csrc/kernels: activation.c, softmax.c, layer_norm.c, gemm.c,
attention.c) take float32 or float64 arrays of one dtype. GELU (forward and
backward), row softmax and layer norm are one vectorized pass over memory instead
of NumPy's several temporaries; attention (forward and backward) computes only the
unmasked blocks of a causal mask, a block of query rows at a time, and
linear writes its bias into the output and adds the product to it in one gemm.
Both gemm users call the BLAS that :mod:`._blas` loads at import (MKL, NumPy's
OpenBLAS, ``MPITENSOR_BLAS``; :func:`blas_provider` says which). For other dtypes,
a softmax not along the last dim, broadcast shapes, masks, dropout or no BLAS
these functions compute with NumPy.

``enabled = False`` (or ``MPITENSOR_NN_KERNELS=0`` in the environment) makes every
layer use NumPy, which is how the tests compare the two paths.

float16 and bfloat16 (mixed precision): NumPy has no BLAS for them, and its loops
round every partial sum. linear, the products of its backward, GELU, softmax and
layer norm therefore widen such operands to float32, compute there (float32
accumulation, the C kernels) and round the result to the operands' dtype once, as
torch's low-precision kernels do.
"""

from __future__ import annotations

import math
import os

import numpy as np

from .. import _dtypes
from . import _blas, _ckernels

enabled = os.environ.get("MPITENSOR_NN_KERNELS", "1") != "0"
_blas.use()
blas_provider = _blas.provider
use_blas = _blas.use

_FLOAT = (np.dtype(np.float32), np.dtype(np.float64))
# Python floats, not NumPy float64 scalars: those would promote float32 inputs.
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _fits(*arrays) -> bool:
    """All ndarrays (None allowed after the first) of one float32/float64 dtype."""
    dtype = arrays[0].dtype if type(arrays[0]) is np.ndarray else None
    if dtype not in _FLOAT:
        return False
    return all(a is None or (type(a) is np.ndarray and a.dtype == dtype) for a in arrays)


def _c(a):
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _linear_by_gemm() -> bool:
    """Whether linear calls the provider's gemm, NumPy's own OpenBLAS included:
    np.matmul runs one gemm per leading index of a batched input and the bias
    then takes a pass of its own over the output, where one gemm over all rows
    adds the product to the bias already in place."""
    return enabled and _blas.provider() != "none"


def _rows(a):
    """2-D ``a`` as the gemm takes it (contiguous rows at a stride of whole elements,
    aligned), else None."""
    size, (r, c), (sr, sc) = a.itemsize, a.shape, a.strides
    return a if a.size == 0 or (a.flags.aligned and (c <= 1 or sc == size) and sr % size == 0
                                and (r <= 1 or sr >= max(c, 1) * size)) else None


def _bias_fits(b, shape, dtype) -> bool:
    """b None, or an ndarray of ``dtype`` that broadcasts to ``shape`` unchanged."""
    return b is None or (type(b) is np.ndarray and b.dtype == dtype and b.ndim <= len(shape)
                         and all(n in (1, m) for n, m in zip(b.shape[::-1], shape[::-1])))


def narrow(*arrays) -> bool:
    """Whether the first array is float16 or bfloat16 and the others (None
    allowed) share its dtype: the operands computed in float32 and rounded back."""
    dtype = arrays[0].dtype
    return _dtypes.is_narrow_float(dtype) and all(a is None or a.dtype == dtype
                                                  for a in arrays)


def widen(a):
    """``a`` (an ndarray or None) in float32."""
    return None if a is None else np.asarray(a).astype(np.float32)


def matmul(a, b):
    """``np.matmul(a, b)`` of ndarrays; float16 or bfloat16 operands of one dtype
    are multiplied in float32 and the product is rounded to their dtype once."""
    if narrow(a, b):
        return np.matmul(widen(a), widen(b)).astype(a.dtype)
    return np.matmul(a, b)


def linear(x, w, b):
    """x @ w.T + b for ndarrays x (..., k), w (n, k) and b None or broadcastable.

    With a BLAS loaded (:func:`blas_provider` not "none") and float operands of
    one dtype, the bias is broadcast into the output and one gemm over all rows
    adds the product to it (beta = 1): no pass of its own over the output.
    Otherwise the product is NumPy's, and the bias is added in place when that gives the same
    array as ``out + b`` (same dtype and shape), which saves a temporary. float16
    and bfloat16 operands are computed in float32 and rounded once."""
    if narrow(x, w, b):
        return linear(widen(x), widen(w), widen(b)).astype(x.dtype)
    if (_linear_by_gemm() and _fits(x, w) and x.ndim >= 1 and w.ndim == 2
            and x.shape[-1] == w.shape[1]):
        shape = x.shape[:-1] + w.shape[:1]
        if _bias_fits(b, shape, x.dtype):
            return _linear_gemm(x, w, b, shape)
    out = np.matmul(x, w.T)
    if b is None:
        return out
    shape = np.shape(b)
    if (type(out) is np.ndarray and len(shape) <= out.ndim
            and all(n in (1, m) for n, m in zip(shape[::-1], out.shape[::-1]))
            and np.result_type(out, b) == out.dtype):
        out += b
        return out
    return out + b


def _linear_gemm(x, w, b, shape):
    (n, k), m = w.shape, math.prod(x.shape[:-1])
    out = np.empty(shape, x.dtype)
    if b is not None:
        out[...] = b
    x2 = x.reshape(m, k)  # a view unless x's leading dims cannot merge
    x2 = _rows(x2) if _rows(x2) is not None else np.ascontiguousarray(x2)
    if _rows(w) is not None:
        _ckernels.gemm(x2, w, out.reshape(m, n), True, 1.0, 0.0 if b is None else 1.0)
    else:  # e.g. a transposed (Fortran-ordered) weight: its transpose has the rows
        wt = w.T if _rows(w.T) is not None else np.ascontiguousarray(w.T)
        _ckernels.gemm(x2, wt, out.reshape(m, n), False, 1.0, 0.0 if b is None else 1.0)
    return out


def gelu(x, approximate: str):
    """GELU of a float ndarray ("none": exact, "tanh": approximated)."""
    if narrow(x):
        return gelu(widen(x), approximate).astype(x.dtype)
    if enabled and x.dtype in _FLOAT:
        return _ckernels.gelu(_c(x), 1 if approximate == "tanh" else 0)
    if approximate == "tanh":
        t = x * x  # in place from here: one temporary for the whole formula
        t *= 0.044715
        t += 1.0
        t *= x
        t *= _SQRT_2_OVER_PI
        np.tanh(t, out=t)
        t += 1.0
        t *= x
        t *= 0.5
        return t
    # Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation where 1 + erf(x / sqrt 2) has it.
    cdf = _erfc(x * -_SQRT_HALF).astype(x.dtype) if x.size else x
    return 0.5 * x * cdf


def softmax(x, axis: int, log: bool):
    """(log_)softmax of a float ndarray along a normalized ``axis``."""
    if narrow(x):
        return softmax(widen(x), axis, log).astype(x.dtype)
    if enabled and x.dtype in _FLOAT and axis == x.ndim - 1:
        return _ckernels.softmax(_c(x), log)
    shifted = x - np.max(x, axis=axis, keepdims=True)
    if log:
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def layer_norm(x, ndim: int, weight, bias, eps: float):
    """Layer norm of a float ndarray over its trailing ``ndim`` dims, weight and
    bias None or ndarrays of those dims' shape."""
    if narrow(x, weight, bias):
        return layer_norm(widen(x), ndim, widen(weight), widen(bias), eps).astype(x.dtype)
    shape = x.shape[x.ndim - ndim:]
    if (enabled and _fits(x, weight, bias) and x.size
            and all(p is None or p.shape == shape for p in (weight, bias))):
        return _ckernels.layer_norm(_c(x), math.prod(shape),
                                    None if weight is None else _c(weight),
                                    None if bias is None else _c(bias), float(eps))
    axes = tuple(range(x.ndim - ndim, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    y = centered / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def attention_fits(q, k, v) -> bool:
    """Whether :func:`attention` runs in C for these operands: float ndarrays of one
    dtype, at least 2-D, with the same leading (batch, head) dims."""
    return (enabled and _ckernels.have_blas() and _fits(q, k, v) and q.ndim >= 2
            and q.ndim == k.ndim == v.ndim and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            and k.shape[-2] == v.shape[-2] and q.shape[-1] == k.shape[-1])


def attention(q, k, v, scale: float, causal: bool):
    """softmax(q @ k^T * scale, causal mask) @ v for operands that
    :func:`attention_fits`: (..., L, E), (..., S, E), (..., S, Ev)."""
    out = np.empty(q.shape[:-1] + (v.shape[-1],), q.dtype)
    if out.size == 0:  # NumPy gives empty arrays arbitrary strides: nothing to pass
        return out
    heads = math.prod(q.shape[:-2])
    q4, k4, v4, o4 = (a.reshape((1, heads) + a.shape[-2:]) for a in (q, k, v, out))
    _ckernels.attention(_inner(q4), _inner(k4), _inner(v4), o4, float(scale), causal)
    return out


def attention_backward(q, k, v, g, scale: float, causal: bool):
    """The gradients (dq, dk, dv) of :func:`attention` for the output's gradient
    ``g`` (..., L, Ev), in one C pass per block of query rows (the weights
    recomputed, no (L, S) array), or None when the operands do not fit (see
    :func:`attention_fits`; g of the output's shape and dtype)."""
    if not (attention_fits(q, k, v) and _fits(q, g)
            and g.shape == q.shape[:-1] + v.shape[-1:]):
        return None
    grads = tuple(np.empty(a.shape, q.dtype) for a in (q, k, v))
    if q.shape[:-2] and math.prod(q.shape[:-2]) == 0:
        return grads
    q4, k4, v4, g4, dq, dk, dv = (_heads4(a) for a in (q, k, v, g) + grads)
    _ckernels.attention_backward(_inner(q4), _inner(k4), _inner(v4), _inner(g4), dq, dk,
                                 dv, float(scale), causal)
    return grads


def attention_heads_backward(q, k, v, g, scale: float, causal: bool, out=None):
    """The gradients of :func:`attention_heads` for the output's gradient ``g``
    (..., L, H * Ev), each laid out as its operand's projection, (..., L, H * E):
    the C kernel reads the heads and writes their gradients in place (strided), so
    nothing is transposed. ``out``, when given, is (dq, dk, dv) arrays of q's, k's
    and v's shapes to write into (e.g. slices of one fused gradient). None when the
    operands do not fit the C kernel."""
    if narrow(q, k, v, g):
        grads = attention_heads_backward(widen(q), widen(k), widen(v), widen(g), scale, causal)
        if grads is None:
            return None
        if out is None:
            return tuple(x.astype(q.dtype) for x in grads)
        for o, x in zip(out, grads):
            o[...] = x
        return out
    if not (enabled and _ckernels.have_blas() and _fits(q, k, v, g) and q.ndim >= 3
            and q.ndim == k.ndim == v.ndim and q.shape[:-3] == k.shape[:-3] == v.shape[:-3]
            and q.shape[-2] == k.shape[-2] == v.shape[-2] and k.shape[-3] == v.shape[-3]
            and q.shape[-1] == k.shape[-1]
            and g.shape == q.shape[:-2] + (q.shape[-2] * v.shape[-1],)):
        return None
    grads = out if out is not None else tuple(np.empty(a.shape, q.dtype) for a in (q, k, v))
    lead = q.shape[:-3]
    b = math.prod(lead)
    if b and q.shape[-2]:
        g = g.reshape(g.shape[:-1] + (q.shape[-2], v.shape[-1]))
        ops = [a.reshape((b,) + a.shape[-3:]).transpose(0, 2, 1, 3)
               for a in (q, k, v, g) + tuple(grads)]
        _ckernels.attention_backward(*(_inner(a) for a in ops[:4]), *ops[4:],
                                     float(scale), causal)
    return grads


def _heads4(a):
    """``a`` (..., rows, cols) as the kernels' (batch, heads, rows, cols): itself
    when 4-D (any strides), else its leading dims merged into the heads."""
    if a.ndim == 4:
        return a
    return a.reshape((1, math.prod(a.shape[:-2])) + a.shape[-2:])


def _inner(a):
    """``a`` itself when its last dim is contiguous and strides are whole elements."""
    st = a.strides
    if st[-1] == a.itemsize and all(s % a.itemsize == 0 for s in st):
        return a
    return np.ascontiguousarray(a)


def attention_heads(q, k, v, scale: float, causal: bool):
    """Attention of heads laid out as the projections leave them, q (..., L, H, E),
    k (..., S, H, E), v (..., S, H, Ev), read in place (strided); returns
    (..., L, H * Ev) with the heads side by side, as the output projection wants
    them, or None when the operands do not fit the C kernel."""
    if narrow(q, k, v):
        out = attention_heads(widen(q), widen(k), widen(v), scale, causal)
        return None if out is None else out.astype(q.dtype)
    if not (enabled and _ckernels.have_blas() and _fits(q, k, v) and q.ndim >= 3
            and q.ndim == k.ndim == v.ndim and q.shape[:-3] == k.shape[:-3] == v.shape[:-3]
            and q.shape[-2] == k.shape[-2] == v.shape[-2] and k.shape[-3] == v.shape[-3]
            and q.shape[-1] == k.shape[-1]):
        return None
    lead, (L, H), Ev = q.shape[:-3], q.shape[-3:-1], v.shape[-1]
    out = np.empty(lead + (L, H, Ev), q.dtype)
    if out.size == 0:  # e.g. a rank that holds no head: nothing to compute
        return out.reshape(lead + (L, H * Ev))
    b = math.prod(lead)
    q4, k4, v4, o4 = (a.reshape((b,) + a.shape[-3:]).transpose(0, 2, 1, 3)
                      for a in (q, k, v, out))
    _ckernels.attention(_inner(q4), _inner(k4), _inner(v4), o4, float(scale), causal)
    return out.reshape(lead + (L, H * Ev))


def gelu_backward(x, g, approximate: str):
    """``g * gelu'(x)`` for float ndarrays x and g of one shape: one C pass when
    they fit the kernels (one dtype), else NumPy's product with :func:`gelu_grad`."""
    if narrow(x, g):
        return gelu_backward(widen(x), widen(g), approximate).astype(x.dtype)
    if enabled and x.shape == g.shape and _fits(x, g):
        return _ckernels.gelu_backward(_c(x), _c(g), 1 if approximate == "tanh" else 0)
    return g * gelu_grad(x, approximate)


def gelu_grad(x, approximate: str):
    """d gelu(x) / dx of a float ndarray."""
    if approximate == "tanh":
        # With s = sigmoid(2u) = 1 / (1 + e), e = exp(-2u): s + 2 x s (1 - s) u',
        # s (1 - s) = e s s, without 0.5 (1 + tanh u)'s cancellation below 0.
        c = _SQRT_2_OVER_PI
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(-2.0 * c * (x + 0.044715 * x * x * x))
            s = 1.0 / (1.0 + e)
            d = s + 2.0 * x * (e * s) * s * (c * (1.0 + 3 * 0.044715 * x * x))
        return np.where(np.isinf(e), 0.0, d).astype(d.dtype, copy=False)
    # Phi(x) = gelu(x) / x keeps the forward's erfc accuracy; 1/2 at 0.
    safe = np.where(x == 0, 1.0, x).astype(x.dtype)
    cdf = np.where(x == 0, 0.5, gelu(safe, "none") / safe)
    return (cdf + x * np.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))).astype(x.dtype)


def sigmoid(x):
    """1 / (1 + exp(-x)) of a float ndarray, without overflow (tanh form)."""
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def silu(x):
    """x * sigmoid(x) of a float ndarray."""
    return x * sigmoid(x)


def silu_grad(x):
    """d silu(x) / dx of a float ndarray."""
    s = sigmoid(x)
    return s * (1.0 + x * (1.0 - s))
