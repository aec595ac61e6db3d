"""The pure C11 core of ``csrc/core``: layout math (torch.chunk's shards, contiguous
strides, boxes, selections), strided layouts and reshape groups, dim maps, plans as
data, the kernels along an axis (scans, arg extremes, histograms, bincount) and
the counter-based random fills. Besides the bindings, the thin marshalling of the
layout math that every floor calls (:func:`chunk_sizes`, :func:`local_box`, ...).
Every function here is Local."""

from __future__ import annotations

import functools
import operator

import numpy as np

from .. import _C
from .._clib import (CODES, MAX_MESH_NDIM, MAX_NDIM, U32, U64, A, D, E, I, I64, P, _Box,
                     _int64s, _Layout, _Placement, _Selection, call, fn, ptr, struct)

TimeModel, Step, DimMap, Lanes, MemoStats = map(struct, (
    "mt_time_model", "mt_step", "mt_dimmap", "mt_lanes", "mt_memo_stats"))

# Layout math
mt_chunk = fn("mt_chunk", None, I64, I64, I64, ptr(I64), ptr(I64))
mt_layout_init = fn("mt_layout_init", I, _Layout, I, P, I, P, P, E)
mt_layout_local_box = fn("mt_layout_local_box", I, _Layout, P, _Box, E)
mt_selection_image = fn("mt_selection_image", I, _Selection, _Box, _Box)
mt_layout_even_global_shape = fn("mt_layout_even_global_shape", I, I, P, I, P, P, P, E)
mt_rng_fill_box = fn("mt_rng_fill_box", I, P, I, I, U64, U64, P, _Box, E)

# Strided layouts (torch's _StridedShard) and reshape groups
mt_strided_init = fn("mt_strided_init", I, _Layout, I, P, I, P, P, E)
mt_strided_expand = fn("mt_strided_expand", I, _Layout, _Layout, P, E)
mt_strided_local_box = fn("mt_strided_local_box", I, _Layout, P, _Box, E)
mt_strided_refine = fn("mt_strided_refine", I, _Layout, _Layout, _Layout, _Layout, E)
mt_strided_plain = fn("mt_strided_plain", I, P, I, I, P, E)
mt_strided_canonical = fn("mt_strided_canonical", I, _Layout, _Layout, E)
mt_strided_same = fn("mt_strided_same", I, _Layout, _Layout)
mt_reshape_view = fn("mt_reshape_view", I, _Layout, I, P, _Layout, E)
mt_reshape_groups = fn("mt_reshape_groups", I, I, P, I, P, P, P, P, E)

# Plans as data: made, read and priced
mt_plan_create_timed = fn("mt_plan_create_timed", I, _Layout, _Layout, I64, TimeModel, ptr(P), E)
mt_plan_create_torch = fn("mt_plan_create_torch", I, _Layout, _Layout, I64, TimeModel, ptr(P), E)
mt_plan_nsteps = fn("mt_plan_nsteps", I, P)
mt_plan_step = fn("mt_plan_step", ptr(Step), P, I)
mt_plan_bytes = fn("mt_plan_bytes", I64, P)
mt_plan_messages = fn("mt_plan_messages", I64, P)
mt_plan_net_bytes = fn("mt_plan_net_bytes", I64, P)
mt_plan_time = fn("mt_plan_time", D, P)
mt_plan_predict = fn("mt_plan_predict", D, P, TimeModel)
mt_plan_torch_bytes = fn("mt_plan_torch_bytes", I, _Layout, _Layout, I64, TimeModel, ptr(I64),
                         ptr(I64), E)

# Dim maps
mt_dimmap_check = fn("mt_dimmap_check", I, DimMap, E)
mt_dimmap_elementwise = fn("mt_dimmap_elementwise", I, I, I, U32, ptr(I), I64 * MAX_NDIM, DimMap,
                        E)
