"""Ring attention: scaled-dot-product attention on sequence-sharded NumPy arrays.

Each rank holds the query, key and value positions that context_parallel gave it
(a head and a tail chunk, see _load_balance). Key/value blocks travel around the
ring of the mesh dim while the block in hand is computed: with the "alltoall"
rotate method each step shifts the block to the next rank with nonblocking
point-to-point calls; with "allgather" one nonblocking all-gather fetches every
block while the local one is computed. Every (query tile, key tile) pair gives a
partial output normalised by its own softmax sum plus that sum's log-sum-exp
(lse); partial results merge exactly by lse rescaling, as flash attention's
do, so the order of blocks does not matter and no rank ever holds a full
L x S score matrix or the whole sequence.
"""

from __future__ import annotations

import math
import struct

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _comm
from ..autograd._rules import sum_to
from . import _load_balance as LB
from .._fingerprint import fingerprint
from ._agree import agree_on_shards

__all__ = ["ring_attention", "ring_attention_forward", "ring_attention_backward",
           "set_rotate_method", "attention_block", "merge_partial"]

# Elements of one tile's score matrix (batch x query rows x key rows): bounds the
# memory of the computation whatever the sequence length, 16 MiB in float64.
_TILE_ELEMS = 1 << 21

_ROTATE_CODES = {"allgather": 0, "alltoall": 1}
_rotate_method = ["allgather"]  # torch's default; set_rotate_method changes it


def set_rotate_method(rotate_method: str) -> None:
    """How ring attention moves key/value shards between ranks: ``"allgather"``
    (the default, as torch's: one nonblocking all-gather of every shard, overlapped
    with the local block; the whole K/V then sits on every rank) or
    ``"alltoall"`` (the ring: each step shifts one shard to the next rank with
    nonblocking point-to-point calls while the current one is computed, so a rank
    holds two shards at a time). Local: call it on every rank alike.

    Example::

        >>> from mpitensor.experimental import set_rotate_method
        >>> set_rotate_method("alltoall")
    """
    if rotate_method not in _ROTATE_CODES:
        raise NotImplementedError(f"Context Parallel does not support using {rotate_method!r} "
                                  f"for kv shards rotation; use 'allgather' or 'alltoall'")
    _rotate_method[0] = rotate_method


def get_rotate_method() -> str:
    """The rotate method ring attention uses now. Local."""
    return _rotate_method[0]


def attention_block(q, k, v, scale, mask=None):
    """Softmax attention of query rows ``q`` (..., l, E) over key/value rows ``k``
    (..., s, E), ``v`` (..., s, Ev): returns ``(out, lse)`` where ``out`` (..., l,
    Ev) is normalised over this block only and ``lse`` (..., l) is the log of its
    softmax denominator (-inf for a row whose keys are all masked; its out is 0).
    ``mask`` (l, s) is True where a key is hidden. Local."""
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    s *= scale
    if mask is not None:
        np.copyto(s, -np.inf, where=mask)
    m = np.max(s, axis=-1, keepdims=True)
    m[np.isneginf(m)] = 0.0  # fully masked rows: exp(-inf - 0) = 0, no NaN
    np.subtract(s, m, out=s)
    np.exp(s, out=s)
    denom = np.sum(s, axis=-1, keepdims=True)
    out = np.matmul(s, v)
    np.divide(out, denom, out=out, where=denom > 0)
    with np.errstate(divide="ignore"):
        lse = np.log(denom) + m
    return out, lse[..., 0]


def merge_partial(out, lse, part_out, part_lse):
    """Merges a partial result into the accumulated ``(out, lse)`` in place:
    both are softmax-normalised over disjoint key sets, so the merged output is
    their average weighted by exp(lse - logaddexp(lse, part_lse)). Local."""
    new = np.logaddexp(lse, part_lse)
    safe = np.where(np.isneginf(new), 0.0, new)  # no key seen yet on either side
    out *= np.exp(lse - safe)[..., None]
    out += part_out * np.exp(part_lse - safe)[..., None]
    lse[...] = new


