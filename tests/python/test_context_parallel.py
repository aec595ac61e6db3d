"""mpitensor.experimental.context_parallel and ring attention: outputs, unsharded,
equal single-process attention computed here with plain NumPy (float64, rtol
1e-10) for causal and non-causal attention, uneven lengths, several heads and
both rotate methods; buffers are sharded in place into head+tail chunks and
restored exactly on exit; bad input fails on every rank."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor
from mpitensor.debug import CommDebugMode
from mpitensor.experimental import (context_parallel, context_parallel_unshard,
                                    set_rotate_method)
from mpitensor import _modes
from mpitensor.experimental import _context_parallel as CP
from mpitensor.experimental import _load_balance as LB
from mpitensor.experimental import _ring_attention as RA
from mpi_helpers import cp_mesh, rotate  # noqa: F401 - fixtures: mesh, rotate

COMM = MPI.COMM_WORLD
N = COMM.Get_size()
RANK = COMM.Get_rank()


def reference_attention(q, k, v, is_causal=False, scale=None):
    """torch's scaled_dot_product_attention math, written out in NumPy."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if is_causal:
        keep = np.tril(np.ones(s.shape[-2:], dtype=bool))
        s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def expected_positions(length, n, rank):
    """Rank r's positions: chunks r and 2n-1-r of 2n near-equal chunks."""
    chunks = np.array_split(np.arange(length), 2 * n)
    return np.concatenate([chunks[rank], chunks[2 * n - 1 - rank]])


def qkv(shape_q, shape_kv=None, seed=0, ev=None):
    rng = np.random.default_rng(seed)
    shape_kv = shape_q if shape_kv is None else shape_kv
    v_shape = shape_kv[:-1] + ((ev,) if ev else shape_kv[-1:])
    return (rng.standard_normal(shape_q), rng.standard_normal(shape_kv),
            rng.standard_normal(v_shape))


def run_cp(mesh, q, k, v, is_causal, scale=None, seq_dim=-2):
    dims = [seq_dim] * 3
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=dims):
        out = RA.ring_attention(q, k, v, mesh=mesh, seq_dim=seq_dim, is_causal=is_causal,
                                scale=scale)
        return context_parallel_unshard(mesh, [out], [seq_dim])[0]


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("length", [1, 2, 5, 13, 64])
@pytest.mark.parametrize("heads", [1, 4])
def test_ring_attention_matches_single_process(mesh, rotate, is_causal, length, heads):
    q, k, v = qkv((2, heads, length, 8), seed=length * 10 + heads, ev=6)
    want = reference_attention(q, k, v, is_causal)
    got = run_cp(mesh, q, k, v, is_causal)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(7, 19), (19, 7), (3, 1)])
def test_cross_attention_lengths_differ(mesh, rotate, is_causal, lq, lk):
    q, k, v = qkv((3, lq, 4), (3, lk, 4), seed=lq + lk)
    want = reference_attention(q, k, v, is_causal, scale=0.3)
    np.testing.assert_allclose(run_cp(mesh, q, k, v, is_causal, scale=0.3), want,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
def test_tiles_smaller_than_shards(mesh, rotate, is_causal, monkeypatch):
    # Tiles of 16 rows against shards of ~50/N rows: the causal classification of
    # tiles (all visible, diagonal, skipped) and the lse merge across tiles run.
    monkeypatch.setattr(RA, "_TILE_ELEMS", 16)
    q, k, v = qkv((1, 101, 5), seed=3)
    np.testing.assert_allclose(run_cp(mesh, q, k, v, is_causal),
                               reference_attention(q, k, v, is_causal),
                               rtol=1e-10, atol=1e-12)


def test_seq_dim_not_second_to_last(mesh, rotate):
    # (L, N, E) layout, as MultiheadAttention's default: the sequence is dim 0.
    q, k, v = qkv((2, 11, 4), seed=5)
    want = reference_attention(q, k, v, True)
    qt, kt, vt = (np.ascontiguousarray(np.swapaxes(a, 0, 1)) for a in (q, k, v))
    got = run_cp(mesh, qt, kt, vt, True, seq_dim=0)
    np.testing.assert_allclose(np.swapaxes(got, 0, 1), want, rtol=1e-10, atol=1e-12)


def test_integer_inputs_compute_in_float64(mesh):
    rng = np.random.default_rng(1)
    q, k, v = (rng.integers(-3, 4, size=(2, 9, 3)) for _ in range(3))
    got = run_cp(mesh, q, k, v, False)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, reference_attention(q * 1.0, k * 1.0, v * 1.0),
                               rtol=1e-10, atol=1e-12)


