"""nn.functional.scaled_dot_product_attention and MultiheadAttention inside
context_parallel run as ring attention: unsharded outputs equal the same calls
outside the context (float64, rtol 1e-10), at np 1..4."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor.debug import CommDebugMode
from mpitensor.experimental import (context_parallel, context_parallel_unshard,
                                    set_rotate_method)
from mpitensor import nn
from mpitensor.nn import functional as F


N = MPI.COMM_WORLD.Get_size()


@pytest.mark.parametrize("method", ["allgather", "alltoall"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_functional_sdpa_is_ring_attention_inside(mesh, method, is_causal):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 13, 4)) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    set_rotate_method(method)
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            with CommDebugMode() as cm:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
            got = context_parallel_unshard(mesh, [out], [2])[0]
    finally:
        set_rotate_method("allgather")
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert (cm.get_total_counts() > 0) == (N > 1)


@pytest.mark.parametrize("fused", [False, True])
def test_multihead_attention_under_context_parallel(mesh, fused):
    rng = np.random.default_rng(5)
    attn = nn.MultiheadAttention(8, 2, fused_qkv=fused, causal=True)
    for name, p in attn.named_parameters():
        p[...] = rng.standard_normal(p.shape) / 3  # the same weights on every rank
    x = rng.standard_normal((2, 11, 8))
    want = attn(x)
    with context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]):
        out = attn(x)
        got = context_parallel_unshard(mesh, [out], [1])[0]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert x.shape == (2, 11, 8)


def test_mask_and_dropout_refused_inside(mesh):
    q = np.ones((1, 4, 2))
    with context_parallel(mesh, buffers=[q], buffer_seq_dims=[1]):
        with pytest.raises(NotImplementedError, match="attn_mask"):
            F.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((4, 4), bool))