def _tile_rows(batch: int) -> int:
    return max(16, int(math.sqrt(_TILE_ELEMS / max(batch, 1))))


def _causal_mask(q_start, q_len, k_start, k_len):
    """None when every key of the tile is visible to every query row, False when
    none is (skip the tile), else the (q_len, k_len) mask of hidden keys. As in
    torch's is_causal, query i sees key j when j <= i (top-left aligned)."""
    if k_start + k_len - 1 <= q_start:
        return None
    if k_start >= q_start + q_len:
        return False
    rows = np.arange(q_start, q_start + q_len)[:, None]
    cols = np.arange(k_start, k_start + k_len)[None, :]
    return cols > rows


class _Accumulator:
    """The running (out, lse) of this rank's query rows, and the tiling that feeds
    it. Query and key positions are global, for the causal mask."""

    def __init__(self, q, q_segments, ev, kv_batch, scale, causal, progress):
        self.q = q
        self.q_segments = q_segments
        batch = np.broadcast_shapes(q.shape[:-2], kv_batch)
        self.out = np.zeros(batch + (q.shape[-2], ev), dtype=q.dtype)
        self.lse = np.full(batch + (q.shape[-2],), -np.inf, dtype=q.dtype)
        self.e = q.shape[-1]
        self.scale = scale
        self.causal = causal
        self.progress = progress
        self.tile = _tile_rows(int(np.prod(batch, dtype=np.int64)))

    def attend(self, k, v, k_segments):
        """Folds one key/value block into the accumulator."""
        q_pieces = _pieces(self.q_segments, self.causal)
        k_pieces = _pieces(k_segments, self.causal)
        for q_local, q_start, q_len in q_pieces:
            for k_local, k_start, k_len in k_pieces:
                self._pair(k, v, q_local, q_start, q_len, k_local, k_start, k_len)

    def _pair(self, k, v, q_local, q_start, q_len, k_local, k_start, k_len):
        for rows, tiles in _tiles(self.tile, self.causal, q_local, q_start, q_len,
                                  k_local, k_start, k_len):
            for cols, kn, mask in tiles:
                o, l = attention_block(self.q[..., rows, :], k[..., cols, :],
                                       v[..., cols, :], self.scale, mask)
                merge_partial(self.out[..., rows, :], self.lse[..., rows], o, l)
            self.progress()


def _tiles(tile, causal, q_local, q_start, q_len, k_local, k_start, k_len):
    """The tiles of one (query piece, key piece) pair, for the forward and the
    backward alike: per block of ``tile`` query rows, its local ``rows`` slice and
    the (local ``cols`` slice, key count, causal mask or None) of each key block it
    sees; a block the causal mask hides entirely is left out."""
    for qa in range(0, q_len, tile):
        qn = min(tile, q_len - qa)

        def keys(qa=qa, qn=qn):
            for ka in range(0, k_len, tile):
                kn = min(tile, k_len - ka)
                mask = _causal_mask(q_start + qa, qn, k_start + ka, kn) if causal else None
                if mask is not False:
                    yield slice(k_local + ka, k_local + ka + kn), kn, mask
        yield slice(q_local + qa, q_local + qa + qn), keys()


def _pieces(segments, causal):
    """(local offset, global start, length) of each stored segment; without a
    causal mask positions do not matter and the whole block is one piece."""
    pieces, local = [], 0
    for start, stop in segments:
        if stop > start:
            pieces.append((local, start, stop - start))
        local += stop - start
    if not causal and pieces:
        return [(0, 0, local)]
    return pieces


def _float_dtype(*arrays):
    dt = np.result_type(*arrays)
    if dt.kind == "c":
        raise TypeError("ring attention does not support complex inputs")
    return dt if dt.kind == "f" else np.dtype(np.float64)