def test_batch_dims_broadcast(mesh):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, 10, 4))
    k, v = rng.standard_normal((2, 1, 10, 4)), rng.standard_normal((2, 1, 10, 4))
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[-2, -2, -2]):
        out = RA.ring_attention(q, k, v, mesh=mesh, is_causal=True)
        got = context_parallel_unshard(mesh, [out], [-2])[0]
    np.testing.assert_allclose(got, reference_attention(q, k, v, True), rtol=1e-10,
                               atol=1e-12)


# ---- buffers ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
@pytest.mark.parametrize("shape,dim", [((23,), 0), ((4, 17, 3), 1), ((5, 2, 9), -1)])
def test_buffers_sharded_in_place_and_restored(mesh, dtype, shape, dim):
    full = (np.arange(np.prod(shape)) * 7 % 31).reshape(shape).astype(dtype)
    buf = full.copy()
    other = full.copy() + 1
    with context_parallel(mesh, buffers=[buf, other], buffer_seq_dims=[dim, dim]) as shards:
        assert shards[0] is buf and shards[1] is other
        pos = expected_positions(shape[dim], N, RANK)
        np.testing.assert_array_equal(buf, np.take(full, pos, axis=dim))
        np.testing.assert_array_equal(other, np.take(full, pos, axis=dim) + 1)
        back = context_parallel_unshard(mesh, [buf], [dim])[0]
        np.testing.assert_array_equal(back, full)
    assert buf.shape == full.shape and buf.dtype == full.dtype
    np.testing.assert_array_equal(buf, full)
    np.testing.assert_array_equal(other, full + 1)


def test_restored_after_an_exception(mesh):
    full = np.arange(40.0).reshape(2, 20)
    buf = full.copy()
    with pytest.raises(KeyError):
        with context_parallel(mesh, buffers=[buf], buffer_seq_dims=[1]):
            raise KeyError("inside")
    np.testing.assert_array_equal(buf, full)
    assert CP.active() is None


def test_no_restore_buffers_keep_their_shard(mesh):
    a, b = np.arange(30.0), np.arange(30.0) * 2
    with context_parallel(mesh, buffers=[a, b], buffer_seq_dims=[0, 0],
                          no_restore_buffers=[b]):
        pass
    pos = expected_positions(30, N, RANK)
    np.testing.assert_array_equal(a, np.arange(30.0))
    np.testing.assert_array_equal(b, pos * 2.0)


def test_view_is_left_whole_with_a_warning(mesh):
    base = np.arange(60.0).reshape(3, 20)
    view = base[1:]
    with pytest.warns(UserWarning, match=r"buffers\[0\].*view"):
        with context_parallel(mesh, buffers=[view], buffer_seq_dims=[1]) as (shard,):
            assert view.shape == (2, 20)
            pos = expected_positions(20, N, RANK)
            np.testing.assert_array_equal(shard, base[1:, pos])
    np.testing.assert_array_equal(base, np.arange(60.0).reshape(3, 20))


def test_active_inside_only(mesh):
    assert CP.active() is None
    with context_parallel(mesh):
        assert CP.active() is mesh
    assert CP.active() is None


# ---- communication -----------------------------------------------------------------


def test_comm_counts_per_rotate_method(mesh):
    q, k, v = qkv((2, 12, 4))
    for method, key, calls in (("alltoall", "all_to_all_single", N - 1),
                               ("allgather", "all_gather_into_tensor", 1)):
        set_rotate_method(method)
        try:
            with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[1, 1, 1]):
                with CommDebugMode() as cm:
                    RA.ring_attention(q, k, v, mesh=mesh, is_causal=True)
        finally:
            set_rotate_method("allgather")
        counts = cm.get_comm_counts()
        assert counts[key] == (calls if N > 1 else 0)
        assert cm.get_total_counts() == (calls if N > 1 else 0)


# ---- errors ------------------------------------------------------------------------


def test_errors_of_the_api(mesh):
    a, b = np.zeros(8), np.zeros(8)
    with pytest.raises(ValueError, match="same length"):
        with context_parallel(mesh, buffers=[a, b], buffer_seq_dims=[0]):
            pass
    with pytest.raises(ValueError, match="subset"):
        with context_parallel(mesh, buffers=[a], buffer_seq_dims=[0], no_restore_buffers=[b]):
            pass
    with pytest.raises(ValueError, match="twice"):
        with context_parallel(mesh, buffers=[a, a], buffer_seq_dims=[0, 0]):
            pass
    with pytest.raises(ValueError):
        with context_parallel(mesh, buffers=[a], buffer_seq_dims=[1]):
            pass
    with pytest.raises(TypeError, match="ndarray"):
        with context_parallel(mesh, buffers=[[1, 2]], buffer_seq_dims=[0]):
            pass
    with pytest.raises(NotImplementedError, match="ring"):
        set_rotate_method("ring")
    mesh2 = mpitensor.init_device_mesh("cpu", (1, N))
    with pytest.raises(ValueError, match="1-D mesh"):
        with context_parallel(mesh2):
            pass
    with pytest.raises(ValueError, match="same length"):
        context_parallel_unshard(mesh, [a], [0, 0])
    assert a.shape == (8,) and CP.active() is None


