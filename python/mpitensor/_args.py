"""Argument checks shared by the public entry points.

Every check here is local and depends only on arguments that are equal on all
ranks in an SPMD program, so bad input raises the same error on every rank before
any communication starts.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from . import _clib, _comm, _dtypes
from .device_mesh import DeviceMesh, _current_mesh
from .placement_types import Partial, Placement, Replicate, Shard, _StridedShard


def resolve_mesh(device_mesh) -> DeviceMesh:
    if device_mesh is None:
        return _current_mesh()
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"device_mesh must be a DeviceMesh, got {type(device_mesh).__name__}")
    return device_mesh


def normalize_placements(placements, mesh: DeviceMesh, ndim: int) -> tuple[Placement, ...]:
    """Placements as a tuple, Replicate by default, shard dims made non-negative."""
    if placements is None:
        return _all_replicate(mesh.ndim)
    placements = tuple(placements)
    if len(placements) != mesh.ndim:
        raise ValueError(
            f"`placements` must have the same length as `device_mesh.ndim`! Found "
            f"{len(placements)} placements for a {mesh.ndim}-D mesh: {placements}"
        )
    out, partial_op = [], None
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"placements must be Shard, Replicate or Partial, got {p!r}")
        if isinstance(p, Partial):
            partial_op = _one_partial_op(partial_op, p.reduce_op, placements)
        elif isinstance(p, Shard):
            if not -ndim <= p.dim < ndim:
                raise IndexError(
                    f"{p!r} is out of range for a tensor with {ndim} dims"
                )
            p = Shard(p.dim + ndim) if p.dim < 0 else p
        elif isinstance(p, _StridedShard):
            if not -ndim <= p.dim < ndim:
                raise IndexError(
                    f"{p!r} is out of range for a tensor with {ndim} dims"
                )
            if p.dim < 0:
                p = _StridedShard(p.dim + ndim, split_factor=p.split_factor)
        out.append(p)
    return tuple(out)


# Sum and avg commute, so either order of reducing them gives the same value; any
# other mix (sum then max differs from max then sum) has no order torch defines.
_COMMUTING = frozenset(("sum", "avg"))


def _one_partial_op(seen, op: str, placements) -> str:
    """`op` after checking it may share a placement list with `seen`, torch's rule."""
    if seen is None or seen == op or (seen in _COMMUTING and op in _COMMUTING):
        return op
    raise ValueError(
        f"Mixed Partial reduce types are not supported in the same placement list. "
        f"Found reduce ops: {sorted({seen, op})} in {tuple(placements)}. Please ensure "
        f"all Partial placements use the same reduce operation (sum and avg may mix)."
    )


_REPLICATED: dict[int, tuple] = {}


def _all_replicate(ndim: int) -> tuple[Placement, ...]:
    out = _REPLICATED.get(ndim)
    if out is None:
        out = _REPLICATED[ndim] = (Replicate(),) * ndim
    return out


def reject_partial(placements: Sequence[Placement], what: str) -> None:
    for p in placements:
        if isinstance(p, Partial):
            raise ValueError(
                f"{what} creates Shard or Replicate tensors, got {p!r}; build Partial "
                f"tensors with DTensor.from_local"
            )


def axes(axis, ndim: int) -> tuple[int, ...]:
    """NumPy's normalisation of an ``axis`` argument of an ``ndim``-dim array: None
    is every axis; an int in range is taken as it is, without NumPy's parse, which
    a call on a small array would feel. Local.

    Example: ``axes(-1, 3) == (2,)``.
    """
    if axis is None:
        return tuple(range(ndim))
    if type(axis) is int and 0 <= axis < ndim:
        return (axis,)
    return normalize_axis_tuple(axis, ndim)


def holds(dtype: np.dtype) -> bool:
    """Whether a DTensor holds values of NumPy dtype ``dtype``: numbers (bool, int,
    uint, float, complex, ml_dtypes' bfloat16), not dates, strings or objects.

    Example: ``holds(np.dtype("M8[s]"))`` is False.
    """
    return (dtype.kind in "biufc" or _dtypes.is_bfloat16(dtype)) and not dtype.hasobject