def _local_problems(q, k, v) -> str:
    """What is wrong with this rank's inputs, or ''. Checked before any exchange
    and shared with the other ranks, so all of them fail together."""
    if min(q.ndim, k.ndim, v.ndim) < 2:
        return "query, key and value need at least 2 dims (..., L, E)"
    if q.shape[-1] != k.shape[-1]:
        return (f"query and key must have the same embedding size, got {q.shape[-1]} "
                f"and {k.shape[-1]}")
    if k.shape[:-1] != v.shape[:-1]:
        return (f"key and value must match in all dims but the last, got "
                f"{k.shape} and {v.shape}")
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except ValueError:
        return f"the batch dims of query {q.shape[:-2]} and key {k.shape[:-2]} do not broadcast"
    return ""


def _meta(q, k, v, problem, causal, scale, rotate):
    if problem:
        return [1] + [0] * 9
    scale_bits = struct.unpack("<q", struct.pack("<d", -1.0 if scale is None else scale))[0]
    rest = lambda a: fingerprint(a.shape[:-2] + a.shape[-1:])  # noqa: E731
    return [int(bool(problem)), q.shape[-2], k.shape[-2], rest(q), rest(k), rest(v),
            q.dtype.num, int(bool(causal)), scale_bits, _ROTATE_CODES[rotate]]


def _agree(mesh, n, r, meta, problem):
    """Gathers every rank's metadata and raises the same error on every rank when
    the inputs are bad anywhere or differ between ranks. Returns the query and
    key lengths per rank."""
    lq, lk = agree_on_shards(mesh, n, meta, problem, "ring attention",
                             ("query", "key/value"), "shape (other than the sequence "
                             "length), dtype, is_causal, scale or rotate method")
    return lq, lk


def ring_attention(query, key, value, *, mesh, seq_dim=-2, is_causal=False, scale=None):
    """Scaled-dot-product attention of sequence-sharded ``query``, ``key``,
    ``value`` (this rank's load-balanced shards, as context_parallel makes them),
    returning this rank's shard of the output in the same order. Semantics are
    torch's scaled_dot_product_attention without a mask or dropout: softmax(q kᵀ
    · scale) v, scale 1/sqrt(E) by default, ``is_causal`` hiding key j from query
    i when j > i (global positions). ``mesh`` is a 1-D DeviceMesh.

    Collective on the mesh: every rank calls it with shards of the same problem.

    Example::

        >>> with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        ...     out = ring_attention(q, k, v, mesh=mesh, is_causal=True)
        >>> full = context_parallel_unshard(mesh, [out], [2])[0]
    """
    return ring_attention_forward(query, key, value, mesh=mesh, seq_dim=seq_dim,
                                  is_causal=is_causal, scale=scale, keep=False)[0]


class RingSaved:
    """What ring attention's backward needs from its forward: this rank's q, k, v
    (sequence dim moved to -2, in the compute dtype), its output and the
    log-sum-exp of every query row, the shard lengths and the ring."""

    __slots__ = ("q", "k", "v", "out", "lse", "lq", "lk", "dims", "scale", "causal", "mesh",
                 "n", "r", "rotate")