mt_dimmap_matmul = fn("mt_dimmap_matmul", I, I, ptr(I64), I, ptr(I64), I, DimMap, E)
mt_partial_exact = fn("mt_partial_exact", I, I, I, I, I)

# The kernels along an axis
mt_cumulate = fn("mt_cumulate", I, A, A, A, A, Lanes, I, I, E)
mt_arg_extreme = fn("mt_arg_extreme", I, A, A, A, Lanes, I, I, E)
mt_histogram_uniform = fn("mt_histogram_uniform", I, I, I64, A, I64, A, A, E)
mt_bincount = fn("mt_bincount", I, I64, A, A, I64, A, A, ptr(I64), ptr(I64), E)

# Time models, plan checks, the decision memo and the layout table
mt_time_model_default = fn("mt_time_model_default", TimeModel)
mt_time_model_check = fn("mt_time_model_check", I, TimeModel, E)
mt_plan_check = fn("mt_plan_check", I, _Layout, _Layout, I, E)
mt_memo_stats_get = fn("mt_memo_stats_get", None, P, ptr(MemoStats))
mt_layout_table_count = fn("mt_layout_table_count", I64, P)
mt_layout_table_capacity = fn("mt_layout_table_capacity", I64, P)
mt_selection_check = fn("mt_selection_check", I, _Selection, I, P, E)
mt_box_check_local = fn("mt_box_check_local", I, _Box, I, P, E)


def _layout(shape, mesh_shape, codes, init=None) -> _Layout:
    """The checked layout of ``shape`` over ``mesh_shape`` by placement codes
    ((kind, dim, reduce_op[, split_factor]) tuples), made by ``init``
    (mt_layout_init, or mt_strided_init where strided ones are allowed)."""
    sh, nd = _int64s(shape, MAX_NDIM, "shape")
    out = _Layout()
    call(init or mt_layout_init, out, nd, sh, *_mesh(mesh_shape, codes))
    return out


def _mesh(mesh_shape, codes):
    """(ndim, C array of the mesh shape, C array of placements) of a mesh shape and
    placement codes ((kind, dim, reduce_op[, split_factor]) tuples), one per dim."""
    ms, nm = _int64s(mesh_shape, MAX_MESH_NDIM, "mesh shape")
    pl, npl = _placements(codes)
    if npl != nm:
        raise ValueError(f"{npl} placements were given for a {nm}-D mesh")
    return nm, ms, pl


def _placements(codes):
    """A C array of placements of (kind, dim, reduce_op) codes, and their count."""
    codes = tuple(codes)
    if len(codes) > MAX_MESH_NDIM:
        raise ValueError(f"at most {MAX_MESH_NDIM} placements are supported")
    return (_Placement * MAX_MESH_NDIM)(*map(_placement, codes)), len(codes)


def _placement(code) -> _Placement:
    kind, dim, op, *factor = map(operator.index, code)
    return _Placement(kind=kind, dim=dim, reduce_op=op, split_factor=factor[0] if factor else 0)


@functools.lru_cache(maxsize=4096)
def chunk_sizes(n: int, k: int) -> tuple[int, ...]:
    """The sizes of the ``k`` chunks torch.chunk cuts ``n`` items into (the shards
    of a dim of n over k ranks; mt_chunk).

    Example: ``chunk_sizes(10, 4) == (3, 3, 3, 1)``.
    """
    n, k = operator.index(n), operator.index(k)
    if n < 0 or k < 1 or k > 1 << 24 or n >= 2**63:
        raise ValueError("chunk_sizes(n, k) needs n >= 0 and k >= 1")
    size, offset = I64(), I64()
    out = []
    for i in range(k):
        mt_chunk(n, k, i, size, offset)
        out.append(size.value)
    return tuple(out)


# torch's strides of a contiguous tensor of ``shape`` (a dim of size 0 counts as 1;
# mt_layout_contiguous_strides), as a tuple: a CPython function of the extension,
# since an operation on a small array asks it of its output each time. Example:
# ``contiguous_strides((4, 0)) == (1, 1)``.
contiguous_strides = _C.contiguous_strides