def check_dtype(dtype) -> np.dtype:
    """A NumPy numeric dtype (bool, int, uint, float, complex, ml_dtypes' bfloat16),
    else TypeError (ImportError naming ml_dtypes for ``"bfloat16"`` without it)."""
    try:
        dt = _dtypes.as_dtype(dtype)
    except TypeError as e:
        raise TypeError(f"not a NumPy dtype: {dtype!r}") from e
    if not holds(dt):
        raise TypeError(
            f"DTensors hold numeric data (bool, int, uint, float, complex, bfloat16); "
            f"got dtype {dt}"
        )
    # Refused here, once, rather than by the first operation that moves or reduces
    # it: the core's kernels and MPI types know native, fixed-size elements only.
    if not dt.isnative or _clib.dtype_code(dt) < 0:
        near = np.dtype(f"{dt.kind}{min(dt.itemsize, 16 if dt.kind == 'c' else 8)}")
        raise TypeError(
            f"DTensors hold bool, int8-64, uint8-64, float16/32/64, complex64/128 or "
            f"bfloat16 elements in native byte order; got dtype {dt.str!r} ({dt}): "
            f"convert it first, e.g. array.astype({near.name!r})"
        )
    return dt


def _ints(values, what: str) -> tuple[int, ...]:
    """The one rule for sizes, shapes and strides: Python or NumPy ints, never a
    bool or a float (2.5 would be truncated silently), else TypeError."""
    try:
        values = tuple(values)
    except TypeError as e:
        raise TypeError(f"{what} must be a sequence of ints, got {values!r}") from e
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{what} must be ints, got {values!r}")
    return tuple(int(v) for v in values)


def parse_size(size) -> tuple[int, ...]:
    """Factory sizes given as varargs ints or one list/tuple, like torch."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    size = _ints(size, "size")
    if any(s < 0 for s in size):
        raise ValueError(f"negative dimension in size {size}")
    return size


def check_shape(shape, ndim: int) -> tuple[int, ...]:
    """from_local's ``shape=``: ints (as the factories' sizes), one per local dim."""
    shape = _ints(shape, "shape")
    if len(shape) != ndim or any(s < 0 for s in shape):
        raise ValueError(f"shape {shape} does not fit a local tensor with {ndim} dims")
    return shape


_INT64_MAX = 2**63 - 1


def check_extent(shape, stride, dtype: np.dtype) -> None:
    """A global shape (and strides, when given) whose element count, byte size or
    farthest byte offset does not fit an int64 is refused (OverflowError), as the
    core refuses such a tensor's layout: a size that wrapped around would pass every
    later check and answer nonsense (a negative ``size``).

    Example: ``check_extent((2**62, 4), None, np.dtype("f8"))`` raises OverflowError.
    """
    count = 1
    for s in shape:
        count *= s
    reach = sum(abs(t) * max(s - 1, 0) for s, t in zip(shape, stride or ()))
    if count > _INT64_MAX or count * dtype.itemsize > _INT64_MAX or \
            reach * dtype.itemsize > _INT64_MAX:
        raise OverflowError(
            f"The tensor has more than {_INT64_MAX} elements or bytes: shape "
            f"{tuple(shape)}{'' if stride is None else f', stride {tuple(stride)}'} "
            f"of {dtype.itemsize}-byte elements"
        )


def check_stride(stride, ndim: int) -> tuple[int, ...]:
    """from_local's ``stride=``: ints, one per dim of ``shape``."""
    stride = _ints(stride, "stride")
    if len(stride) != ndim:
        raise ValueError(f"stride {stride} does not match a shape with {ndim} dims")
    return stride


def raise_on_every_rank(mesh: DeviceMesh, error: Exception):
    """Raises ``error``, a local check that failed on this rank, on every member of
    the mesh: it goes into the agreement that the other members' first collective
    of the same call enters (``_comm.agree`` here, ``mt_agree`` in C), so each
    member raises the first failing member's exception and the next call pairs.
    Call it only where the call is collective on every rank that passed its checks.
    Collective on the mesh; never returns.

    Example::

        try:
            pl = normalize_placements(placements, mesh, array.ndim)
        except Exception as e:
            raise_on_every_rank(mesh, e)
    """
    try:
        _comm.agree(mesh, False, 0, str(error), type(error))
    except Exception as agreed:  # noqa: BLE001 - the agreed one replaces it
        raise agreed from error
    raise error


def reject_masked(array, what: str) -> None:
    """A numpy.ma.MaskedArray would lose its mask (a DTensor has none): TypeError."""
    if isinstance(array, np.ma.MaskedArray):
        raise TypeError(
            f"{what} does not take a numpy.ma.MaskedArray: a DTensor has no mask, so "
            f"the mask would be lost; pass array.filled(value) or array.data and the "
            f"mask as a second (bool) DTensor"
        )
