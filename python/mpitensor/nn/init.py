"""Parameter initialisation in place, as torch.nn.init, on DTensors and ndarrays.

Random values come from the mesh-invariant generator of :mod:`mpitensor.random`:
each call takes the next stream, and an element's value depends only on the seed,
the stream and its global index. A sharded DTensor therefore gets exactly the
values the same call gives the whole tensor on one rank, whatever the mesh and
placements, with no communication. Draws are made in float64 and rounded to the
tensor's dtype. Every rank calls these functions in the same order (SPMD), as the
random factories.

Example::

    >>> mpitensor.manual_seed(0)
    >>> w = mpitensor.empty(1024, 256, device_mesh=mesh, placements=[Shard(0)])
    >>> mpitensor.nn.init.trunc_normal_(w, std=0.02)   # as on one rank, shard by shard
"""

from __future__ import annotations

import math

import numpy as np

from .. import random as _random
from .._dtensor import DTensor
from .._layout import compute_local_shape_and_global_offset
from .module import Parameter

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "zeros_",
           "ones_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_"]


def _unwrap(tensor):
    if isinstance(tensor, Parameter):
        tensor = tensor.data
    if isinstance(tensor, DTensor):
        if any(p.is_partial() for p in tensor.placements):
            raise ValueError(f"cannot initialise a Partial DTensor ({tensor.placements}) "
                             f"in place; initialise a Replicate or Shard one")
        return tensor, tensor._data()
    if isinstance(tensor, np.ndarray):
        return tensor, tensor
    raise TypeError(f"init takes a DTensor or an ndarray, got {type(tensor).__name__}")


def _floating(tensor, local: np.ndarray) -> None:
    if local.dtype.kind != "f":
        raise TypeError(f"random init fills floating point tensors, not {local.dtype}")


def _draw(tensor, dist: int, transform) -> None:
    """Fills ``tensor``'s local part with ``transform`` of its box of the next
    random stream (uniform [0, 1) or standard normal, float64)."""
    tensor, local = _unwrap(tensor)
    _floating(tensor, local)
    stream = _random._next_stream()  # every rank advances, members or not
    if isinstance(tensor, DTensor):
        if tensor.device_mesh.get_coordinate() is None:
            return
        _, offset = compute_local_shape_and_global_offset(
            tensor.shape, tensor.device_mesh, tensor.placements)
        shape = tensor.shape
    else:
        shape, offset = local.shape, (0,) * local.ndim
    work = np.empty(local.shape, np.float64)
    _random.fill(work, shape, tuple(offset), dist, stream)
    np.copyto(local, transform(work), casting="unsafe")


def _ret(tensor):
    return tensor.data if isinstance(tensor, Parameter) else tensor


def uniform_(tensor, a: float = 0.0, b: float = 1.0):
    """Fills ``tensor`` with values from U(a, b), in place; returns it. Local.

    Example: ``uniform_(w, -0.1, 0.1)``.
    """
    _draw(tensor, _random._UNIFORM, lambda u: a + (b - a) * u)
    return _ret(tensor)


def normal_(tensor, mean: float = 0.0, std: float = 1.0):
    """Fills ``tensor`` with values from N(mean, std**2), in place; returns it. Local.

    Example: ``normal_(w, std=0.02)``.
    """
    _draw(tensor, _random._NORMAL, lambda z: mean + std * z)
    return _ret(tensor)


# Acklam's rational approximation of the normal quantile (relative error below
# 1.2e-9): NumPy has neither erfinv nor the quantile.
_A = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
      1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
_B = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
      6.680131188771972e+01, -1.328068155288572e+01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
      -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
      3.754408661907416e+00)
_P_LOW = 0.02425


def _poly(coeffs, x):
    out = np.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        out = out * x + c
    return out


def _ndtri(p: np.ndarray) -> np.ndarray:
    """The standard normal quantile of ``p`` in (0, 1)."""
    out = np.empty_like(p)
    low, high = p < _P_LOW, p > 1 - _P_LOW
    mid = ~(low | high)
    q = p[mid] - 0.5
    r = q * q
    out[mid] = _poly(_A, r) * q / (_poly(_B, r) * r + 1)
    for mask, sign, tail in ((low, 1.0, p[low]), (high, -1.0, 1 - p[high])):
        t = np.sqrt(-2 * np.log(tail))
        out[mask] = sign * _poly(_C, t) / (_poly(_D, t) * t + 1)
    return out


def _norm_cdf(x: float) -> float:
    return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0


def trunc_normal_(tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0):
    """Fills ``tensor`` with values from N(mean, std**2) truncated to [a, b] (absolute
    bounds, as torch's), in place, by the inverse CDF of a uniform draw; returns
    it. Local.

    Example: ``trunc_normal_(w, std=0.02, a=-0.04, b=0.04)``.
    """
    lo, hi = _norm_cdf((a - mean) / std), _norm_cdf((b - mean) / std)

    def transform(u):
        p = np.clip(lo + (hi - lo) * u, np.finfo(np.float64).tiny, 1 - 2**-53)
        return np.clip(mean + std * _ndtri(p), a, b)

    _draw(tensor, _random._UNIFORM, transform)
    return _ret(tensor)


def constant_(tensor, val: float):
    """Fills ``tensor`` with ``val``, in place; returns it. Local.

    Example: ``constant_(bias, 0.1)``.
    """
    _, local = _unwrap(tensor)
    local[...] = val
    return _ret(tensor)


def zeros_(tensor):
    """Fills ``tensor`` with zeros, in place; returns it. Local.

    Example: ``zeros_(bias)``.
    """
    return constant_(tensor, 0)


def ones_(tensor):
    """Fills ``tensor`` with ones, in place; returns it. Local.

    Example: ``ones_(norm.weight)``.
    """
    return constant_(tensor, 1)


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The recommended gain for a nonlinearity, as torch.nn.init's. Local.

    Example: ``calculate_gain("relu")`` is ``sqrt(2)``.
    """
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
              "conv_transpose2d", "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _fans(tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight of shape (out, in, *kernel), as torch's."""
    shape = tuple(_unwrap(tensor)[0].shape)
    if len(shape) < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer "
                         "than 2 dimensions")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def xavier_uniform_(tensor, gain: float = 1.0):
    """Glorot uniform: U(-b, b) with ``b = gain * sqrt(6 / (fan_in + fan_out))``, in
    place; returns it. Local.

    Example: ``xavier_uniform_(w)``.
    """
    fan_in, fan_out = _fans(tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor, gain: float = 1.0):
    """Glorot normal: N(0, std**2) with ``std = gain * sqrt(2 / (fan_in + fan_out))``,
    in place; returns it. Local.

    Example: ``xavier_normal_(w)``.
    """
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)))


def _kaiming_std(tensor, a, mode, nonlinearity) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _fans(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    if fan == 0:
        raise ValueError("Initializing zero-element tensors is a no-op")
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a: float = 0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu"):
    """He uniform: U(-b, b) with ``b = gain * sqrt(3 / fan)``, ``fan`` by ``mode``;
    in place, returns it. Local.

    Example: ``kaiming_uniform_(w, a=math.sqrt(5))`` (torch's Linear default).
    """
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a: float = 0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu"):
    """He normal: N(0, std**2) with ``std = gain / sqrt(fan)``; in place, returns it.
    Local.

    Example: ``kaiming_normal_(w, mode="fan_out", nonlinearity="relu")``.
    """
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity))
