"""MixedPrecisionPolicy: torch FSDP2's mixed precision, and the casts it makes.

The sharded parameters (and their ``.grad`` and the optimizer's state) keep their
own dtype. A group is gathered in ``param_dtype``, so the all-gather moves that
dtype and the forward and backward compute in it; the gradients are
reduce-scattered in ``reduce_dtype`` and cast to the sharded parameters' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _dtypes
from .._dtensor import DTensor

__all__ = ["MixedPrecisionPolicy"]

# The dtypes a group may be gathered, computed or reduced in.
_FLOATS = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """torch's ``MixedPrecisionPolicy`` for :func:`~mpitensor.fsdp.fully_shard`.

    - ``param_dtype``: the dtype of the unsharded parameters, hence of the
      all-gather and of the forward and backward compute. None: the parameters'
      own dtype.
    - ``reduce_dtype``: the dtype of the gradients' reduce-scatter. None: the
      compute dtype (``param_dtype``, else the parameters' own).
    - ``output_dtype``: floating-point forward outputs are cast to it. None: no cast.
    - ``cast_forward_inputs``: cast the floating-point inputs of the module's
      forward to ``param_dtype`` (when one is set).

    Dtypes are NumPy dtypes (``np.float16``, ``np.float32``, ...) or bfloat16:
    ``ml_dtypes.bfloat16``, ``mpitensor.bfloat16`` or the name ``"bfloat16"``
    (ImportError naming ml_dtypes when it is not installed). fully_shard refuses
    any other dtype with a ValueError on every rank. Local (a value).

    Example::

        >>> from mpitensor.fsdp import MixedPrecisionPolicy, fully_shard
        >>> mp = MixedPrecisionPolicy(param_dtype="bfloat16", reduce_dtype=np.float32)
        >>> fully_shard(model, mesh=mesh, mp_policy=mp)   # gathers move bfloat16
    """

    param_dtype: object = None
    reduce_dtype: object = None
    output_dtype: object = None
    cast_forward_inputs: bool = True

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype", "output_dtype"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _dtypes.as_dtype(value))
        object.__setattr__(self, "cast_forward_inputs", bool(self.cast_forward_inputs))


def policy_problem(policy) -> str | None:
    """What fully_shard refuses in ``policy``, or None."""
    if not isinstance(policy, MixedPrecisionPolicy):
        return (f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got "
                f"{type(policy).__name__}")
    for name in ("param_dtype", "reduce_dtype", "output_dtype"):
        dtype = getattr(policy, name)
        if dtype is not None and dtype.name not in _FLOATS:
            return (f"fully_shard: MixedPrecisionPolicy.{name} is {dtype}; mixed "
                    f"precision takes one of {', '.join(_FLOATS)}")
    return None


def group_problem(policy: MixedPrecisionPolicy, dtype: np.dtype, module: str) -> str | None:
    """What the policy cannot do with a group of parameters of ``dtype``, or None."""
    if _dtypes.is_floating(dtype) or (policy.param_dtype is None
                                      and policy.reduce_dtype is None):
        return None
    return (f"fully_shard: {module}'s parameters are {dtype}; a MixedPrecisionPolicy with "
            f"param_dtype or reduce_dtype casts real floating-point parameters only")


def cast_floats(value, dtype: np.dtype):
    """``value`` with every floating-point DTensor and ndarray (in tuples, lists
    and dicts) cast to ``dtype``, as torch's ``_cast_fp_tensor``; a DTensor's cast
    is recorded for autograd (its gradient is cast back)."""
    if type(value) is DTensor or isinstance(value, np.ndarray):
        if not _dtypes.is_floating(value.dtype) or value.dtype == dtype:
            return value
        return value.astype(dtype)
    if isinstance(value, (tuple, list)):
        items = [cast_floats(v, dtype) for v in value]
        if hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*items)
        return type(value)(items)
    if isinstance(value, dict):
        return type(value)((k, cast_floats(v, dtype)) for k, v in value.items())
    return value