def ring_attention_forward(query, key, value, *, mesh, seq_dim=-2, is_causal=False,
                           scale=None, keep=True, problem=""):
    """``ring_attention``, also returning what :func:`ring_attention_backward`
    needs (a RingSaved, or None when ``keep`` is false). A non-empty ``problem``
    (what the caller found wrong with this rank's inputs) fails the call on every
    rank with that message. Collective on the mesh.

    Example::

        >>> out, saved = ring_attention_forward(q, k, v, mesh=mesh, is_causal=True)
        >>> dq, dk, dv = ring_attention_backward(saved, np.ones_like(out))
    """
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    problem = problem or _local_problems(q, k, v)
    dims = None
    if not problem:
        try:
            dims = [normalize_axis_index(seq_dim, a.ndim) for a in (q, k, v)]
            dt = _float_dtype(q, k, v)
        except (ValueError, TypeError) as exc:
            problem = str(exc)
    if not problem:
        q, k, v = (np.moveaxis(a, d, -2).astype(dt, copy=False) for a, d in zip((q, k, v), dims))
    n, r = mesh.size(), mesh.get_local_rank()
    rotate = _rotate_method[0]
    lq, lk = _agree(mesh, n, r, _meta(q, k, v, problem, is_causal, scale, rotate), problem)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    acc = _Accumulator(q, LB.rank_segments(sum(lq), n, r), v.shape[-1], k.shape[:-2],
                       scale, is_causal, lambda: None)
    segments = [LB.rank_segments(sum(lk), n, i) for i in range(n)]
    if n == 1:  # nothing to rotate: no exchange, and no copy of k/v
        acc.attend(k, v, segments[0])
    elif rotate == "allgather":
        # One message carries keys and values side by side, as torch's rotater
        # gathers cat([k, v]).
        kv = np.ascontiguousarray(np.concatenate([k, v], axis=-1))
        _rotate_allgather(mesh, n, r, kv, lk, segments, acc)
    else:
        _rotate_ring(mesh, n, r, np.ascontiguousarray(k), np.ascontiguousarray(v), lk,
                     segments, acc)
    saved = None
    if keep:
        saved = RingSaved()
        saved.q, saved.k, saved.v, saved.out, saved.lse = q, k, v, acc.out, acc.lse
        saved.lq, saved.lk, saved.dims, saved.scale, saved.causal = lq, lk, dims, scale, is_causal
        saved.mesh, saved.n, saved.r, saved.rotate = mesh, n, r, rotate
    # The sequence dim keeps its place counted from the end (batch dims may broadcast).
    return np.moveaxis(acc.out, -2, dims[0] - q.ndim), saved


def ring_attention_backward(saved, grad_out):
    """The gradients ``(dq, dk, dv)`` of this rank's query, key and value shards
    (in their layout, in the compute dtype), given ``grad_out``, the gradient of
    this rank's output shard. Collective on the forward's mesh, as torch's ring
    attention backward: the query's gradient stays local; each key/value block's
    gradient is accumulated by the ranks it visits, travelling one step behind
    it, and a last shift returns it to its owner. Each tile recomputes its
    weights from the forward's log-sum-exp: no softmax is formed over the whole
    sequence.

    Example::

        >>> out, saved = ring_attention_forward(q, k, v, mesh=mesh)
        >>> dq, dk, dv = ring_attention_backward(saved, grad_out)
    """
    s = saved
    g = np.moveaxis(np.asarray(grad_out, s.out.dtype), s.dims[0] - s.q.ndim, -2)
    acc = _GradAccumulator(s, np.ascontiguousarray(g))
    segments = [LB.rank_segments(sum(s.lk), s.n, i) for i in range(s.n)]
    k, v = np.ascontiguousarray(s.k), np.ascontiguousarray(s.v)
    if s.n == 1:
        dk, dv = np.zeros_like(k), np.zeros_like(v)
        acc.attend(k, v, segments[0], dk, dv)
    else:
        dk, dv = _grad_ring(s, k, v, segments, acc)
    dq = sum_to(acc.dq, s.q.shape)
    return (np.moveaxis(dq, -2, s.dims[0]), np.moveaxis(dk, -2, s.dims[1]),
            np.moveaxis(dv, -2, s.dims[2]))


