"""``np.packbits`` and ``np.unpackbits`` of DTensors.

Packing eight elements into a byte (and back) is local along an axis no mesh dim
cuts: each rank packs its own block, and the result keeps every Shard of the other
dims. Along the axis one mesh dim cuts, it stays local when the blocks' bounds are
multiples of eight elements (packbits) and the result's torch.chunk blocks fall on
the packed bounds (both: the blocks of the result are the packed blocks); otherwise
that mesh dim cuts another dim instead (one all-to-all), or is made Replicate when
no other dim is free (a gather of the axis that ``_trace.report_move`` reports);
CommDebugMode counts either. ``axis=None`` packs the
flattened array (``np.ravel``'s rule) along its one axis. A Partial input is
reduced first (packing is not linear).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Shard
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X
from ._apply import whole_axis

__all__ = ["packbits", "unpackbits"]


def _local_along(name, a, ax, out_len, aligned):
    """``a`` laid out so that axis ``ax`` is whole on each rank, or cut by one mesh
    dim whose blocks ``aligned(in_bounds, out_bounds)`` accepts (the result of
    length ``out_len`` along ``ax`` then takes the packed blocks); its placements."""
    spec = a._spec
    mesh, n = spec.mesh, spec.shape[ax]
    cuts = [m for m, p in enumerate(spec.placements)
            if type(p) is Shard and p.dim == ax and mesh.shape[m] > 1]
    keep = set(cuts) if len(cuts) == 1 and aligned(
        X.bounds(n, mesh.shape[cuts[0]]), X.bounds(out_len, mesh.shape[cuts[0]])) else set()
    pls = whole_axis(spec, ax, keep=lambda m: m in keep)
    return D.relayout(name, a, pls), pls


def _wrap(mesh, placements, shape, local):
    return DTensor(np.ascontiguousarray(local), DTensorSpec(
        mesh, tuple(placements), tuple(shape), local.dtype, contiguous_strides(shape)))


def _run(name, a, axis, out_len, aligned, compute):
    if type(a) is not DTensor:
        raise _registry.NoRule(f"{name}: the DTensor rule takes a DTensor")
    if axis is None:
        a, axis = np.ravel(a), 0
    ax = normalize_axis_index(axis, a.ndim)
    length = out_len(a.shape[ax])
    a, pls = _local_along(name, a, ax, length, aligned)
    shape = a.shape[:ax] + (length,) + a.shape[ax + 1:]
    mesh = a._spec.mesh
    if mesh.get_coordinate() is None:
        return _wrap(mesh, pls, shape, D.outside_local(shape, np.uint8))
    return _wrap(mesh, pls, shape, compute(a.to_local(), ax))


@_registry.implements(np.packbits)
def packbits(a, /, axis=None, bitorder="big"):
    """``np.packbits`` of a DTensor of integers or booleans: each rank packs its
    block (local when ``axis`` is whole on each rank or cut at multiples of eight
    whose packed blocks are the result's torch.chunk blocks); else the mesh dim
    that cuts it moves to another dim first (collective, counted).

    Example: ``np.packbits(dt, axis=1)`` of a (4, 16) ``[Shard(0)]`` DTensor is a
    (4, 2) ``[Shard(0)]`` uint8 DTensor, without communication.
    """
    name = "numpy.packbits"
    if type(a) is DTensor and a.dtype.kind not in "biu":
        raise TypeError("Expected an input array of integer or boolean data type")
    if bitorder not in ("big", "little"):
        raise ValueError("'order' must be either 'little' or 'big'")

    def aligned(ins, outs):
        n = int(ins[-1])
        return all((i % 8 == 0 or i == n) and -(-i // 8) == o for i, o in zip(ins, outs))

    return _run(name, a, axis, lambda n: -(-n // 8), aligned,
                lambda x, ax: np.packbits(x, axis=ax, bitorder=bitorder))


@_registry.implements(np.unpackbits)
def unpackbits(a, /, axis=None, count=None, bitorder="big"):
    """``np.unpackbits`` of a uint8 DTensor: each rank unpacks its block (local
    when ``axis`` is whole on each rank, or cut with no ``count`` at bounds whose
    eightfold are the result's torch.chunk blocks); else the mesh dim that cuts it
    moves to another dim first (collective, counted).

    Example: ``np.unpackbits(dt, axis=1)`` of a (4, 2) ``[Shard(0)]`` uint8 DTensor
    is a (4, 16) ``[Shard(0)]`` DTensor, without communication.
    """
    name = "numpy.unpackbits"
    if type(a) is DTensor and a.dtype != np.uint8:
        raise TypeError("Expected an input array of unsigned byte data type")
    if bitorder not in ("big", "little"):
        raise ValueError("'order' must be either 'little' or 'big'")
    if count is not None:
        count = int(count)

    def out_len(n):
        if count is None:
            return 8 * n
        length = count if count >= 0 else 8 * n + count
        if length < 0:
            raise ValueError(f"-count larger than number of elements ({-count} > {8 * n})")
        return length

    def aligned(ins, outs):
        return count is None and all(8 * int(i) == int(o) for i, o in zip(ins, outs))

    return _run(name, a, axis, out_len, aligned,
                lambda x, ax: np.unpackbits(x, axis=ax, count=count, bitorder=bitorder))
