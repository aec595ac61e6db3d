"""Backward of ring attention (context_parallel): the gradients of q, k and v,
unsharded, equal the non-context-parallel backward (float64, rtol 1e-10) for
causal and non-causal attention, even and uneven lengths, cross attention,
broadcast batch dims, another sequence dim and tiles smaller than the shards,
with both rotate methods; they match central differences of the ring forward;
the backward moves no more than torch's ring backward; sdpa on DTensors and
MultiheadAttention train inside context_parallel."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor
from mpitensor import DTensor, Replicate, Shard, nn
from mpitensor._distribute_module import distribute_module
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import local_mesh
from mpitensor.experimental import (context_parallel, context_parallel_unshard,
                                    set_rotate_method)
from mpitensor.experimental import _load_balance as LB
from mpitensor.experimental import _ring_attention as RA
from mpi_helpers import cp_mesh, rotate  # noqa: F401 - fixtures: mesh, rotate
from mpitensor.nn import functional as F

COMM = MPI.COMM_WORLD
N = COMM.Get_size()


def arrays(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def ring_grads(mesh, q, k, v, g, is_causal, seq_dim=-2, scale=None):
    """Unsharded (dq, dk, dv) of ring attention run on the shards of q, k, v, g."""
    with context_parallel(mesh, buffers=[q, k, v, g], buffer_seq_dims=[seq_dim] * 4):
        _, saved = RA.ring_attention_forward(q, k, v, mesh=mesh, seq_dim=seq_dim,
                                             is_causal=is_causal, scale=scale)
        grads = RA.ring_attention_backward(saved, g)
        return context_parallel_unshard(mesh, list(grads), [seq_dim] * 3)


def check(got, want):
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("length", [1, 2, 5, 13, 16])
def test_backward_equals_the_unsharded_backward(mesh, rotate, is_causal, length):
    q, k, v, g = arrays(*[(2, 3, length, 4)] * 3, (2, 3, length, 4), seed=length)
    want = F._sdpa_backward(q, k, v, g, None, 0.0, is_causal, None, None)
    check(ring_grads(mesh, q, k, v, g, is_causal), want)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(7, 12), (12, 5)])
def test_cross_attention_and_broadcast_batch(mesh, rotate, is_causal, lq, lk):
    # k and v have one batch row for q's two: their gradients sum over it.
    q, k, v, g = arrays((2, 2, lq, 3), (1, 2, lk, 3), (1, 2, lk, 5), (2, 2, lq, 5), seed=lq)
    want = F._sdpa_backward(q, k, v, g, None, 0.0, is_causal, 0.7, None)
    check(ring_grads(mesh, q, k, v, g, is_causal, scale=0.7), want)


def test_sequence_dim_not_second_to_last(mesh, rotate):
    q, k, v, g = arrays(*[(2, 9, 3, 4)] * 4, seed=1)
    heads = [np.moveaxis(a, 1, 2) for a in (q, k, v, g)]
    want = [np.moveaxis(a, 2, 1) for a in F._sdpa_backward(*heads, None, 0.0, True, None,
                                                            None)]
    check(ring_grads(mesh, q, k, v, g, True, seq_dim=1), want)


@pytest.mark.parametrize("is_causal", [False, True])
def test_tiles_smaller_than_shards(mesh, rotate, is_causal, monkeypatch):
    monkeypatch.setattr(RA, "_TILE_ELEMS", 16)
    q, k, v, g = arrays(*[(1, 101, 5)] * 4, seed=3)
    want = F._sdpa_backward(q, k, v, g, None, 0.0, is_causal, None, None)
    check(ring_grads(mesh, q, k, v, g, is_causal), want)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("length", [5, 6])
def test_central_differences(mesh, rotate, is_causal, length):
    """The gradient of sum(out * w), the sum over every rank's shard, against
    central differences of the ring forward itself."""
    full = arrays(*[(1, 2, length, 3)] * 3, (1, 2, length, 3), seed=7 + length)

    def loss(q, k, v):
        q, k, v, w = (a.copy() for a in (q, k, v, full[3]))
        with context_parallel(mesh, buffers=[q, k, v, w], buffer_seq_dims=[2] * 4):
            out = RA.ring_attention(q, k, v, mesh=mesh, is_causal=is_causal)
            return COMM.allreduce(float(np.sum(out * w)))

    got = ring_grads(mesh, *(a.copy() for a in full), is_causal)
    eps = 1e-6
    for i in range(3):
        fd = np.zeros_like(full[i])
        for idx in np.ndindex(full[i].shape):
            plus = [a.copy() for a in full[:3]]
            minus = [a.copy() for a in full[:3]]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            fd[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        np.testing.assert_allclose(got[i], fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("method", ["allgather", "alltoall"])
def test_backward_communicates_no_more_than_torch(mesh, method):
    """torch's ring backward (_templated_ring_attention_backward) rotates k/v as
    its forward does (one all-gather, or N-1 shifts) and the gradients of k/v
    with N all_to_all shifts. Here a gradient travels in the same exchange as
    the next k/v block: N+1 shifts with "alltoall" (torch: 2N-1), and one
    all-gather and N shifts with "allgather" (torch's)."""
    q, k, v, g = arrays(*[(2, 12, 4)] * 4)
    set_rotate_method(method)
    try:
        with context_parallel(mesh, buffers=[q, k, v, g], buffer_seq_dims=[1] * 4):
            _, saved = RA.ring_attention_forward(q, k, v, mesh=mesh, is_causal=True)
            with CommDebugMode() as cm:
                RA.ring_attention_backward(saved, g)
    finally:
        set_rotate_method("allgather")
    counts = cm.get_comm_counts()
    if N == 1:
        assert cm.get_total_counts() == 0
    elif method == "alltoall":
        assert counts["all_to_all_single"] == N + 1 <= 2 * N - 1
        assert cm.get_total_counts() == N + 1
    else:
        assert counts["all_gather_into_tensor"] == 1
        assert counts["all_to_all_single"] == N
        assert cm.get_total_counts() == N + 1


@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_on_local_dtensors_trains(mesh, rotate, is_causal):
    """Local-mesh DTensors (what to_local() gives of a tensor that requires grad)
    carry the graph through sdpa inside the block; the backward may run after it."""
    q, k, v, w = arrays(*[(2, 2, 11, 4)] * 4, seed=9)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    want = F._sdpa_backward(q, k, v, w, None, 0.0, is_causal, None, None)
    with context_parallel(mesh, buffers=[q, k, v, w], buffer_seq_dims=[2] * 4):
        ts = [DTensor.from_local(a.copy(), local_mesh(), [Replicate()]).requires_grad_()
              for a in (q, k, v)]
        o = F.scaled_dot_product_attention(*ts, is_causal=is_causal)
        assert type(o) is DTensor and o.grad_fn is not None
        loss = (o * DTensor.from_local(w.copy(), local_mesh(), [Replicate()])).sum()
        got_out = context_parallel_unshard(mesh, [o.detach().to_local()], [2])[0]
    loss.backward()  # outside the block: the ring is the forward's
    np.testing.assert_allclose(got_out, out, rtol=1e-10, atol=1e-12)
    grads = [t.grad.to_local() for t in ts]
    check(context_parallel_unshard(mesh, grads, [2] * 3), want)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_multihead_attention_trains_inside_context_parallel(mesh, fused, causal):
    """Replicate parameters, the sequence wrapped as Shard(1) (length 4N: the
    load-balanced shards have Shard's sizes): the parameters' gradients equal
    those of the same module on the whole sequence."""
    length = 4 * N
    rng = np.random.default_rng(5)
    attn = nn.MultiheadAttention(8, 2, fused_qkv=fused, causal=causal)
    for p in attn.parameters():
        p[...] = rng.standard_normal(p.shape) / 3
    distribute_module(attn, mesh)
    x, t = rng.standard_normal((2, length, 8)), rng.standard_normal((2, length, 8))
    rep = [mpitensor.distribute_tensor(a, mesh, [Replicate()]) for a in (x, t)]
    (attn(rep[0]) * rep[1]).sum().backward()
    want = {n: p.grad.full_tensor() for n, p in attn.named_parameters()}
    for p in attn.parameters():
        p.grad = None
    with context_parallel(mesh, buffers=[x, t], buffer_seq_dims=[1, 1]):
        xs, ts = (DTensor.from_local(a, mesh, [Shard(1)], shape=(2, length, 8),
                                     stride=(length * 8, 8, 1)) for a in (x, t))
        (attn(xs) * ts).sum().backward()
    for n, p in attn.named_parameters():
        np.testing.assert_allclose(p.grad.full_tensor(), want[n], rtol=1e-10, atol=1e-12)


def test_shards_not_matching_their_placements_fail_everywhere(mesh):
    if N == 1:
        pytest.skip("one rank's shard is the whole sequence")
    length = 7  # at 2..4 ranks the load-balanced shards are not Shard(1)'s chunks
    assert [LB.local_length(length, N, r) for r in range(N)] != \
        list(mpitensor._bind.core.chunk_sizes(length, N))
    attn = nn.MultiheadAttention(4, 1)
    distribute_module(attn, mesh)
    x = np.ones((1, length, 4))
    with context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]):
        xs = DTensor.from_local(x, mesh, [Shard(1)], shape=(1, length, 4),
                                stride=(length * 4, 4, 1))
        with pytest.raises(ValueError, match="multiple of twice the mesh size"):
            attn(xs)


def test_mixed_dtensor_and_ndarray_refused(mesh):
    q = np.ones((1, 4, 2))
    with context_parallel(mesh, buffers=[q], buffer_seq_dims=[1]):
        t = DTensor.from_local(q.copy(), local_mesh(), [Replicate()]).requires_grad_()
        with pytest.raises(TypeError, match="all be DTensors or all ndarrays"):
            F.scaled_dot_product_attention(t, q, q)


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_match_torch_sdpa(mesh, rotate, is_causal):
    """torch's context_parallel does not run on CPU (its CPU attention kernel has
    no ring implementation), so the ring's gradients are compared with torch's
    scaled_dot_product_attention on the whole sequence."""
    torch = pytest.importorskip("torch")
    q, k, v, g = arrays(*[(2, 3, 13, 4)] * 4, seed=21)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=is_causal) \
        .backward(torch.tensor(g))
    check(ring_grads(mesh, q, k, v, g, is_causal),
          [t.grad.numpy() for t in (tq, tk, tv)])
