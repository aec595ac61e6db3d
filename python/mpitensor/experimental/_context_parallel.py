"""context_parallel: shard sequence buffers in place and run attention as ring
attention, after torch.distributed.tensor.experimental.context_parallel.

Inside the context every buffer holds this rank's load-balanced shard of its
sequence dim (see _load_balance), and the block's mode (mpitensor._modes) makes
mpitensor.nn.functional's scaled_dot_product_attention call ``ring_attention`` on
the shards it is given.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _modes, _comm
from .._dtensor import DTensor
from .._layout import compute_local_shape_and_global_offset
from ..autograd import Function
from ..device_mesh import DeviceMesh
from ..nn import functional as F
from . import _load_balance as LB
from .._fingerprint import fingerprint
from ._agree import agree_on_shards
from ._ring_attention import (ring_attention, ring_attention_backward,  # noqa: F401
                              ring_attention_forward, set_rotate_method)

__all__ = ["context_parallel", "context_parallel_unshard", "set_rotate_method",
           "ring_attention", "active", "RingAttentionMode"]


def active():
    """The mesh of the innermost ``context_parallel`` block this code runs in, or
    None outside any: where attention switches to ring attention. Local.

    Example: ``with context_parallel(mesh): assert active() is mesh``.
    """
    mode = _modes.context_parallel()
    return None if mode is None else mode.mesh


class RingAttentionMode:
    """The mode a ``context_parallel(mesh)`` block installs (mpitensor._modes):
    scaled dot-product attention runs as ring attention over ``mesh``."""

    __slots__ = ("mesh",)

    def __init__(self, mesh):
        self.mesh = mesh

    def sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
             scale=None):
        """scaled_dot_product_attention inside ``context_parallel(mesh)``: ring
        attention over the sequence shards (dim -2) of plain ndarrays, or of
        DTensors whose local parts are those shards (then recorded for autograd,
        the output having the query's placements), as torch's patched SDPA.
        Collective on the mesh.

        Example: ``_modes.context_parallel().sdpa(q, k, v, None, 0.0, True, None)``.
        """
        _refuse(attn_mask, dropout_p)
        dts = [isinstance(x, DTensor) for x in (query, key, value)]
        if any(dts):
            if not all(dts):
                raise TypeError("scaled_dot_product_attention inside context_parallel: "
                                "query, key and value must all be DTensors or all ndarrays")
            return _RingAttention.apply(query, key, value, self, is_causal, scale)
        return ring_attention(query, key, value, mesh=self.mesh, seq_dim=-2,
                              is_causal=is_causal, scale=scale)

    def sdpa_forward(self, query, key, value, attn_mask=None, dropout_p=0.0,
                     is_causal=False, scale=None, problem=""):
        """``sdpa`` on ndarray shards, also returning what ``sdpa_backward`` needs:
        ``(out, saved)``. A non-empty ``problem`` fails it on every rank with that
        message. Collective on the mesh.

        Example: ``out, saved = mode.sdpa_forward(q, k, v, is_causal=True)``.
        """
        _refuse(attn_mask, dropout_p)
        return ring_attention_forward(query, key, value, mesh=self.mesh, seq_dim=-2,
                                      is_causal=is_causal, scale=scale, problem=problem)

    @staticmethod
    def layout_problem(dtensors) -> str:
        """Why the local parts of ``dtensors`` are not the parts their placements
        describe, or ''. A load-balanced shard wrapped as ``Shard`` of the sequence
        dim is one when the shard lengths are Shard's chunk sizes, which holds when
        the length is a multiple of twice the mesh size (torch requires that).
        Local; pass the answer to ``sdpa_forward``, which fails on every rank.

        Example: ``mode.layout_problem([q, k, v])`` is ``''`` for L = 4N.
        """
        for x in dtensors:
            want, _ = compute_local_shape_and_global_offset(x.shape, x.device_mesh,
                                                            x.placements)
            got = x._data().shape
            if x.device_mesh.get_coordinate() is not None and tuple(got) != tuple(want):
                return (f"a DTensor input holds local shape {tuple(got)} where its "
                        f"placements {x.placements} of shape {tuple(x.shape)} give "
                        f"{tuple(want)}: wrap the shards context_parallel makes as "
                        f"Shard of the sequence dim only when the sequence length is "
                        f"a multiple of twice the mesh size, or use DTensors of the "
                        f"local mesh")
        return ""

    @staticmethod
    def sdpa_backward(saved, grad_out):
        """The gradients ``(dq, dk, dv)`` of this rank's shards from ``sdpa_forward``'s
        ``saved`` and the output shard's gradient. Collective on the forward's mesh
        (it may run after the block has ended).

        Example: ``dq, dk, dv = mode.sdpa_backward(saved, np.ones_like(out))``.
        """
        return ring_attention_backward(saved, grad_out)


def _refuse(attn_mask, dropout_p):
    if attn_mask is not None:
        raise NotImplementedError("scaled_dot_product_attention inside context_parallel "
                                  "does not take attn_mask (use is_causal)")
    if dropout_p:
        raise NotImplementedError("scaled_dot_product_attention inside context_parallel "
                                  "does not support dropout_p > 0")


class _RingAttention(Function):
    """Ring attention of DTensors whose local parts are this rank's sequence
    shards: computed on the local parts, the output laid out as the query. The
    backward is ring attention's (collective on the context-parallel mesh); each
    input's gradient is laid out as that input."""

    _gives_up_results = True

    @staticmethod
    def forward(ctx, query, key, value, mode, is_causal, scale):
        ins = [F._without_partial(x) for x in (query, key, value)]
        out, ctx.saved = mode.sdpa_forward(*(x.to_local() for x in ins), None, 0.0,
                                           is_causal, scale, mode.layout_problem(ins))
        ctx.ins = ins
        q, v = ins[0], ins[2]
        shape = tuple(q.shape[:-1]) + (v.shape[-1],)
        return F._wrap_like(q.device_mesh, q.placements, shape, np.ascontiguousarray(out))

    @staticmethod
    def backward(ctx, g):
        q = ctx.ins[0]
        if g.placements != q.placements:
            g = g.redistribute(q.device_mesh, q.placements)
        grads = ring_attention_backward(ctx.saved, g.to_local())
        return tuple(F._wrap_like(x.device_mesh, x.placements, x.shape,
                                  np.ascontiguousarray(gx, x.dtype))
                     for x, gx in zip(ctx.ins, grads)) + (None, None, None)


def _cp_mesh(mesh, what: str):
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"{what} needs a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim != 1:
        raise ValueError(f"{what} needs a 1-D mesh (the context-parallel dim, e.g. "
                         f"mesh['cp']), got a {mesh.ndim}-D mesh")
    if mesh.get_coordinate() is None:
        raise ValueError(f"{what}: this rank is not a member of the mesh")
    return mesh


def _take_shard(buf: np.ndarray, dim: int, n: int, rank: int) -> np.ndarray:
    head, tail = LB.rank_segments(buf.shape[dim], n, rank)
    pick = np.r_[head[0]:head[1], tail[0]:tail[1]]
    return np.take(buf, pick, axis=dim)


def _resizable(buf: np.ndarray) -> str:
    """Why ``buf`` cannot change shape in place, or ''."""
    if buf.base is not None or not buf.flags.owndata:
        return "it is a view of another array (it does not own its data)"
    if not buf.flags.c_contiguous:
        return "it is not C-contiguous"
    if not buf.flags.writeable:
        return "it is read-only"
    return ""


def _check_buffers(buffers, seq_dims, no_restore):
    if len(buffers) != len(seq_dims):
        raise ValueError(f"buffers and buffer_seq_dims must have the same length, got "
                         f"{len(buffers)} and {len(seq_dims)}")
    for i, buf in enumerate(buffers):
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"buffers[{i}] is a {type(buf).__name__}, not an ndarray")
        if any(buf is other for other in buffers[:i]):
            raise ValueError(f"buffers[{i}] appears twice in buffers")
    for buf in no_restore:
        if not any(buf is b for b in buffers):
            raise ValueError("no_restore_buffers must be a subset of buffers: a buffer "
                             "in no_restore_buffers is not in buffers")
    return [normalize_axis_index(d, b.ndim) for b, d in zip(buffers, seq_dims)]


