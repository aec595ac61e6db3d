"""Functions on DTensors and plain ndarrays, after torch.nn.functional.

Each function takes plain ndarrays (plain NumPy) or DTensors (sharded, with the
communication the placements need and nothing more). Pointwise functions (gelu,
relu, dropout) keep the input's placements and reduce a Partial first.

softmax and log_softmax normalise along ``axis``: for a DTensor that dim must be
whole on every rank, so its label is REPLICATE (a Shard of it is gathered first,
and it stays Replicate in the output) while every other Shard is kept; a Partial
input is reduced first (softmax is not linear). Both are numerically stable (the
maximum along ``axis`` is subtracted before exponentiating).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _dtypes, _modes, _registry, _trace, random as _random
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from .._algorithms import _dispatch as D
from .._ops import _linalg
from ..placement_types import Partial, Replicate, Shard
from ..autograd import Function
from ..autograd._rules import sum_to
from . import _kernels

__all__ = ["softmax", "log_softmax", "linear", "relu", "gelu", "silu", "dropout", "layer_norm",
           "rms_norm", "embedding", "scaled_dot_product_attention", "cross_entropy"]


def _softmax_local(x, axis):
    return _kernels.softmax(x, axis, False)


def _log_softmax_local(x, axis):
    return _kernels.softmax(x, axis, True)


def _apply(name, func, x, axis):
    if type(x) is not DTensor:
        x = np.asarray(x)
        if not _dtypes.is_inexact(x.dtype):
            x = x.astype(np.float64)
        if x.ndim == 0:
            return func(x.reshape(1), 0).reshape(())
        return func(x, normalize_axis_index(axis, x.ndim))
    if x.ndim == 0:
        raise ValueError(f"mpitensor.nn.functional.{name}: a 0-d DTensor has no axis")
    ax = normalize_axis_index(axis, x.ndim)
    n = x.ndim

    def build():
        kinds = [D.REPLICATE if d == ax else D.KEEP for d in range(n)]
        return D.dimmap([range(n)], range(n), kinds)

    def compute(local):
        if not _dtypes.is_inexact(local.dtype):
            local = local.astype(np.float64)
        if local.size == 0:
            return np.empty(local.shape, np.result_type(local, 1.0))
        return func(local, ax)
    return D.execute((name, ax), (x,), build, compute)


def softmax(x, axis: int = -1):
    """exp(x) / sum(exp(x), axis), computed stably. For a DTensor the result keeps
    every Shard except along ``axis``, which is Replicate. Integer inputs give
    float64. Local, unless ``axis`` is sharded or the input Partial (then
    collective on the mesh: gathered or reduced first).

    Example::

        >>> softmax(np.array([0.0, np.log(3.0)]))
        array([0.25, 0.75])
    """
    return _Softmax.apply(x, axis, False)


def log_softmax(x, axis: int = -1):
    """log(softmax(x, axis)), computed stably as x - max - log(sum(exp(x - max))).
    Placements and collectiveness as :func:`softmax`: local unless ``axis`` is
    sharded or the input Partial.

    Example::

        >>> np.exp(log_softmax(np.array([0.0, np.log(3.0)])))
        array([0.25, 0.75])
    """
    return _Softmax.apply(x, axis, True)


class _Softmax(Function):
    """(log_)softmax; the backward uses the output, along the same whole axis:
    ``y (g - sum(g y))`` and ``g - exp(y) sum(g)``."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, x, axis, log):
        out = _apply("log_softmax" if log else "softmax",
                     _log_softmax_local if log else _softmax_local, x, axis)
        ctx.save_for_backward(out)
        ctx.axis, ctx.log = axis, log
        return out

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        if g.placements != y.placements:
            g = g.redistribute(g.device_mesh, y.placements)
        ax = normalize_axis_index(ctx.axis, y.ndim)
        if ctx.log:
            gx = _local2(g, y, lambda a, b: a - np.exp(b) * np.sum(a, axis=ax, keepdims=True))
        else:
            gx = _local2(g, y, lambda a, b: b * (a - np.sum(a * b, axis=ax, keepdims=True)))
        return gx, None, None


def _local2(g, y, func):
    """``func`` of two DTensors' local arrays (same spec) as a DTensor of that spec."""
    mesh = y.device_mesh
    if mesh.get_coordinate() is None:
        return _wrap_like(mesh, y.placements, y.shape, np.empty((0,), y.dtype))
    return _wrap_like(mesh, y.placements, y.shape,
                      np.asarray(func(g._data(), y._data()), y.dtype))


# -- helpers ----------------------------------------------------------------------

def _is_dt(x) -> bool:
    return type(x) is DTensor


def _wrap_like(mesh, placements, shape, local):
    """A DTensor with the given spec around a local result (no communication)."""
    if mesh.get_coordinate() is None:
        local = np.empty((0,), local.dtype)
    return DTensor(local, DTensorSpec(mesh, tuple(placements), tuple(shape), local.dtype,
                                      contiguous_strides(tuple(shape))))


def _without_partial(x):
    """``x`` with every Partial mesh dim reduced to Replicate (all-reduce)."""
    if not any(p.is_partial() for p in x.placements):
        return x
    return x.redistribute(x.device_mesh,
                          [Replicate() if p.is_partial() else p for p in x.placements])


def _pointwise(name, x, func):
    """``func`` on the local values; a DTensor keeps its Shard/Replicate placements."""
    if not _is_dt(x):
        return func(np.asarray(x))
    x = _without_partial(x)
    if _modes.tracing:
        _trace.local(name, (x,), x.placements)
    return _wrap_like(x.device_mesh, x.placements, x.shape, func(x.to_local()))


def _mixed(name, what):
    return TypeError(
        f"mpitensor.nn.functional.{name}: {what}; a module whose parameters are DTensors "
        f"needs DTensor inputs (convert them with DTensor.from_local or distribute_tensor, "
        f"or let a parallel style / distribute_module's input_fn do it)"
    )