@functools.lru_cache(maxsize=4096)
def local_box(global_shape: tuple, mesh_shape: tuple, coordinate: tuple, codes: tuple):
    """(shape, offset) of the box at mesh ``coordinate`` of a tensor laid out by
    placement ``codes`` (mt_layout_local_box).

    Example: ``local_box((5,), (4,), (3,), ((1, 0, 0),)) == ((0,), (5,))``.
    """
    layout = _layout(global_shape, mesh_shape, codes)
    coord, n = _int64s(coordinate, MAX_MESH_NDIM, "coordinate")
    if n != layout.mesh_ndim:
        raise ValueError(f"a coordinate of {n} entries on a {layout.mesh_ndim}-D mesh")
    box = _Box()
    call(mt_layout_local_box, layout, coord, box)
    return tuple(box.shape[:box.ndim]), tuple(box.offset[:box.ndim])


def selection_image(sel, offsets, sizes) -> tuple:
    """For each dim of a selection (``sel``: (start, step, count, ...) per dim, step
    not 0), the positions ``(k0, k1)`` of the k < count whose index start + k * step
    lies in the box [offset, offset + size) of ``offsets`` and ``sizes``: they are
    consecutive. The core's rule (mt_selection_image), which the selection exchange
    follows, so a local cut picks what the exchange expects. Local.

    Example: ``selection_image(((0, 2, 5),), (3,), (4,)) == ((2, 4),)``.
    """
    n = len(sel)
    s = _Selection(ndim=n)
    for d, (start, step, count, *_) in enumerate(sel):
        s.start[d], s.step[d], s.count[d] = start, step, count
    box, out = _Box(ndim=n), _Box()
    box.offset[:n], box.shape[:n] = offsets, sizes
    mt_selection_image(s, box, out)
    return tuple((out.offset[d], out.offset[d] + out.shape[d]) for d in range(n))


@functools.lru_cache(maxsize=4096)
def even_global_shape(local_shape: tuple, mesh_shape: tuple, codes: tuple):
    """The global shape evenly sharded local shards of ``local_shape`` make
    (mt_layout_even_global_shape).

    Example: ``even_global_shape((3,), (4,), ((1, 0, 0),)) == (12,)``.
    """
    local, nd = _int64s(local_shape, MAX_NDIM, "local shape")
    out = (I64 * max(nd, 1))()
    call(mt_layout_even_global_shape, nd, local, *_mesh(mesh_shape, codes), out)
    return tuple(out[:nd])


def rng_fill(out: np.ndarray, global_shape, offset, seed: int, stream: int,
             dist: int) -> None:
    """Fills ``out``, the box at ``offset`` of a tensor of ``global_shape``, with
    its Philox values (``dist`` 0 uniform, 1 normal; mt_rng_fill_box).

    Example: ``rng_fill(np.empty(3), (6,), (3,), 0, 0, 0)``.
    """
    if not isinstance(out, np.ndarray):
        raise TypeError("rng_fill(out: ndarray, global_shape, offset, seed, stream, dist)")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("rng_fill needs a writable C-contiguous array")
    dtype = CODES.get(out.dtype.type, -1) if out.dtype.isnative else -1
    glob, nd = _int64s(global_shape, MAX_NDIM, "global shape")
    off, noff = _int64s(offset, MAX_NDIM, "offset")
    if noff != nd or out.ndim != nd:
        raise ValueError("out, global_shape and offset need equal ndim")
    box = _Box(ndim=nd, offset=(I64 * MAX_NDIM)(*off[:nd]),
               shape=(I64 * MAX_NDIM)(*out.shape))
    call(mt_rng_fill_box, out.ctypes.data, dtype, operator.index(dist),
         operator.index(seed) & (2**64 - 1), operator.index(stream) & (2**64 - 1), glob,
         box)
