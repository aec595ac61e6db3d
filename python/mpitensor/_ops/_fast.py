"""The C fast path of NumPy operations on DTensors (csrc/ext/ext_dispatch.c).

The operators, ``__array_ufunc__`` and the reduction methods of DTensor are C
functions of its base ``_C.DTensorBase``. A call whose decision the Python slow
path (this package) has made before and recorded there runs in C: a lookup keyed
by the identity of the operands' layouts, the NumPy call on the local arrays, and
the result allocated with the recorded output layout. The slow path records only
decisions that need no communication, on ranks of the mesh, for calls without
keywords (``out=``, ``dtype=``, ...) whose operands are DTensors and Python or
NumPy scalars. Any other call, and any call of a ufunc with an
``experimental.register_sharding`` rule, takes the slow path unchanged.

The recorded decisions live on each mesh (``mesh._dispatch``, a
``_C.DispatchTable``), which also hands every DTensor of one layout (placements,
shape, dtype, stride) on that mesh the same layout tuple when the DTensor is made
(``DTensor(local, spec)``), so a fresh DTensor (``from_local``, ``redistribute``, a
result) of a known layout hits on its first operation. The table holds no
reference to its mesh, so a dropped mesh is freed as before.
"""

from __future__ import annotations

import contextlib

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from .. import _C, _registry
from .._dtensor import DTensor
from ._elementwise import array_ufunc
from ._reductions import IMPLS

__all__ = ["install", "enabled", "clear", "stats"]


def install(dtensor_type) -> None:
    """Connects the C fast path of ``dtensor_type`` (mpitensor.DTensor) to the slow
    path. Local; called once when mpitensor._ops is imported."""
    _C.dispatch_install(dtensor_type, _registry.rules, array_ufunc, _rewrap,
                        NDArrayOperatorsMixin, np, IMPLS)


def _rewrap(spec, local):
    """A fast-path result that is not an ndarray of the recorded dtype: wrapped as
    the slow path's D.wrap would."""
    local = np.asarray(local)
    if local.dtype != spec.dtype:
        spec = spec._replace(dtype=local.dtype)
    return DTensor(local, spec)


@contextlib.contextmanager
def enabled(flag: bool):
    """Within this context the fast path is on (True) or off (False). Local.

    Example::

        >>> with enabled(False):
        ...     c = a + b      # the Python slow path, for comparison
    """
    was = _C.dispatch_enable(flag)
    try:
        yield
    finally:
        _C.dispatch_enable(was)


def clear(mesh) -> None:
    """Forgets the decisions recorded for the fast path on ``mesh``, and its shared
    layouts. Local."""
    mesh._dispatch.clear()


def stats() -> tuple[int, int]:
    """(hits, misses) of the fast path since the extension was loaded. Local."""
    return _C.dispatch_stats()