# -- layers -------------------------------------------------------------------------

def linear(input, weight, bias=None):
    """``input @ weight.T + bias``, as torch.nn.functional.linear (weight is
    ``(out_features, in_features)``).

    With DTensors the matmul follows the placements: a Replicate input times a
    Shard(0) weight gives an output sharded on its last dim (no communication);
    an input sharded on its last dim times a Shard(1) weight gives a Partial(sum)
    output, to which a Replicate bias is added on one rank only, so the Partial can
    later become Replicate (all-reduce) or a Shard (reduce-scatter). Collective only
    when the placements require a redistribution.

    Example::

        >>> linear(np.ones((2, 3)), np.ones((4, 3)), np.zeros(4)).shape
        (2, 4)
    """
    if not (_is_dt(input) or _is_dt(weight)):
        return _kernels.linear(np.asarray(input), np.asarray(weight),
                               None if bias is None else np.asarray(bias))
    if not (_is_dt(input) and _is_dt(weight)):
        raise _mixed("linear", "the input and the weight must both be DTensors or both "
                     "be ndarrays")
    if bias is not None and not _is_dt(bias):
        raise _mixed("linear", "the bias is an ndarray but the weight is a DTensor")
    return _Linear.apply(input, weight, bias)


class _Linear(Function):
    """linear on DTensors. The gradients are DTensor operations, so their
    placements are matmul's rule for the transposed products, as torch's addmm
    backward: with ColwiseParallel (input Replicate, weight Shard(0)) the input's
    gradient is a Partial sum (reduced where it meets the Replicate input) and
    the weight's Shard(0); with RowwiseParallel (input Shard(-1), weight
    Shard(1)) nothing is communicated."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, input, weight, bias):
        ctx.save_for_backward(input, weight, bias)
        return _linear_forward(input, weight, bias)

    @staticmethod
    def backward(ctx, g):
        input, weight, bias = ctx.saved_tensors
        need = ctx.needs_input_grad
        gi = gw = gb = None
        local = (_kernels.enabled and weight.ndim == 2 and input.ndim >= 1
                 and not (_registry.ruled(np.matmul) or _registry.ruled(np.einsum)))
        if need[0]:
            gi = _linear_grad_input(g, weight) if local else np.matmul(g, weight)
            gi = _as_dtype(gi, input.dtype)
        if need[1]:
            lead = "abcdefghjklmnpqrstuvwxyz"[:input.ndim - 1]
            sub = f"{lead}o,{lead}i->oi"
            gw = _as_dtype(_linear_grad_weight(g, input, sub) if local else
                           np.einsum(sub, g, input, optimize=True), weight.dtype)
        if need[2]:
            gb = _as_dtype(sum_to(g, bias.shape), bias.dtype)
        return gi, gw, gb


def _linear_grad_input(g, weight):
    """``g @ weight`` by matmul's own decision, with one 2-D product of the local
    arrays (the rows of all leading dims at once, not one product per batch)."""
    D.same_mesh("linear", (g, weight))
    return D.execute(np.matmul, (g, weight), None, _rows_matmul)


def _rows_matmul(a, w):
    out = _kernels.matmul(_rows2(a), w)
    return out.reshape(a.shape[:-1] + out.shape[-1:])


def _linear_grad_weight(g, input, sub):
    """``einsum(sub, g, input)`` (the sum over rows of g's and the input's outer
    products) by einsum's own decision, as one product of the local arrays in which
    BLAS reads g transposed: the result is C-ordered, where einsum's is a transposed
    view that every later pass over it (the stored ``.grad``, the optimizer) would
    read across its rows."""
    D.same_mesh("numpy.einsum", (g, input))
    return D.execute(("einsum", sub), (g, input),
                     lambda: _linalg.einsum_map(*_linalg._parse_einsum(sub, (g, input))),
                     lambda a, x: _kernels.matmul(_rows2(a).T, _rows2(x)))


def _rows2(a):
    """``a`` (..., n) as (rows, n); n may be 0 (a rank's empty shard), where
    reshape(-1, 0) would raise on that rank only."""
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _as_dtype(g, dtype):
    return g if g.dtype == dtype else g.astype(dtype)


def _linear_forward(input, weight, bias):
    if _kernels.enabled and weight.ndim == 2 and input.ndim >= 1 \
            and not _registry.ruled(np.matmul):
        out, fused = _linear_local(input, weight, bias)
    else:  # what matmul's rule (or a rule registered for it) makes of it
        out, fused = np.matmul(input, weight.T), bias is None
    if fused:
        return out
    return out + _bias_for(out, bias)


def _linear_local(input, weight, bias):
    """``input @ weight.T`` by matmul's sharding rule, computed on the local arrays by
    one gemm, and whether ``bias`` was added in that gemm (see :func:`_fused_bias`)."""
    name = "linear"  # traced as one operation, as torch's CommDebugMode shows aten.addmm
    mesh = D.same_mesh(name, (input, weight))

    def build():
        return D.dimmap_matmul(input.shape, weight.shape, True)
    out_pl, out_shape, _ = D.decide((name,), (input, weight), build)
    fused, b = _fused_bias(mesh, out_pl, out_shape, bias, input.dtype)
    b = b if fused else None
    return D.execute((name,), (input, weight), build,
                     lambda x, w: _kernels.linear(x, w, b)), fused


def _fused_bias(mesh, out_placements, out_shape, bias, dtype):
    """(True, local bias or None) when ``out + _bias_for(out, bias)`` would keep the
    output's placements without communication, so each rank can add its local bias
    (None: zeros, on the ranks that are not first along a Partial mesh dim) inside
    the gemm; else (False, None) and the bias is added as a DTensor afterwards."""
    if bias is None:
        return True, None
    spec, last = bias._spec, len(out_shape) - 1
    if (spec.mesh is not mesh and spec.mesh != mesh) or spec.shape != out_shape[-1:] \
            or spec.dtype != dtype or mesh._coordinate is None:
        return False, None
    zero = False
    for m, (op, bp) in enumerate(zip(out_placements, spec.placements)):
        if op.is_partial("sum") and bp.is_replicate():
            zero = zero or mesh._coordinate[m] != 0
        elif not ((op.is_shard(last) and bp.is_shard(0))
                  or (not op.is_partial() and not op.is_shard(last) and bp.is_replicate())):
            return False, None
    return True, None if zero else bias.to_local()


def _bias_for(out, bias):
    """The bias as a Partial(sum) DTensor on the mesh dims where ``out`` is Partial,
    so that ``out + bias`` stays Partial (added on the first rank of each such mesh
    dim, zero elsewhere) instead of forcing an all-reduce first."""
    partial_dims = [m for m, p in enumerate(out.placements) if p.is_partial("sum")]
    if not partial_dims:
        return bias
    mesh, pl = bias.device_mesh, list(bias.placements)
    if any(not pl[m].is_replicate() for m in partial_dims):
        return bias  # sharded along a Partial mesh dim: let the dispatch reduce first
    coord = mesh.get_coordinate()
    local = bias.to_local()
    if coord is not None and any(coord[m] != 0 for m in partial_dims):
        local = np.zeros_like(local)
    for m in partial_dims:
        pl[m] = Partial("sum")
    return _wrap_like(mesh, pl, bias.shape, local)


def relu(input):
    """max(x, 0), elementwise; DTensor placements kept (a Partial is reduced first).
    Local for Shard/Replicate inputs; collective on the mesh for a Partial one.

    Example::

        >>> relu(np.array([-1.0, 2.0]))
        array([0., 2.])
    """
    return _Pointwise.apply(input, "relu", lambda x: np.maximum(x, 0),
                            lambda x: (x > 0).astype(x.dtype))


def gelu(input, approximate: str = "none"):
    """Gaussian error linear unit, as torch: ``x * Phi(x)`` with the exact normal CDF
    (``approximate="none"``) or its tanh approximation (``"tanh"``, GPT-2's).
    DTensor placements kept; local for Shard/Replicate inputs.

    Example::

        >>> gelu(np.array([0.0, 1.0]), approximate="tanh")
        array([0.        , 0.84119199])
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _Pointwise.apply(input, "gelu", lambda x: _kernels.gelu(_float(x), approximate),
                            lambda x: _kernels.gelu_grad(_float(x), approximate),
                            lambda x, g: _kernels.gelu_backward(_float(x), g, approximate))


def silu(input):
    """x * sigmoid(x), elementwise (torch.nn.functional.silu, SwiGLU's gate).
    DTensor placements kept; local for Shard/Replicate inputs.

    Example::

        >>> silu(np.array([0.0, 1.0]))
        array([0.        , 0.73105858])
    """
    return _Pointwise.apply(input, "silu", lambda x: _kernels.silu(_float(x)),
                            lambda x: _kernels.silu_grad(_float(x)))


class _Pointwise(Function):
    """An elementwise function of a DTensor and its derivative, both on local
    arrays: the gradient is ``g * f'(x)`` with ``f'(x)`` in x's placements.
    ``backward(x, g)``, when given, computes that product of local arrays in one
    pass; it is used when g is laid out as x (else the DTensor product decides,
    e.g. a Partial g stays Partial)."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, input, name, func, deriv, backward=None):
        if not _is_dt(input):
            return func(np.asarray(input))
        x = _without_partial(input)
        ctx.save_for_backward(x)
        ctx.deriv, ctx.local_backward = deriv, backward
        return _pointwise(name, x, func)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if ctx.local_backward is not None and g._spec.placements == x._spec.placements:
            gx = _local2(g, x, lambda a, b: ctx.local_backward(b, a))
        else:
            gx = g * _local_like(x, lambda a: ctx.deriv(a))
        return _as_dtype(gx, x.dtype), None, None, None, None


def _local_like(x, func, dtype=None):
    """``func`` of x's local array as a DTensor of x's spec (no communication)."""
    mesh = x.device_mesh
    if mesh.get_coordinate() is None:
        return _wrap_like(mesh, x.placements, x.shape, np.empty((0,), dtype or x.dtype))
    return _wrap_like(mesh, x.placements, x.shape, func(x._data()))


def _float(x):
    return x if _dtypes.is_inexact(x.dtype) else x.astype(np.float64)


def dropout(input, p: float = 0.5, training: bool = True):
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p).

    The mask comes from mpitensor's counter-based generator keyed by each element's
    global index (see :func:`mpitensor.manual_seed`), so a sharded input drops the
    same elements as the whole array would: TP output equals the single-process
    output also in training. Local (a Partial input is reduced first).

    Example::

        >>> manual_seed(0); dropout(np.ones(4), p=0.5)
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    return _Dropout.apply(input, p)


class _Dropout(Function):
    """dropout; the backward scales by the forward's mask (kept, not redrawn)."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, input, p):
        out, keep = _dropout(input, p)
        ctx.keep, ctx.p = keep, p
        if _is_dt(out):
            ctx.placements = out.placements
        return out

    @staticmethod
    def backward(ctx, g):
        scale = 0.0 if ctx.p == 1.0 else 1.0 / (1.0 - ctx.p)
        if g.placements != ctx.placements:
            g = g.redistribute(g.device_mesh, ctx.placements)
        if ctx.keep is None:
            return g, None
        return _local_like(g, lambda a: np.where(ctx.keep, a * scale, 0.0).astype(a.dtype)), None


def _dropout(input, p):
    """(dropout of input, the local mask of kept elements or None where nothing is
    local)."""
    def func(x, shape, offset):
        x = _float(x)
        if p == 1.0:
            return np.zeros_like(x), np.zeros(x.shape, bool)
        u = _random.fill(np.empty(x.shape, np.float64), shape, offset, _random._UNIFORM,
                         stream)
        keep = u >= p
        return np.where(keep, x / (1.0 - p), 0.0).astype(x.dtype), keep

    stream = _random._next_stream()
    if not _is_dt(input):
        x = np.asarray(input)
        return func(x, x.shape, (0,) * x.ndim)
    x = _without_partial(input)
    if x.device_mesh.get_coordinate() is None:
        return _wrap_like(x.device_mesh, x.placements, x.shape, np.empty((0,), x.dtype)), None
    _, offset = compute_local_shape_and_global_offset(x.shape, x.device_mesh, x.placements)
    local, keep = func(x.to_local(), x.shape, offset)
    return _wrap_like(x.device_mesh, x.placements, x.shape, local), keep


def _norm_axes(normalized_shape, ndim):
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    k = len(normalized_shape)
    if k == 0 or k > ndim:
        raise ValueError(f"normalized_shape {tuple(normalized_shape)} does not fit an "
                         f"input of {ndim} dims")
    return tuple(range(ndim - k, ndim)), tuple(normalized_shape)


def _affine(y, weight, bias):
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing
    ``normalized_shape`` dims, as torch. A DTensor sharded on other dims (e.g. the
    sequence dim under SequenceParallel) runs without communication; a sharded
    normalized dim is made whole first, by one all-to-all onto a free dim or one
    all-gather, whichever the executor prices cheaper with the gradients' way back
    (collective on the mesh; else local). Weight and bias are ndarrays or (with a
    DTensor input) DTensors on its mesh.

    Example::

        >>> layer_norm(np.array([[1.0, 3.0]]), (2,))
        array([[-0.99999501,  0.99999501]])
    """
    axes, shape = _norm_axes(normalized_shape, input.ndim)
    if tuple(input.shape[-len(shape):]) != shape:
        raise ValueError(f"layer_norm: input shape {tuple(input.shape)} does not end "
                         f"with normalized_shape {shape}")
    if not _is_dt(input):
        return _kernels.layer_norm(_float(np.asarray(input)), len(shape),
                                   None if weight is None else np.asarray(weight),
                                   None if bias is None else np.asarray(bias), eps)
    if _kernels.enabled and _params_on(input, (weight, bias)):
        # Torch's rule: the normalized dims are made whole first, in one move, and
        # the rest is local; op by op, each reduction and broadcast would move
        # again. The executor decides that move, pricing the gradients' way back.
        return _LayerNorm.apply(input, weight, bias, len(shape), eps)
    # Other layouts: DTensor operations, each recorded by its own rule.
    mean = np.mean(input, axis=axes, keepdims=True)
    centered = input - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    return _affine(centered / np.sqrt(var + eps), weight, bias)


class _LayerNorm(Function):
    """layer_norm of a DTensor, forward and backward on local arrays. The forward
    runs through the executor with a dim map that keeps the normalized dims whole
    (the weight and bias are laid along them): it moves the input as it decides
    (an all-to-all onto a free dim, or a gather), the weight and bias to
    Replicate. The input's gradient has the placements the forward computed in;
    the weight's and bias's are this rank's sums over its rows: Partial(sum) on
    the mesh dims that shard the rows, Replicate on the others (reduced where they
    meet the parameter)."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, input, weight, bias, k, eps):
        n = input.ndim
        params = tuple(p for p in (weight, bias) if p is not None)
        here = {}

        def build():
            kinds = [D.REPLICATE if d >= n - k else D.KEEP for d in range(n)]
            return D.dimmap([range(n)] + [range(n - k, n)] * len(params), range(n), kinds)

        def compute(x, *ps):
            here["x"], here["params"] = x, ps
            w = ps[0] if weight is not None else None
            b = ps[-1] if bias is not None else None
            return _kernels.layer_norm(_float(x), k, w, b, eps)

        out = D.execute(("layer_norm", n, k, weight is not None, bias is not None),
                        (input,) + params, build, compute)
        mesh, pls = input.device_mesh, out.placements
        x = here.get("x", np.empty((0,), input.dtype))
        ps = iter(here.get("params", (np.empty((0,), p.dtype) for p in params)))
        moved = [_wrap_like(mesh, pls, input.shape, x)]
        for p in (weight, bias):
            moved.append(None if p is None else
                         _wrap_like(mesh, [Replicate()] * mesh.ndim, p.shape, next(ps)))
        ctx.save_for_backward(*moved)
        ctx.k, ctx.eps = k, eps
        return out

    @staticmethod
    def backward(ctx, g):
        x, weight, bias = ctx.saved_tensors
        need = ctx.needs_input_grad
        if g.placements != x.placements:
            g = g.redistribute(g.device_mesh, x.placements)
        mesh, k = x.device_mesh, ctx.k
        pshape = x.shape[x.ndim - k:]
        ppl = [Partial("sum") if p.is_shard() else Replicate() for p in x.placements]
        if mesh.get_coordinate() is None:
            empty = np.empty((0,), x.dtype)
            return (_wrap_like(mesh, x.placements, x.shape, empty) if need[0] else None,
                    _wrap_like(mesh, ppl, pshape, empty) if need[1] else None,
                    _wrap_like(mesh, ppl, pshape, empty) if need[2] else None, None, None)
        a, gy = _float(x._data()), g._data()
        axes = tuple(range(a.ndim - k, a.ndim))
        lead = tuple(range(a.ndim - k))
        mean = np.mean(a, axis=axes, keepdims=True)
        xhat = a - mean
        rstd = 1.0 / np.sqrt(np.mean(xhat * xhat, axis=axes, keepdims=True) + ctx.eps)
        xhat *= rstd
        gx = gw = gb = None
        if need[0]:
            gh = gy * weight._data() if weight is not None else gy
            gx = rstd * (gh - np.mean(gh, axis=axes, keepdims=True)
                         - xhat * np.mean(gh * xhat, axis=axes, keepdims=True))
            gx = _wrap_like(mesh, x.placements, x.shape, gx.astype(x.dtype, copy=False))
        if need[1]:
            gw = _wrap_like(mesh, ppl, pshape,
                            np.asarray(np.sum(gy * xhat, axis=lead), weight.dtype))
        if need[2]:
            gb = _wrap_like(mesh, ppl, pshape, np.asarray(np.sum(gy, axis=lead), bias.dtype))
        return gx, gw, gb, None, None


def _params_on(x, params) -> bool:
    """Whether each parameter of a norm of DTensor ``x`` is None or a DTensor on
    x's mesh."""
    mesh = x._spec.mesh
    return all(p is None or (_is_dt(p) and (p._spec.mesh is mesh or p._spec.mesh == mesh))
               for p in params)


def rms_norm(input, normalized_shape, weight=None, eps: float | None = None):
    """x / sqrt(mean(x**2) + eps) * weight over the trailing ``normalized_shape``
    dims, as torch.nn.functional.rms_norm (``eps=None`` means the dtype's machine
    epsilon). Communication as :func:`layer_norm`: local unless the normalized
    dims are sharded.

    Example::

        >>> rms_norm(np.array([[3.0, 4.0]]), (2,), eps=0.0) * np.sqrt(12.5)
        array([[3., 4.]])
    """
    axes, shape = _norm_axes(normalized_shape, input.ndim)
    if tuple(input.shape[-len(shape):]) != shape:
        raise ValueError(f"rms_norm: input shape {tuple(input.shape)} does not end "
                         f"with normalized_shape {shape}")
    if not _is_dt(input):
        input = _float(np.asarray(input))
    if eps is None:
        eps = float(np.finfo(input.dtype).eps)
    ms = np.mean(input * input, axis=axes, keepdims=True)
    return _affine(input / np.sqrt(ms + eps), weight, None)


def embedding(input, weight):
    """Rows of ``weight`` (num_embeddings, embedding_dim) picked by integer ``input``.

    With a DTensor weight the input must be a DTensor too (indices, on the same
    mesh). Per mesh dim: a Replicate weight keeps the input's placement (indices
    sharded on dim d give an output sharded on dim d); a weight sharded on the
    embedding dim (``Shard(1)``, ColwiseParallel) gives an output sharded on its
    last dim; a weight sharded on the vocabulary (``Shard(0)``, RowwiseParallel)
    looks up only the indices in its rows and zeroes the others, giving a
    ``Partial(sum)`` output. Indices are first made Replicate on the mesh dims
    where the weight is sharded. Local unless indices must be redistributed.

    Example::

        >>> embedding(np.array([2, 0]), np.arange(6.0).reshape(3, 2))
        array([[4., 5.],
               [0., 1.]])
    """
    if not _is_dt(weight):
        if _is_dt(input):
            raise _mixed("embedding", "the indices are a DTensor but the weight is not")
        w = np.asarray(weight)
        idx = np.asarray(input)
        _check_indices(idx, w.shape[0])
        return w[idx]
    if not _is_dt(input):
        raise _mixed("embedding", "the indices are an ndarray but the weight is a DTensor")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D, got shape {weight.shape}")
    if input.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got {input.dtype}")
    return _Embedding.apply(input, weight)


class _Embedding(Function):
    """The sharded-vocabulary embedding of :func:`embedding`. The weight's gradient
    is each rank's scatter-add of its output rows into its rows of the weight: it
    keeps the weight's Shard placements, and is a Partial(sum) on the mesh dims
    where the weight is Replicate and the indices sharded (the gradient of a
    replicated table looked up by different indices on different ranks)."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, input, weight):
        return _sharded_embedding(input, weight, ctx)

    @staticmethod
    def backward(ctx, g):
        idx, weight, out_pl = ctx.idx, ctx.weight_spec, ctx.out_pl
        want = tuple(Replicate() if p.is_partial() else p for p in out_pl)
        if g.placements != want:
            g = g.redistribute(g.device_mesh, want)
        mesh = g.device_mesh
        pl = [wp if wp.is_shard() else Partial("sum") if ip.is_shard() else Replicate()
              for wp, ip in zip(weight.placements, idx.placements)]
        if mesh.get_coordinate() is None:
            return None, _wrap_like(mesh, pl, weight.shape, np.empty((0,), weight.dtype))
        shape, offset = compute_local_shape_and_global_offset(weight.shape, mesh,
                                                              weight.placements)
        lo, rows = offset[0], shape[0]
        local_idx = idx._data().reshape(-1)
        gl = g._data().reshape(local_idx.size, shape[1])
        gw = np.zeros(shape, weight.dtype)
        inside = (local_idx >= lo) & (local_idx < lo + rows)
        _add_rows_at(gw, local_idx[inside] - lo, gl[inside])
        return None, _wrap_like(mesh, pl, weight.shape, gw)


def _add_rows_at(out, idx, rows):
    """``np.add.at(out, idx, rows)`` for 1-D ``idx``, with the same sums in the same
    order: the k-th occurrence of every index is added in one vectorized step, for
    k = 0, 1, ..., where add.at takes one row at a time (several times slower on an
    embedding's gradient, whose rows are as wide as the model).

    Example::

        >>> out = np.zeros((2, 1))
        >>> _add_rows_at(out, np.array([1, 0, 1]), np.ones((3, 1)))
        >>> out[:, 0]
        array([1., 2.])
    """
    n = idx.size
    if n == 0:
        return
    order = np.argsort(idx, kind="stable")  # each index's rows in their first order
    ranked = idx[order]
    new = np.empty(n, bool)
    new[0], new[1:] = True, ranked[1:] != ranked[:-1]
    at = np.arange(n)
    occurrence = at - np.maximum.accumulate(np.where(new, at, 0))
    for k in range(int(occurrence.max()) + 1):
        pick = order[occurrence == k]  # distinct indices: no two writes collide
        out[idx[pick]] += rows[pick]


def _check_indices(idx, n):
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"embedding: index out of range [0, {n}): min {idx.min()}, "
                         f"max {idx.max()}")


def _sharded_embedding(idx, weight, ctx=None):
    mesh = weight.device_mesh
    if idx.device_mesh != mesh:
        raise ValueError("embedding: indices and weight live on different meshes")
    need, out_pl = list(idx.placements), []
    for m, (wp, ip) in enumerate(zip(weight.placements, idx.placements)):
        if ip.is_partial():
            raise ValueError("embedding: Partial indices make no sense; reduce them first")
        if wp.is_replicate():
            out_pl.append(ip)
        elif wp.is_shard(1):
            need[m] = Replicate()
            out_pl.append(Shard(idx.ndim))
        elif wp.is_shard(0):
            need[m] = Replicate()
            out_pl.append(Partial("sum"))
        else:
            raise ValueError(f"embedding: weight placement {wp} is not supported "
                             f"(Replicate, Shard(0) or Shard(1))")
    if tuple(need) != idx.placements:
        idx = idx.redistribute(mesh, need)
    out_shape = tuple(idx.shape) + (weight.shape[1],)
    if ctx is not None:
        ctx.idx, ctx.weight_spec, ctx.out_pl = idx, weight._spec, tuple(out_pl)
    if mesh.get_coordinate() is None:
        return _wrap_like(mesh, out_pl, out_shape, np.empty((0,), weight.dtype))
    local_idx, w = idx.to_local(), weight.to_local()
    shape, offset = compute_local_shape_and_global_offset(weight.shape, mesh,
                                                          weight.placements)
    lo, rows = offset[0], shape[0]
    if weight.shape[0] == rows:  # the whole vocabulary is here
        _check_indices(local_idx, rows)
        out = w[local_idx]
    else:
        outside = (local_idx < lo) | (local_idx >= lo + rows)
        out = np.zeros(local_idx.shape + (w.shape[1],), w.dtype)
        if rows:
            inside = ~outside
            out[inside] = w[local_idx[inside] - lo]
    return _wrap_like(mesh, out_pl, out_shape, out)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale=None):
    """softmax(q @ k^T * scale + mask) @ v over the last two dims, as torch
    (``scale`` defaults to 1/sqrt(head_dim); a boolean ``attn_mask`` keeps True;
    a float one is added). Query (..., L, E), key (..., S, E), value (..., S, Ev).

    DTensor inputs are computed locally per shard of the leading (batch, head)
    dims: key and value are first given the query's placements, and the sequence
    and feature dims are made whole (gathered) where they are sharded. The output
    has the query's placements. ``attn_mask`` is an ndarray of shape (L, S).
    Local when only batch or head dims are sharded (the tensor-parallel case);
    collective on the mesh when a sequence or feature dim must be gathered.

    Example::

        >>> q = np.ones((1, 2, 4, 8)); scaled_dot_product_attention(q, q, q).shape
        (1, 2, 4, 8)

    Inside ``mpitensor.experimental.context_parallel(mesh)`` the inputs are this
    rank's sequence shards (dim -2) and attention runs as ring attention over
    ``mesh``: collective, without ``attn_mask`` or dropout. There, DTensors whose
    local parts are the shards (all three) are recorded for autograd, and the
    backward is ring attention's.
    """
    cp = _modes.context_parallel()
    if cp is not None:
        return cp.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale)
    if not (_is_dt(query) or _is_dt(key) or _is_dt(value)):
        return _sdpa_local(_float(np.asarray(query)), _float(np.asarray(key)),
                           _float(np.asarray(value)), attn_mask, dropout_p, is_causal,
                           scale, None)
    if not (_is_dt(query) and _is_dt(key) and _is_dt(value)):
        raise _mixed("scaled_dot_product_attention", "query, key and value must all be "
                     "DTensors or all ndarrays")
    if _is_dt(attn_mask):
        attn_mask = attn_mask.detach().full_tensor()
    if attn_mask is not None and np.ndim(attn_mask) > 2:
        raise ValueError("scaled_dot_product_attention on DTensors takes an (L, S) mask")
    return _Attention.apply(query, key, value, attn_mask, dropout_p, is_causal, scale)


class _Attention(Function):
    """scaled_dot_product_attention on DTensors, per local (batch, head) block. The
    backward recomputes the attention weights from the saved q, k, v (and the
    forward's dropout mask) and gives q, k, v gradients in the placements the
    forward computed in: no communication beyond making the output's gradient
    match them."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale):
        return _sdpa_dtensor(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale)

    @staticmethod
    def backward(ctx, g):
        q, k, v = ctx.saved_tensors
        pl = q.placements
        if g.placements != pl:
            g = g.redistribute(g.device_mesh, pl)
        mesh = q.device_mesh
        if mesh.get_coordinate() is None:
            return tuple(_wrap_like(mesh, pl, x.shape, np.empty((0,), x.dtype))
                         for x in (q, k, v)) + (None,) * 4
        grads = _sdpa_backward(q._data(), k._data(), v._data(), g._data(), ctx.attn_mask,
                               ctx.dropout_p, ctx.is_causal, ctx.scale, ctx.keep)
        return tuple(_wrap_like(mesh, pl, x.shape, gx.astype(x.dtype, copy=False))
                     for x, gx in zip((q, k, v), grads)) + (None,) * 4


def _sdpa_dtensor(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale):
    nd = query.ndim
    pl = [Replicate() if p.is_partial() or (p.is_shard() and p.dim >= nd - 2) else p
          for p in query.placements]
    q, k, v = (x.redistribute(query.device_mesh, pl) if x.placements != tuple(pl) else x
               for x in (query, key, value))
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    drop = None
    if dropout_p > 0.0:
        shape = tuple(q.shape[:-1]) + (k.shape[-2],)
        _, offset = compute_local_shape_and_global_offset(shape, q.device_mesh, pl)
        drop = (shape, offset)
    saved = {}
    local = _sdpa_local(q.to_local(), k.to_local(), v.to_local(), attn_mask, dropout_p,
                        is_causal, scale, drop, saved)
    ctx.save_for_backward(q, k, v)
    ctx.attn_mask, ctx.dropout_p, ctx.is_causal = attn_mask, dropout_p, is_causal
    ctx.scale, ctx.keep = scale, saved.get("keep")
    return _wrap_like(q.device_mesh, pl, out_shape, local)


def _attention_weights(q, k, attn_mask, is_causal, scale):
    """softmax(q k^T * scale + mask) of local arrays (NumPy)."""
    L, S = q.shape[-2], k.shape[-2]
    scores = np.matmul(q, np.swapaxes(k, -1, -2))
    scores *= scale
    if is_causal:
        np.copyto(scores, -np.inf, where=~np.tri(L, S, dtype=bool))
    elif attn_mask is not None:
        mask = np.asarray(attn_mask)
        if mask.dtype == bool:
            np.copyto(scores, -np.inf, where=~mask)
        else:
            scores = scores + mask
    if scores.size:
        scores -= np.max(scores, axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= np.sum(scores, axis=-1, keepdims=True)
    return scores


def _sum_local_to(a, shape):
    """Local ``a`` summed over the dims broadcasting to it added to ``shape``."""
    if a.shape == tuple(shape):
        return a
    lead = a.ndim - len(shape)
    a = a.sum(axis=tuple(range(lead))) if lead else a
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, a.shape)) if n == 1 and m != 1)
    return a.sum(axis=axes, keepdims=True) if axes else a


def _sdpa_backward(q, k, v, g, attn_mask, dropout_p, is_causal, scale, keep):
    """The gradients of attention in q, k, v (local arrays): with P the weights and
    D the dropout scaling, dV = (P D)^T g, dP = (g V^T) D, dS = P (dP - rowsum(dP P)),
    dQ = dS K scale, dK = dS^T Q scale."""
    if _kernels.narrow(q, k, v, g):  # in float32, rounded once (see nn._kernels)
        grads = _sdpa_backward(*(_kernels.widen(a) for a in (q, k, v, g)), attn_mask,
                               dropout_p, is_causal, scale, keep)
        return tuple(x.astype(q.dtype) for x in grads)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if attn_mask is None and keep is None:
        grads = _kernels.attention_backward(q, k, v, g, scale, is_causal)
        if grads is not None:
            return grads
    p = _attention_weights(q, k, attn_mask, is_causal, scale)
    dp = np.matmul(g, np.swapaxes(v, -1, -2))
    if keep is not None:
        factor = 0.0 if dropout_p == 1.0 else 1.0 / (1.0 - dropout_p)
        pd = np.where(keep, p * factor, 0.0)
        dp = np.where(keep, dp * factor, 0.0)
    else:
        pd = p
    dv = np.matmul(np.swapaxes(pd, -1, -2), g)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    ds *= scale
    dq = np.matmul(ds, k)
    dk = np.matmul(np.swapaxes(ds, -1, -2), q)
    return _sum_local_to(dq, q.shape), _sum_local_to(dk, k.shape), _sum_local_to(dv, v.shape)


def _sdpa_local(q, k, v, attn_mask, dropout_p, is_causal, scale, drop, saved=None):
    if _kernels.narrow(q, k, v):  # in float32, rounded once (see nn._kernels)
        out = _sdpa_local(*(_kernels.widen(a) for a in (q, k, v)), attn_mask, dropout_p,
                          is_causal, scale, drop, saved)
        return out.astype(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: pass attn_mask or is_causal, "
                         "not both")
    if attn_mask is None and dropout_p == 0.0 and _kernels.attention_fits(q, k, v):
        return _kernels.attention(q, k, v, scale, is_causal)
    scores = _attention_weights(q, k, attn_mask, is_causal, scale)
    if dropout_p > 0.0:
        scores = _dropout_weights(scores, dropout_p, drop, saved)
    return np.matmul(scores, v)


def _dropout_weights(weights, p, drop, saved=None):
    shape, offset = drop if drop is not None else (weights.shape, (0,) * weights.ndim)
    u = _random.fill(np.empty(weights.shape, np.float64), shape, offset, _random._UNIFORM,
                     _random._next_stream())
    keep = u >= p
    if saved is not None:
        saved["keep"] = keep
    return np.where(keep, weights / (1.0 - p), 0.0)


def cross_entropy(input, target, weight=None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0):
    """Cross entropy between logits ``input`` ((N, C), (N, C, d...) or (C,)) and class
    indices ``target``, as torch (``weight`` per class, ``ignore_index``,
    ``reduction`` "mean" | "sum" | "none", ``label_smoothing`` in [0, 1]: the
    target is mixed with the uniform distribution, ``(1 - ε) nll + ε/C ·
    Σ_c -w_c log p_c``, reduced as torch does: "mean" divides both terms by the
    weight sum of the non-ignored targets).

    Plain arrays give plain results. A DTensor input is made whole on the class
    dim first (an all-gather), unless inside :func:`mpitensor.parallel.loss_parallel`,
    where logits sharded on the class dim are never gathered: the log-sum-exp and
    the target logits are combined with two all-reduces of size N (with
    ``label_smoothing`` the second carries the weighted logit sum too). DTensor inputs
    give a Replicate DTensor. Collective for DTensor inputs.

    Example::

        >>> cross_entropy(np.array([[0.0, 0.0]]), np.array([1]))
        0.6931471805599453
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', "
                         f"got {reduction!r}")
    label_smoothing = float(label_smoothing)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0, "
                         f"got {label_smoothing}")
    if _is_dt(target):
        target = target.full_tensor()
    target = np.asarray(target)
    if target.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: target must hold class indices (integers), got "
                        f"{target.dtype}")
    if _is_dt(weight):
        weight = weight.full_tensor()
    if not _is_dt(input):
        return _cross_entropy_local(_float(np.asarray(input)), target, weight,
                                    ignore_index, reduction, label_smoothing)
    sharded = _modes.loss_parallel()
    if sharded is not None:
        return sharded(input, target, weight, ignore_index, reduction, label_smoothing)
    return _CrossEntropy.apply(input, target, weight, ignore_index, reduction,
                               label_smoothing)


class _CrossEntropy(Function):
    """cross_entropy of a DTensor gathered whole: the gradient is computed whole on
    every rank (Replicate) and each rank keeps its part of the input's placements
    (a local slice, no communication)."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, input, target, weight, ignore_index, reduction, label_smoothing):
        full = _float(input.full_tensor())
        out = _cross_entropy_local(full, target, weight, ignore_index, reduction,
                                   label_smoothing)
        ctx.full = full
        ctx.args = (target, weight, ignore_index, reduction, label_smoothing)
        ctx.placements = input.placements
        return DTensor.from_local(np.asarray(out), input.device_mesh)

    @staticmethod
    def backward(ctx, g):
        x = ctx.full
        cd = class_dim(x.ndim)
        grad = softmax_grad(_softmax_local(x, cd), cd, g, 0, *ctx.args, x.shape[cd])
        mesh = g.device_mesh
        whole = DTensor.from_local(grad.astype(x.dtype, copy=False), mesh,
                                   [Replicate()] * mesh.ndim, run_check=False)
        pl = tuple(Replicate() if p.is_partial() else p for p in ctx.placements)
        return whole.redistribute(mesh, pl), None, None, None, None, None


def softmax_grad(p, cd, g, lo, target, weight, ignore_index, reduction, label_smoothing,
                 n_classes):
    """The gradient of cross_entropy in logits whose class dim ``cd`` holds the
    classes ``lo ..`` of ``p`` (their softmax) out of ``n_classes``:
    ``(p - onehot(target)) * coef``, coef each item's weight times its output
    gradient (over the weight sum for "mean"); with label smoothing ε that term
    times 1 - ε plus ε/C times ``(p Σ_c w_c - w) * g`` (over the same sum for
    "mean"), the gradient of ``Σ_c -w_c log p_c``. ``g`` is the loss's gradient
    DTensor. Local but for making ``g`` Replicate."""
    mesh = g.device_mesh
    if any(not q.is_replicate() for q in g.placements):
        g = g.redistribute(mesh, [Replicate()] * mesh.ndim)
    gl = g._data()
    keep = target != ignore_index
    w = _target_weights(target, weight, keep)
    scale = gl / w.sum() if reduction == "mean" else gl * np.ones(target.shape)
    coef = w * scale * (1.0 - label_smoothing)
    grad = p * np.expand_dims(coef, cd)
    n = p.shape[cd]
    if label_smoothing:
        smooth = np.expand_dims(np.where(keep, scale, 0.0) * (label_smoothing / n_classes),
                                cd)
        if weight is None:
            grad += smooth * (p * n_classes - 1.0)
        else:
            shape = [1] * p.ndim
            shape[cd] = n
            w_c = np.asarray(weight, p.dtype)
            grad += smooth * (p * w_c.sum() - w_c[lo:lo + n].reshape(shape))
    mine = keep & (target >= lo) & (target < lo + n)
    idx = np.expand_dims(np.where(mine, target - lo, 0), cd)
    if n:
        picked = np.take_along_axis(grad, idx, cd) - np.expand_dims(np.where(mine, coef, 0.0),
                                                                    cd)
        np.put_along_axis(grad, idx, picked, cd)
    return grad


def _target_weights(target, weight, keep):
    """Each item's class weight, 0 where its target is ignored."""
    w = np.ones(target.shape) if weight is None else np.asarray(weight)[
        np.where(keep, target, 0)]
    return np.where(keep, w, 0.0)


def class_dim(ndim: int) -> int:
    """The class dim of cross_entropy's input: 0 for (C,), else 1."""
    return 0 if ndim == 1 else 1


def check_target(input_shape, target, ignore_index) -> None:
    """Same checks on every rank (shapes and indices are replicated): ValueError."""
    cd = class_dim(len(input_shape))
    want = tuple(input_shape[:cd]) + tuple(input_shape[cd + 1:])
    if tuple(target.shape) != want:
        raise ValueError(f"cross_entropy: target shape {tuple(target.shape)} does not "
                         f"match input shape {tuple(input_shape)} (expected {want})")
    valid = target[target != ignore_index]
    if valid.size and (valid.min() < 0 or valid.max() >= input_shape[cd]):
        raise IndexError(f"cross_entropy: target out of range [0, {input_shape[cd]})")


def reduce_loss(losses, target, weight, ignore_index, reduction, smooth=None,
                label_smoothing=0.0, n_classes=1):
    """Apply ignore_index, class weights and the reduction to per-item losses;
    with label smoothing ε, ``smooth`` is each item's ``Σ_c -w_c log p_c``, mixed
    in as torch does: ``(1 - ε) nll + ε/C smooth``, both reduced alike ("mean"
    divides by the weight sum of the non-ignored targets)."""
    keep = target != ignore_index
    w = _target_weights(target, weight, keep)
    losses = losses * w
    if label_smoothing:
        losses = (1.0 - label_smoothing) * losses + \
            (label_smoothing / n_classes) * np.where(keep, smooth, 0.0)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / w.sum()


def _cross_entropy_local(x, target, weight, ignore_index, reduction, label_smoothing=0.0):
    check_target(x.shape, target, ignore_index)
    cd = class_dim(x.ndim)
    logp = _log_softmax_local(x, cd)
    safe = np.expand_dims(np.where(target != ignore_index, target, 0), cd)
    picked = np.squeeze(np.take_along_axis(logp, safe, axis=cd), axis=cd)
    smooth = None
    if label_smoothing:
        if weight is not None:
            shape = [1] * x.ndim
            shape[cd] = x.shape[cd]
            logp = logp * np.asarray(weight).reshape(shape)
        smooth = -np.sum(logp, axis=cd)
    return reduce_loss(-picked, target, weight, ignore_index, reduction, smooth,
                       label_smoothing, x.shape[cd])
