"""mpitensor.nn layers and functional ops against independent NumPy references,
on plain arrays and on DTensors (outputs equal, placements as documented)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, nn
from mpitensor.debug import CommDebugMode
from mpitensor.nn import functional as F

W = MPI.COMM_WORLD.Get_size()
RNG = np.random.default_rng(1234)


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_linear_matches_reference_and_layout():
    mt.manual_seed(0)
    lin = nn.Linear(5, 3)
    assert lin.weight.shape == (3, 5) and lin.bias.shape == (3,)
    x = RNG.standard_normal((2, 4, 5))
    close(lin(x), np.einsum("bsi,oi->bso", x, lin.weight) + lin.bias)
    assert nn.Linear(5, 3, bias=False).bias is None


def test_activations():
    x = np.array([-2.0, -0.5, 0.0, 0.5, 3.0])
    close(nn.ReLU()(x), np.maximum(x, 0))
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    close(nn.GELU()(x), exact)
    tanh = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    close(nn.GELU("tanh")(x), tanh)
    with pytest.raises(ValueError):
        nn.GELU("fast")


def test_norms():
    x = RNG.standard_normal((3, 4, 6))
    ln = nn.LayerNorm(6)
    ln.weight = RNG.standard_normal(6)
    ln.bias = RNG.standard_normal(6)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    close(ln(x), (x - mu) / np.sqrt(var + 1e-5) * ln.weight + ln.bias)
    rms = nn.RMSNorm(6, eps=1e-6)
    close(rms(x), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6))
    with pytest.raises(ValueError, match="normalized_shape"):
        nn.LayerNorm(5)(x)


def test_embedding_plain():
    mt.manual_seed(0)
    emb = nn.Embedding(10, 4)
    idx = np.array([[1, 9], [0, 0]])
    np.testing.assert_array_equal(emb(idx), emb.weight[idx])
    with pytest.raises(IndexError):
        emb(np.array([10]))
    with pytest.raises(TypeError):
        emb(np.array([1.0]))


def test_dropout_statistics_eval_and_reproducibility():
    x = np.ones((200, 50))
    mt.manual_seed(3)
    y = nn.Dropout(0.25)(x)
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.02
    close(y[kept], np.full(kept.sum(), 1 / 0.75))
    mt.manual_seed(3)
    np.testing.assert_array_equal(F.dropout(x, 0.25), y)
    d = nn.Dropout(0.25).eval()
    assert d(x) is x
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


def ref_attention(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa(causal):
    q, k, v = (RNG.standard_normal((2, 3, 5, 4)) for _ in range(3))
    close(F.scaled_dot_product_attention(q, k, v, is_causal=causal),
          ref_attention(q, k, v, causal))
    mask = np.tril(np.ones((5, 5), bool))
    close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), ref_attention(q, k, v, True))


def test_multihead_attention_fused_equals_separate():
    mt.manual_seed(0)
    sep = nn.MultiheadAttention(12, 3, causal=True)
    fused = nn.MultiheadAttention(12, 3, fused_qkv=True, causal=True)
    d = sep.head_dim
    # fused rows are laid out (head, q|k|v, head_dim)
    w = np.stack([p.weight.reshape(3, d, 12) for p in (sep.q_proj, sep.k_proj, sep.v_proj)], 1)
    b = np.stack([p.bias.reshape(3, d) for p in (sep.q_proj, sep.k_proj, sep.v_proj)], 1)
    fused.qkv_proj.weight = w.reshape(36, 12)
    fused.qkv_proj.bias = b.reshape(36)
    fused.out_proj.load_state_dict(sep.out_proj.state_dict())
    x = RNG.standard_normal((2, 5, 12))
    close(fused(x), sep(x))
    q, k, v = (np.moveaxis(p(x).reshape(2, 5, 3, d), 2, 1)
               for p in (sep.q_proj, sep.k_proj, sep.v_proj))
    o = np.moveaxis(ref_attention(q, k, v, True), 1, 2).reshape(2, 5, 12)
    close(sep(x), sep.out_proj(o))
    with pytest.raises(ValueError, match="multiple"):
        nn.MultiheadAttention(10, 3)


def test_cross_entropy_reference():
    x = RNG.standard_normal((6, 5))
    t = np.array([0, 4, 2, -100, 1, 3])
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    valid = t != -100
    per = -logp[np.arange(6), np.where(valid, t, 0)]
    close(F.cross_entropy(x, t), per[valid].mean())
    close(F.cross_entropy(x, t, reduction="sum"), per[valid].sum())
    close(F.cross_entropy(x, t, reduction="none"), np.where(valid, per, 0))
    w = np.arange(1.0, 6.0)
    ww = w[np.where(valid, t, 0)] * valid
    close(F.cross_entropy(x, t, weight=w), (per * ww).sum() / ww.sum())
    x3 = RNG.standard_normal((2, 5, 3))  # (N, C, d)
    t3 = np.array([[0, 1, 4], [2, 2, 3]])
    lp3 = x3 - np.log(np.exp(x3).sum(1, keepdims=True))
    close(F.cross_entropy(x3, t3), -np.take_along_axis(lp3, t3[:, None], 1).mean())
    with pytest.raises(ValueError, match="target shape"):
        F.cross_entropy(x, t[:3])
    with pytest.raises(IndexError):
        F.cross_entropy(x, np.array([0, 0, 0, 0, 0, 5]))


def test_layers_on_replicated_dtensors_equal_plain(mesh):
    """distribute_module's default replicates every parameter; forward on DTensor
    inputs gives the plain result, with batch sharding kept and no communication."""
    mt.manual_seed(4)
    block = nn.TransformerBlock(8, 2, hidden_dim=12, norm="rms")
    x = RNG.standard_normal((W * 2, 6, 8))
    ref = block(x)
    dblock = mt.distribute_module(block, mesh)
    assert all(isinstance(p, DTensor) and p.placements == (Replicate(),)
               for p in dblock.parameters())
    dx = distribute_tensor(x, mesh, [Shard(0)])
    with CommDebugMode() as comm:
        y = dblock(dx)
    assert comm.get_total_counts() == 0
    if W > 1:  # on a mesh of one rank a Shard and a Replicate are the same layout
        assert y.placements == (Shard(0),)
    assert y.requires_grad  # the parameters do, as torch's
    close(y.detach().full_tensor(), ref)


@pytest.mark.parametrize("shape, moved", [((8, 20, 10), {"all_to_all_single"}),
                                          ((1, 1, 10), {"all_to_all_single",
                                                        "all_gather_into_tensor"})],
                         ids=["free dim", "dims of length 1"])
def test_layer_norm_of_a_sharded_normalized_dim_moves_once(mesh, shape, moved):
    """The normalized dim is made whole in one collective, then all is local: an
    all-to-all onto a long free dim; with only dims of length 1 free, that or a
    gather, whichever the executor prices cheaper."""
    x, w, b = RNG.standard_normal(shape), RNG.standard_normal(10), RNG.standard_normal(10)
    dw, db = (distribute_tensor(a, mesh, [Replicate()]) for a in (w, b))
    dx = distribute_tensor(x, mesh, [Shard(2)])
    with mt.no_grad(), CommDebugMode() as comm:
        y = F.layer_norm(dx, (10,), dw, db)
    counts = comm.get_comm_counts()
    assert (sum(counts.values()), set(counts) <= moved) == ((1, True) if W > 1 else (0, True))
    close(y.full_tensor(), F.layer_norm(x, (10,), w, b))


def test_sharded_embedding_variants(mesh):
    mt.manual_seed(0)
    weight = nn.Embedding(11, 6).weight
    idx = np.array([[0, 10, 3], [5, 5, 7]])
    didx = distribute_tensor(idx, mesh, [Replicate()])
    for wp, want in ((Shard(0), Partial()), (Shard(1), Shard(2)), (Replicate(), Replicate())):
        dw = distribute_tensor(weight, mesh, [wp])
        with CommDebugMode() as comm:
            out = F.embedding(didx, dw)
        assert comm.get_total_counts() == 0
        assert out.placements == (want,)
        close(out.full_tensor(), weight[idx])
    with pytest.raises(TypeError, match="indices are an ndarray"):
        F.embedding(idx, distribute_tensor(weight, mesh, [Shard(0)]))


def test_linear_partial_output_keeps_bias_once(mesh):
    """A rowwise product is Partial; the bias joins it on one rank only, so the
    reduced result adds it once (and a reduce-scatter can follow)."""
    mt.manual_seed(1)
    lin = nn.Linear(7, 5)
    x = RNG.standard_normal((4, 7))
    dx = distribute_tensor(x, mesh, [Shard(1)])
    dw = distribute_tensor(lin.weight, mesh, [Shard(1)])
    db = distribute_tensor(lin.bias, mesh, [Replicate()])
    y = F.linear(dx, dw, db)
    if W > 1:
        assert y.placements == (Partial(),)
    close(y.full_tensor(), lin(x))
    with pytest.raises(TypeError, match="both be DTensors"):
        F.linear(x, dw)


def test_dtensor_dropout_equals_plain(mesh):
    x = RNG.standard_normal((W + 3, 5))
    mt.manual_seed(9)
    ref = F.dropout(x, 0.3)
    mt.manual_seed(9)
    got = F.dropout(distribute_tensor(x, mesh, [Shard(0)]), 0.3)
    close(got.full_tensor(), ref)


def test_cross_entropy_dtensor_without_loss_parallel(mesh):
    x = RNG.standard_normal((4, 9))
    t = np.array([8, 0, 3, 4])
    got = F.cross_entropy(distribute_tensor(x, mesh, [Shard(1)]), t)
    assert isinstance(got, DTensor) and got.placements == (Replicate(),)
    close(got.to_local(), F.cross_entropy(x, t))


def test_float32_models_stay_float32():
    """No float64 constant may promote a float32 model (a mixed-dtype matmul drops
    out of BLAS into NumPy's own loops)."""
    x = RNG.standard_normal((2, 4, 8)).astype(np.float32)
    for act in ("gelu", "gelu_tanh", "relu"):
        block = nn.TransformerBlock(8, 2, activation=act, dtype=np.float32)
        assert block(x).dtype == np.float32, act
    assert F.gelu(x).dtype == np.float32 and F.gelu(x, "tanh").dtype == np.float32
    assert nn.RMSNorm(8, dtype=np.float32)(x).dtype == np.float32
    assert F.dropout(x, 0.5).dtype == np.float32