def _shard_in_place(buf, dim, n, rank, restore):
    """Makes ``buf`` its own shard; returns the copy to restore it from (or None)."""
    saved = buf.copy() if restore else None
    shard = _take_shard(buf if saved is None else saved, dim, n, rank)
    buf.resize(shard.shape, refcheck=False)
    buf[...] = shard
    return saved


@contextlib.contextmanager
def context_parallel(mesh, *, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
    """Context parallelism: shards ``buffers`` along their sequence dims
    (``buffer_seq_dims``) in place for the duration of the block, and makes
    ``mpitensor.nn.functional.scaled_dot_product_attention`` (and
    ``MultiheadAttention``) run as ring attention over ``mesh``.

    Every rank passes the same full buffers. Each one that owns its data (a
    C-contiguous, writable array that is not a view) is resized in place to this
    rank's shard, as torch changes a buffer's shape, and restored to its full
    contents on exit unless it is in ``no_restore_buffers`` (then it keeps the
    shard). Views of a buffer taken before the block must not be used inside it
    (its memory is reallocated). A buffer that cannot change shape in place (a
    view, a read-only or non-contiguous array) stays as it is, with a warning;
    use its shard from the list the context yields, which holds every buffer's
    local shard in order. A rank keeps the head chunk r and the tail chunk 2N-1-r
    of 2N chunks, so causal attention costs the same on every rank; undo the order
    with ``context_parallel_unshard``. ``mesh`` is 1-D.

    Local: entering and leaving do not communicate (attention inside does).

    Example::

        >>> mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("cp",))
        >>> q, k, v = (rng.standard_normal((2, 8, 1000, 64)) for _ in range(3))
        >>> with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        ...     out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ...     out = context_parallel_unshard(mesh, [out], [2])[0]
        >>> q.shape       # restored
        (2, 8, 1000, 64)
    """
    _cp_mesh(mesh, "context_parallel")
    buffers = [] if buffers is None else list(buffers)
    seq_dims = [] if buffer_seq_dims is None else list(buffer_seq_dims)
    no_restore = [] if no_restore_buffers is None else list(no_restore_buffers)
    dims = _check_buffers(buffers, seq_dims, no_restore)
    n, rank = mesh.size(), mesh.get_local_rank()
    shards, restores, entered = [], [], False
    try:  # a failure while sharding restores the buffers already sharded
        for i, (buf, dim) in enumerate(zip(buffers, dims)):
            why = _resizable(buf)
            if why:
                warnings.warn(f"context_parallel cannot shard buffers[{i}] in place "
                              f"because {why}; it is left whole: use its shard from the "
                              f"list the context yields", stacklevel=3)
                shards.append(_take_shard(buf, dim, n, rank))
                continue
            restore = not any(buf is b for b in no_restore)
            restores.append((buf, _shard_in_place(buf, dim, n, rank, restore)))
            shards.append(buf)
        _modes.push_context_parallel(RingAttentionMode(mesh))
        entered = True
        yield shards
    finally:
        if entered:
            _modes.pop_context_parallel()
        for buf, saved in restores:
            if saved is not None:
                buf.resize(saved.shape, refcheck=False)
                buf[...] = saved


def _gather_meta(mesh, n, local, problem):
    """Every rank's shard length, after checking on every rank alike that the
    shards are of one array (a bad input anywhere fails everywhere)."""
    meta = [1, 0, 0, 0] if problem else \
        [0, local.shape[0], fingerprint(local.shape[1:]), local.dtype.num]
    (lens,) = agree_on_shards(mesh, n, meta, problem, "context_parallel_unshard",
                              ("sequence",), "shape (other than the sequence dim) or dtype")
    return lens, sum(lens)


def _unshard_one(mesh, n, buf, seq_dim):
    local, problem = None, ""
    try:
        dim = normalize_axis_index(seq_dim, buf.ndim)
        local = np.ascontiguousarray(np.moveaxis(buf, dim, 0))
    except ValueError as exc:
        problem = str(exc)
    lens, total = _gather_meta(mesh, n, local, problem)
    row = int(np.prod(local.shape[1:], dtype=np.int64)) * local.itemsize
    gathered = np.empty((total,) + local.shape[1:], local.dtype)
    _comm.ring_allgatherv_start(mesh, 0, local, gathered, [m * row for m in lens]).wait()
    out = np.empty_like(gathered)
    offset = 0
    for k in range(n):
        for start, stop in LB.rank_segments(total, n, k):
            out[start:stop] = gathered[offset:offset + stop - start]
            offset += stop - start
    return np.moveaxis(out, 0, dim)


def context_parallel_unshard(mesh, buffers, seq_dims):
    """The full sequences of ``buffers`` (shards made by ``context_parallel`` or
    computed from them, e.g. attention outputs), each gathered along its dim of
    ``seq_dims`` and put back in the original order. Returns a list of new arrays.

    Collective on the mesh.

    Example::

        >>> with context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]) as (xs,):
        ...     y = layer(xs)
        ...     full_y = context_parallel_unshard(mesh, [y], [1])[0]
    """
    _cp_mesh(mesh, "context_parallel_unshard")
    buffers, seq_dims = list(buffers), list(seq_dims)
    if len(buffers) != len(seq_dims):
        raise ValueError(f"buffers and seq_dims must have the same length, got "
                         f"{len(buffers)} and {len(seq_dims)}")
    return [_unshard_one(mesh, mesh.size(), np.asarray(b), d)
            for b, d in zip(buffers, seq_dims)]
