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

from .. import _C
from . import _load_balance as LB
from ._agree import agree_on_shards

__all__ = ["ring_attention", "set_rotate_method", "attention_block", "merge_partial"]

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
        t = self.tile
        for qa in range(0, q_len, t):
            qn = min(t, q_len - qa)
            rows = slice(q_local + qa, q_local + qa + qn)
            for ka in range(0, k_len, t):
                kn = min(t, k_len - ka)
                mask = None
                if self.causal:
                    mask = _causal_mask(q_start + qa, qn, k_start + ka, kn)
                    if mask is False:
                        continue
                cols = slice(k_local + ka, k_local + ka + kn)
                o, l = attention_block(self.q[..., rows, :], k[..., cols, :],
                                       v[..., cols, :], self.scale, mask)
                merge_partial(self.out[..., rows, :], self.lse[..., rows], o, l)
            self.progress()


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
    rest = lambda a: hash(a.shape[:-2] + a.shape[-1:])  # noqa: E731 (int tuples hash alike on every rank)
    return [int(bool(problem)), q.shape[-2], k.shape[-2], rest(q), rest(k), rest(v),
            q.dtype.num, int(bool(causal)), scale_bits, _ROTATE_CODES[rotate]]


def _agree(handle, n, r, meta, problem):
    """Gathers every rank's metadata and raises the same error on every rank when
    the inputs are bad anywhere or differ between ranks. Returns the query and
    key lengths per rank."""
    lq, lk = agree_on_shards(handle, n, meta, problem, "ring attention",
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
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    problem = _local_problems(q, k, v)
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
    handle, rotate = mesh._handle, _rotate_method[0]
    lq, lk = _agree(handle, n, r, _meta(q, k, v, problem, is_causal, scale, rotate), problem)
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
        _rotate_allgather(handle, n, r, kv, lk, segments, acc)
    else:
        _rotate_ring(handle, n, r, np.ascontiguousarray(k), np.ascontiguousarray(v), lk,
                     segments, acc)
    # The sequence dim keeps its place counted from the end (batch dims may broadcast).
    return np.moveaxis(acc.out, -2, dims[0] - q.ndim)


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


def _rotate_ring(handle, n, r, k, v, lk, segments, acc):
    """Step s computes the block of rank r - s while the next one arrives; keys
    and values travel as two messages of one exchange (no packing copy)."""
    cur, bufs = (k, v), _RingBuffers(k, v, max(lk))
    for step in range(n):
        src, ex = (r - step) % n, None
        if step < n - 1:
            nxt = bufs.take(step, lk[(src - 1) % n], k, v)
            ex = _C.ring_shift_start(handle, 0, cur, nxt)
            acc.progress = ex.test
        acc.attend(cur[0], cur[1], segments[src])
        if ex is not None:
            cur = ex.wait()


def _rotate_allgather(handle, n, r, kv, lk, segments, acc):
    """All blocks arrive in one all-gather, posted before the local block is
    computed and completed after."""
    row = int(np.prod(kv.shape[:-2], dtype=np.int64)) * kv.shape[-1] * kv.itemsize
    flat = np.empty(sum(lk) * row // kv.itemsize, kv.dtype)
    ex = _C.ring_allgatherv_start(handle, 0, kv, flat, [n_k * row for n_k in lk])
    acc.progress = ex.test
    acc.attend(kv[..., :acc.e], kv[..., acc.e:], segments[r])
    ex.wait()
    acc.progress = lambda: None
    offsets = np.concatenate([[0], np.cumsum(lk)]) * (row // kv.itemsize)
    for step in range(1, n):
        src = (r - step) % n
        block = flat[offsets[src]:offsets[src + 1]].reshape(kv.shape[:-2] + (lk[src], kv.shape[-1]))
        acc.attend(block[..., :acc.e], block[..., acc.e:], segments[src])
