"""Diagonals and triangles of DTensors, on global indices: ``np.triu``, ``np.tril``,
``np.trace`` and ``np.diagonal`` (``np.diag``, which gathers as torch does, is in
_diag.py).

Each rank knows the global offset of its box, so it knows which of its elements lie
on or above a diagonal without asking anyone. ``triu``/``tril`` zero the others
in place of the data: no communication, and every placement stays (a Partial too:
zeroing is linear). ``trace`` sums the part of the diagonal a rank holds, and
``diagonal`` places that part at its global positions in zeros of the diagonal's
length: the mesh dims that shard either of the two axes leave a Partial(sum) of
the size of the result (the diagonal's elements live on the ranks that hold them,
and a sum of zeros elsewhere places each once), reduced when read; the other dims
keep their Shards.
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Partial, Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _views

__all__ = ["triu", "tril", "trace", "diagonal"]


def _sum_partials_only(name, a):
    """``a`` with every Partial but Partial(sum) reduced: the operations here are
    linear, so a sum of parts passes through."""
    placements = a._spec.placements
    if not any(p.is_partial() and p != _SUM for p in placements):
        return a
    return D.relayout(name, a, [Replicate() if p.is_partial() and p != _SUM
                                else p for p in placements])


_SUM = Partial("sum")


# Each rank's box offset per (global shape, placements, mesh shape, coordinate): a
# rule here runs in a few microseconds, and the layout math would be half of them.
_offsets: dict = {}


def _offset(a):
    spec = a._spec
    mesh = spec.mesh
    key = (spec.shape, spec.placements, mesh._mesh.shape, *mesh._coordinate)
    off = _offsets.get(key)
    if off is None:
        if len(_offsets) > 1024:
            _offsets.clear()
        off = _offsets[key] = compute_local_shape_and_global_offset(
            spec.shape, mesh, spec.placements)[1]
    return off


# A triangle's mask per (rows, cols, shift, upper): True where the element is kept.
_masks: dict = {}
# Local blocks of at most this many elements (per matrix) take one cached mask; larger
# ones are copied and zeroed band by band, so that no mask or index array of their
# size is made.
_SMALL = 32768
# Rows per band of a large block: the elements next to the diagonal a band holds are
# zeroed by a mask of about this squared, the rest of its zeros by one slice.
_BAND = 64


def _mask(rows, cols, shift, upper):
    """Row i's columns j with j < i + shift (the left part) kept, or, for ``upper``,
    the others; cached."""
    key = (rows, cols, shift, upper)
    mask = _masks.get(key)
    if mask is None:
        if len(_masks) > 64:
            _masks.clear()
        left = np.arange(cols)[None, :] < (np.arange(rows) + shift)[:, None]
        mask = _masks[key] = ~left if upper else left
    return mask


def _split_rows(local, shift, upper):
    """A new C-contiguous array: ``local`` with, in each matrix of its last two dims,
    row i's columns ``j < i + shift`` kept (``upper``: zeroed) and the others zeroed
    (``upper``: kept)."""
    rows, cols = local.shape[-2:]
    zero = np.zeros(1, local.dtype)
    if rows * cols <= _SMALL:
        return np.ascontiguousarray(np.where(_mask(rows, cols, shift, upper), local, zero))
    out = np.empty(local.shape, local.dtype)
    # Rows [0, first) lie wholly right of their split, rows [last, rows) wholly left:
    # those wholly zeroed are filled, the others copied whole (one block copy runs
    # faster than copying the part of each row kept) and then zeroed band by band.
    first = min(max(-shift + 1, 0), rows)
    last = min(max(cols - shift, first), rows)
    zeroed, copied = ((slice(last, None), slice(None, last)) if upper else
                      (slice(None, first), slice(first, None)))
    out[..., zeroed, :] = zero
    out[..., copied, :] = local[..., copied, :]
    for i0 in range(first, last, _BAND):
        i1 = min(i0 + _BAND, last)
        # Columns left of the band's first row's split are left of every row's
        # split in it, those from its last row's on right of every one.
        lo = min(max(i0 + shift, 0), cols)
        hi = min(max(i1 - 1 + shift, 0), cols)
        out[..., i0:i1, slice(None, lo) if upper else slice(hi, None)] = zero
        if hi > lo:
            np.copyto(out[..., i0:i1, lo:hi], zero,
                      where=~_mask(i1 - i0, hi - lo, i0 + shift - lo, upper))
    return out


def _triangle(name, m, k, upper):
    if type(m) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(m).__name__}")
    k = operator.index(k)
    if m.ndim < 2:
        raise _registry.NoRule(f"{name}: a DTensor of fewer than two dims (NumPy makes "
                               f"it a square) has no distributed rule")
    m = _sum_partials_only(name, m)
    spec = m._spec
    if spec.mesh._coordinate is None:
        return DTensor(D.outside_local(spec.shape, spec.dtype), spec)
    off = _offset(m)
    # Local element (i, j) is global (i + off[-2], j + off[-1]): tril keeps
    # j - i <= k, the columns left of i + here + 1; triu zeroes those left of i + here.
    here = k + off[-2] - off[-1]
    out = _split_rows(m.to_local(), here if upper else here + 1, upper)
    strides = contiguous_strides(spec.shape)
    return DTensor(out, spec if spec.stride == strides else DTensorSpec(
        spec.mesh, spec.placements, spec.shape, spec.dtype, strides))


@_registry.implements(np.triu)
def triu(m, k=0):
    """``np.triu`` of a DTensor of two or more dims: its elements below diagonal
    ``k`` of the last two dims zeroed, by their global indices. Local: every
    placement stays.

    Example: ``np.triu(dt, 1)`` of a (4, 4) ``[Shard(0)]`` DTensor.
    """
    return _triangle("numpy.triu", m, k, True)


@_registry.implements(np.tril)
def tril(m, k=0):
    """``np.tril`` of a DTensor of two or more dims: its elements above diagonal
    ``k`` of the last two dims zeroed, by their global indices. Local: every
    placement stays.

    Example: ``np.tril(dt)`` of a (4, 4) ``[Shard(1)]`` DTensor.
    """
    return _triangle("numpy.tril", m, k, False)


def _diagonal_spec(name, a, offset, axis1, axis2):
    """(``a`` with only Partial(sum)s left, axis1, axis2, local offset of the
    diagonal in this rank's box, the output's placements over the other dims,
    their global shape)."""
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")
    operator.index(offset)
    spec = a._spec
    key = (axis1, type(axis1), axis2, type(axis2), spec.placements, spec.shape)
    known = _diagonal_layouts.get(key)
    if known is not None:
        return (_sum_partials_only(name, a),) + known
    if a.ndim < 2:
        raise ValueError("diag requires an array of at least two dimensions")
    ax1, ax2 = normalize_axis_index(axis1, a.ndim), normalize_axis_index(axis2, a.ndim)
    if ax1 == ax2:
        raise ValueError("axis1 and axis2 cannot be the same")
    a = _sum_partials_only(name, a)
    rest = [d for d in range(a.ndim) if d not in (ax1, ax2)]
    pls = tuple(_SUM if p.is_shard() and p.dim in (ax1, ax2) else
                Shard(rest.index(p.dim)) if p.is_shard() else p for p in a._spec.placements)
    if len(_diagonal_layouts) > 1024:
        _diagonal_layouts.clear()
    known = _diagonal_layouts[key] = (ax1, ax2, pls, tuple(spec.shape[d] for d in rest))
    return (a,) + known


# _diagonal_spec's answer past its checks, per (axes, placements, global shape): the
# same on every call, and most of a small trace's time.
_diagonal_layouts: dict = {}


# np.trace's result dtype per (input dtype, dtype=): NumPy's own answer, asked once.
_trace_dtypes: dict = {}


def _trace_dtype(dtype, asked):
    try:
        return _trace_dtypes[dtype, asked]
    except (KeyError, TypeError):
        out = np.trace(np.zeros((1, 1), dtype), dtype=asked).dtype
        try:
            _trace_dtypes[dtype, asked] = out
        except TypeError:  # an unhashable dtype= argument
            pass
        return out


@_registry.implements(np.trace)
def trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    """``np.trace`` of a DTensor: each rank sums the part of the diagonal it holds;
    Partial(sum) over the mesh dims that shard ``axis1`` or ``axis2`` (one
    all-reduce of the result's size when read), the Shards of the other dims kept.
    Local.

    Example: ``np.trace(dt)`` of a (4, 4) ``[Shard(0)]`` DTensor is a 0-d
    ``[Partial(sum)]`` DTensor.
    """
    name = "numpy.trace"
    if out is not None:
        raise _registry.NoRule(f"{name}: out= has no distributed rule")
    a, axis1, axis2, pls, shape = _diagonal_spec(name, a, offset, axis1, axis2)
    spec = a._spec
    out_dtype = _trace_dtype(spec.dtype, dtype)
    if spec.mesh._coordinate is None:
        local = D.outside_local(shape, out_dtype)
    else:
        off = _offset(a)
        local = a.to_local().trace(offset + off[axis1] - off[axis2], axis1, axis2,
                                   dtype=dtype)
    return DTensor(np.asarray(local, out_dtype), DTensorSpec(
        spec.mesh, pls, shape, np.dtype(out_dtype), contiguous_strides(shape)))


@_registry.implements(np.diagonal, views=True)
def diagonal(a, offset=0, axis1=0, axis2=1):
    """``np.diagonal`` of a DTensor: each rank places the part of the diagonal it
    holds at its global positions, in zeros elsewhere; Partial(sum) over the mesh
    dims that shard ``axis1`` or ``axis2`` (one all-reduce of the diagonal's size
    when read), the Shards of the other dims kept. As NumPy's, a program's is a
    read-only view: a write into it raises, and it shows the writes into ``a``
    (mpitensor._algorithms._views). Collective on the mesh for a program's call
    (one small all-reduce), else local.

    Example: ``np.diagonal(dt)`` of a (4, 4) ``[Shard(1)]`` DTensor is a (4,)
    ``[Partial(sum)]`` DTensor.
    """
    program = _registry.program_call(np.diagonal)
    out = _diagonal(a, offset, axis1, axis2)
    if not program:
        return out
    return _views.keep(a, out, lambda p: _diagonal(p, offset, axis1, axis2))


def _diagonal(a, offset, axis1, axis2):
    """:func:`diagonal` itself, in new memory."""
    name = "numpy.diagonal"
    a, axis1, axis2, pls, rest = _diagonal_spec(name, a, offset, axis1, axis2)
    spec = a._spec
    rows, cols = spec.shape[axis1], spec.shape[axis2]
    length = max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
    shape = rest + (length,)
    if spec.mesh._coordinate is None:
        return DTensor(D.outside_local(shape, spec.dtype), DTensorSpec(
            spec.mesh, pls, shape, spec.dtype, contiguous_strides(shape)))
    local = a.to_local()
    off = _offset(a)
    here = offset + off[axis1] - off[axis2]
    part = np.diagonal(local, here, axis1, axis2)
    # Diagonal element t sits at global row t - min(offset, 0); this rank's first
    # at local row max(0, -here).
    first = off[axis1] + max(0, -here) + min(offset, 0) if part.shape[-1] else 0
    kept = tuple(n for d, n in enumerate(local.shape) if d not in (axis1, axis2))
    out = np.zeros(kept + (length,), spec.dtype)
    out[..., first:first + part.shape[-1]] = part
    return DTensor(out, DTensorSpec(spec.mesh, pls, shape, spec.dtype,
                                    contiguous_strides(shape)))