class _GradAccumulator:
    """The gradient of this rank's query rows, and the tiling that adds each
    key/value block's gradient into arrays of that block's shape. Per tile:
    P = exp(q kᵀ scale - lse), dV += Pᵀ g, dS = P (g vᵀ - rowsum(g out)) scale,
    dQ += dS k, dK += dSᵀ q (flash attention's backward)."""

    def __init__(self, saved, g):
        self.q, self.g = saved.q, g
        # A row that saw no key has lse -inf and no weights: exp(s - inf) = 0.
        self.lse = np.where(np.isneginf(saved.lse), np.inf, saved.lse)
        self.delta = np.sum(g * saved.out, axis=-1)
        self.dq = np.zeros(saved.out.shape[:-1] + (saved.q.shape[-1],), saved.out.dtype)
        self.q_segments = LB.rank_segments(sum(saved.lq), saved.n, saved.r)
        self.scale, self.causal = saved.scale, saved.causal
        self.tile = _tile_rows(int(np.prod(saved.out.shape[:-2], dtype=np.int64)))
        self.progress = lambda: None

    def attend(self, k, v, k_segments, dk, dv):
        """Adds the gradient of one key/value block into ``dk``, ``dv``."""
        for q_local, q_start, q_len in _pieces(self.q_segments, self.causal):
            for k_local, k_start, k_len in _pieces(k_segments, self.causal):
                self._pair(k, v, dk, dv, q_local, q_start, q_len, k_local, k_start, k_len)

    def _pair(self, k, v, dk, dv, q_local, q_start, q_len, k_local, k_start, k_len):
        for rows, tiles in _tiles(self.tile, self.causal, q_local, q_start, q_len,
                                  k_local, k_start, k_len):
            q, g = self.q[..., rows, :], self.g[..., rows, :]
            lse, delta = self.lse[..., rows, None], self.delta[..., rows, None]
            for cols, kn, mask in tiles:
                kt, vt = k[..., cols, :], v[..., cols, :]
                p = np.matmul(q, np.swapaxes(kt, -1, -2))
                p *= self.scale
                if mask is not None:
                    np.copyto(p, -np.inf, where=mask)
                p -= lse
                np.exp(p, out=p)
                dv[..., cols, :] += sum_to(np.matmul(np.swapaxes(p, -1, -2), g),
                                            dv.shape[:-2] + (kn, dv.shape[-1]))
                ds = np.matmul(g, np.swapaxes(vt, -1, -2))
                ds -= delta
                ds *= p
                ds *= self.scale
                self.dq[..., rows, :] += np.matmul(ds, kt)
                dk[..., cols, :] += sum_to(np.matmul(np.swapaxes(ds, -1, -2), q),
                                            dk.shape[:-2] + (kn, dk.shape[-1]))
            self.progress()


