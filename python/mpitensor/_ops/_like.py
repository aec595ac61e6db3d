"""``np.zeros_like``, ``ones_like``, ``empty_like`` and ``full_like`` of a DTensor:
a DTensor of the same global shape and placements (strided shards too), made
locally with no communication. A Partial becomes Replicate, as torch's ``*_like``
do: the new values are the tensor's values, not parts of a sum. With another
``shape=`` the placements stay when the number of dims does, else Replicate (as
``mpitensor.zeros_like``); a strided shard, a layout of the input's shape only,
becomes Replicate.
"""

from __future__ import annotations

import numpy as np

from .. import _args, _registry, _strided
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Replicate


def _like(name, a, dtype, shape, make):
    if type(a) is not DTensor:
        raise TypeError(f"numpy.{name}: expected a DTensor, got {type(a).__name__}")
    dtype = a.dtype if dtype is None else _args.check_dtype(np.dtype(dtype))
    s = a._spec
    placements = tuple(Replicate() if p.is_partial() else p for p in s.placements)
    new_shape = s.shape if shape is None else tuple(
        int(n) for n in np.atleast_1d(np.asarray(shape, dtype=np.intp)))
    if new_shape == s.shape:
        local = make(a.to_local().shape, dtype)
    else:
        # Another shape: the placements stay for as many dims, else Replicate, as
        # mpitensor.zeros_like(shape=) has them.
        if any(n < 0 for n in new_shape):
            raise ValueError("negative dimensions are not allowed")
        if len(new_shape) != len(s.shape):
            placements = (Replicate(),) * len(placements)
        # A strided shard is a layout of the input's shape: as the executor
        # would move the input, its mesh dims are replicated (no data is read).
        placements = _strided.plain_of(placements)
        if s.mesh._coordinate is None:
            local = make((0,) if new_shape else (), dtype)
        else:
            local = make(compute_local_shape_and_global_offset(
                new_shape, s.mesh, placements)[0], dtype)
    return DTensor(local, DTensorSpec(s.mesh, placements, new_shape, dtype,
                                      contiguous_strides(new_shape)))


@_registry.implements(np.zeros_like, takes_strided=True)
def zeros_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    """np.zeros_like: placements kept (Partial -> Replicate). Local.

    Example: ``np.zeros_like(dt).placements == dt.placements`` for a Shard ``dt``.
    """
    return _like("zeros_like", a, dtype, shape, np.zeros)


@_registry.implements(np.ones_like, takes_strided=True)
def ones_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    """np.ones_like: placements kept (Partial -> Replicate). Local.

    Example: ``np.ones_like(dt).sum()`` is ``dt.size`` as a Partial(sum) over shards.
    """
    return _like("ones_like", a, dtype, shape, np.ones)


@_registry.implements(np.empty_like, takes_strided=True)
def empty_like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
    """np.empty_like: placements kept (Partial -> Replicate), values unset. Local.

    Example: ``np.empty_like(dt, dtype=np.float32).dtype == np.float32``.
    """
    return _like("empty_like", a, dtype, shape, np.empty)


@_registry.implements(np.full_like, takes_strided=True)
def full_like(a, fill_value, dtype=None, order="K", subok=True, shape=None, *,
              device=None):
    """np.full_like: placements kept (Partial -> Replicate). Local.

    Example: ``np.full_like(dt, 7).full_tensor()`` is all sevens.
    """
    if isinstance(fill_value, DTensor) or (isinstance(fill_value, np.ndarray)
                                           and fill_value.ndim > 0):
        raise TypeError("numpy.full_like on DTensors takes a scalar fill_value")
    return _like("full_like", a, dtype, shape,
                 lambda shape, dt: np.full(shape, fill_value, dt))