def test_bad_attention_input_fails_on_every_rank(mesh):
    q, k, v = qkv((2, 8, 4))
    with pytest.raises(ValueError, match="embedding size"):
        RA.ring_attention(q, k[..., :3], v, mesh=mesh)
    # Only the last rank passes a bad key: every rank raises, none waits.
    bad = k[..., :3] if RANK == N - 1 else k
    with pytest.raises(ValueError, match="embedding size|rejected"):
        RA.ring_attention(q, bad, v, mesh=mesh)


@pytest.mark.skipif(N < 2, reason="shards can only disagree between ranks")
def test_shards_of_different_problems_fail_on_every_rank(mesh):
    q, k, v = qkv((2, 8 + RANK, 4))  # lengths that no load-balanced split gives
    with pytest.raises(ValueError, match="load-balanced"):
        RA.ring_attention(q, k, v, mesh=mesh)
    q2 = np.zeros((2 + RANK, 4, 4))
    with pytest.raises(ValueError, match="differ"):
        RA.ring_attention(q2, q2, q2, mesh=mesh)
    with pytest.raises(ValueError, match="differ|load-balanced"):
        context_parallel_unshard(mesh, [np.zeros((4, 3 + RANK))], [0])


def test_sdpa_hook(mesh):
    q, k, v = qkv((2, 3, 10, 4), seed=9)
    want = reference_attention(q, k, v, True, scale=0.5)
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        mode = _modes.context_parallel()
        assert mode.mesh is CP.active() is mesh
        out = mode.sdpa(q, k, v, None, 0.0, True, 0.5)
        got = context_parallel_unshard(mesh, [out], [2])[0]
        with pytest.raises(NotImplementedError, match="attn_mask"):
            mode.sdpa(q, k, v, np.ones((10, 10), bool))
        with pytest.raises(NotImplementedError, match="dropout"):
            mode.sdpa(q, k, v, None, 0.1)
    assert _modes.context_parallel() is None
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_failure_while_sharding_restores_earlier_buffers(mesh, monkeypatch):
    real, calls = CP._shard_in_place, []

    def fail_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("no room for the second shard")
        return real(*args)

    monkeypatch.setattr(CP, "_shard_in_place", fail_second)
    a, b = np.arange(12.0), np.arange(12.0)
    with pytest.raises(MemoryError):
        with context_parallel(mesh, buffers=[a, b], buffer_seq_dims=[0, 0]):
            pass
    np.testing.assert_array_equal(a, np.arange(12.0))
    np.testing.assert_array_equal(b, np.arange(12.0))
    assert CP.active() is None


@pytest.mark.parametrize("n,length", [(2, 64), (3, 100), (4, 1000), (4, 1024)])
def test_causal_work_is_balanced(n, length, monkeypatch):
    # Count the visible (query, key) pairs each rank computes, with tiles of 16
    # rows: head+tail chunks give every rank the same share of L(L+1)/2.
    seen = []

    def counting_block(q, k, v, scale, mask=None):
        seen[-1] += q.shape[-2] * k.shape[-2] if mask is None else int((~mask).sum())
        return np.zeros(q.shape[:-1] + (1,)), np.zeros(q.shape[:-1])

    monkeypatch.setattr(RA, "attention_block", counting_block)
    monkeypatch.setattr(RA, "merge_partial", lambda *args: None)
    monkeypatch.setattr(RA, "_TILE_ELEMS", 256)
    for r in range(n):
        seen.append(0)
        q = np.zeros((1, length // n + 1, 1))
        acc = RA._Accumulator(q, LB.rank_segments(length, n, r), 1, (1,), 1.0, True,
                              lambda: None)
        for src in range(n):
            k = np.zeros((1, LB.local_length(length, n, src), 1))
            acc.attend(k, k, LB.rank_segments(length, n, src))
    assert sum(seen) == length * (length + 1) // 2
    # Chunk lengths differ by at most one, each row of difference moving at most L
    # pairs; with equal chunks the shares are equal.
    assert max(seen) - min(seen) <= (0 if length % (2 * n) == 0 else 2 * length)