def _grad_ring(s, k, v, segments, acc):
    """Step i adds the gradient of the block of rank r - i into a fresh (dk, dv)
    while the accumulated gradient of that block from the ranks before arrives
    (it left rank r - 1 at the start of this step, one step behind its keys), and
    sends on the gradient of the block of step i - 1. With "alltoall" that send
    shares an exchange with the next key/value block; with "allgather" the blocks
    come from one all-gather of cat([k, v]) as in the forward. A last shift
    returns each block's gradient to its owner. Returns this rank's (dk, dv)."""
    n, r, lk, mesh = s.n, s.r, s.lk, s.mesh
    batch, ek, ev = k.shape[:-2], k.shape[-1], v.shape[-1]
    grad_buf = lambda rows: (np.empty(batch + (rows, ek), k.dtype),  # noqa: E731
                             np.empty(batch + (rows, ev), v.dtype))
    gathered = bufs = None
    if s.rotate == "allgather":
        kv = np.ascontiguousarray(np.concatenate([k, v], axis=-1))
        row = int(np.prod(batch, dtype=np.int64)) * kv.shape[-1] * kv.itemsize
        flat = np.empty(sum(lk) * row // kv.itemsize, kv.dtype)
        gathered = _comm.ring_allgatherv_start(mesh, 0, kv, flat, [m * row for m in lk])
        offsets = np.concatenate([[0], np.cumsum(lk)]) * (row // kv.itemsize)
    else:
        bufs = _RingBuffers(k, v, max(lk))
    cur, done = (k, v), None
    for step in range(n):
        src = (r - step) % n
        sends, recvs = [], []
        if gathered is None and step < n - 1:
            nxt = bufs.take(step, lk[(src - 1) % n], k, v)
            sends, recvs = list(cur), list(nxt)
        if done is not None:
            arriving = grad_buf(lk[src])
            sends, recvs = sends + list(done), recvs + list(arriving)
        ex = _comm.ring_shift_start(mesh, 0, sends, recvs) if sends else None
        if gathered is not None:
            if step == 0:
                acc.progress = gathered.test  # the local block overlaps the gather
            else:
                if step == 1:
                    gathered.wait()
                cur = _gathered_block(flat, offsets, kv.shape, ek, src, lk[src])
        if ex is not None:
            acc.progress = ex.test
        dk = np.zeros(batch + (lk[src], ek), k.dtype)
        dv = np.zeros(batch + (lk[src], ev), v.dtype)
        acc.attend(cur[0], cur[1], segments[src], dk, dv)
        if ex is not None:
            ex.wait()
        if done is not None:
            dk += arriving[0]
            dv += arriving[1]
        if gathered is None and step < n - 1:
            cur = nxt
        done = (dk, dv)
    acc.progress = lambda: None
    mine = grad_buf(lk[r])
    _comm.ring_shift_start(mesh, 0, list(done), list(mine)).wait()
    return mine


def _gathered_block(flat, offsets, kv_shape, ek, src, rows):
    """Rank ``src``'s keys and values in the all-gather of cat([k, v])."""
    b = flat[offsets[src]:offsets[src + 1]].reshape(kv_shape[:-2] + (rows, kv_shape[-1]))
    return b[..., :ek], b[..., ek:]


class _RingBuffers:
    """Two receive buffers for each of k and v, used in turn: the one received at
    step s is sent at step s+1 while the other receives, and is free again once
    that exchange completes. Sized for the longest shard; a shard is a prefix."""

    def __init__(self, k, v, longest):
        self.flat = [[np.empty(k.shape[:-2] + (longest, a.shape[-1]), a.dtype).reshape(-1)
                      for a in (k, v)] for _ in range(2)]
        self.batch = k.shape[:-2]

    def take(self, step, rows, k, v):
        return tuple(f[:int(np.prod(self.batch, dtype=np.int64)) * rows * a.shape[-1]]
                     .reshape(self.batch + (rows, a.shape[-1]))
                     for f, a in zip(self.flat[step % 2], (k, v)))


def _rotate_ring(mesh, n, r, k, v, lk, segments, acc):
    """Step s computes the block of rank r - s while the next one arrives; keys
    and values travel as two messages of one exchange (no packing copy)."""
    cur, bufs = (k, v), _RingBuffers(k, v, max(lk))
    for step in range(n):
        src, ex = (r - step) % n, None
        if step < n - 1:
            nxt = bufs.take(step, lk[(src - 1) % n], k, v)
            ex = _comm.ring_shift_start(mesh, 0, cur, nxt)
            acc.progress = ex.test
        acc.attend(cur[0], cur[1], segments[src])
        if ex is not None:
            cur = ex.wait()


def _rotate_allgather(mesh, n, r, kv, lk, segments, acc):
    """All blocks arrive in one all-gather, posted before the local block is
    computed and completed after."""
    row = int(np.prod(kv.shape[:-2], dtype=np.int64)) * kv.shape[-1] * kv.itemsize
    flat = np.empty(sum(lk) * row // kv.itemsize, kv.dtype)
    ex = _comm.ring_allgatherv_start(mesh, 0, kv, flat, [n_k * row for n_k in lk])
    acc.progress = ex.test
    acc.attend(kv[..., :acc.e], kv[..., acc.e:], segments[r])
    ex.wait()
    acc.progress = lambda: None
    offsets = np.concatenate([[0], np.cumsum(lk)]) * (row // kv.itemsize)
    for step in range(1, n):
        src = (r - step) % n
        block = flat[offsets[src]:offsets[src + 1]].reshape(kv.shape[:-2] + (lk[src], kv.shape[-1]))
        acc.attend(block[..., :acc.e], block[..., acc.e:], segments[src])
