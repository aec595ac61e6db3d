"""Helpers of the backward-rule tests: leaves in every layout, the gradients of a
weighted sum, and central differences on the full NumPy arrays."""

from __future__ import annotations

import numpy as np

from mpitensor import Partial, Replicate, Shard, distribute_tensor
from ops_helpers import make

R, PS = Replicate(), Partial("sum")


def plain(pls):
    return tuple(R if p.is_partial() else p for p in pls)


def options(ndim):
    """The placements one mesh dim may give an operand of ``ndim`` dims."""
    return [R, PS] + [Shard(d) for d in range(ndim)]


def layouts(mesh_shape, ndims):
    """Placement tuples for operands of ``ndims`` dims, one placement per mesh dim,
    that together give each operand every option on each mesh dim."""
    count = max(len(options(n)) for n in ndims)
    out = []
    for j in range(count):
        out.append(tuple(tuple(options(n)[(j + i + m) % len(options(n))]
                               for m in range(len(mesh_shape)))
                         for i, n in enumerate(ndims)))
    return out


def weights(shape, seed=7):
    return np.random.default_rng(seed).uniform(0.5, 1.5, size=shape)


def run(prog, arrays, mesh, pls, seed=7):
    """The leaves' gradients of ``sum(c * prog(*leaves))`` for fixed weights ``c``,
    each checked to have its leaf's dtype (its placements are backward's, as torch's);
    returns them gathered, with ``c``."""
    xs = [make(a, mesh, p).requires_grad_() for a, p in zip(arrays, pls)]
    y = prog(*xs)
    c = weights(y.shape, seed)
    (y * distribute_tensor(c, mesh, [R] * mesh.ndim, src_data_rank=None)).sum().backward()
    grads = []
    for i, (x, p) in enumerate(zip(xs, pls)):
        assert x.grad is not None, f"input {i} got no gradient"
        assert x.grad.dtype == x.dtype
        grads.append(x.grad.full_tensor())
    return grads, c


def numeric(f, arrays, c, eps=1e-6):
    """Central differences of ``sum(c * f(*arrays))`` in each array, on the full
    NumPy arrays."""
    out = []
    for i, a in enumerate(arrays):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            vals = []
            for step in (eps, -eps):
                moved = [b.copy() for b in arrays]
                moved[i][idx] += step
                vals.append(float(np.sum(c * f(*moved))))
            g[idx] = (vals[0] - vals[1]) / (2 * eps)
        out.append(g)
    return out


def rng_arrays(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def torch_grads(f, arrays, tmesh, pls, c):
    """The leaves' gradients of ``sum(c * f(*leaves))`` under torch DTensor, gathered;
    None where torch refuses to flatten an uneven shard (its tensordot and prod
    reshape their operands), which every rank sees alike."""
    import torch
    from torch.distributed import tensor as td
    from torch_helpers import torch_placements

    xs = [td.distribute_tensor(torch.tensor(a), tmesh, torch_placements(p)).requires_grad_()
          for a, p in zip(arrays, pls)]
    try:
        y = f(*xs)
        tc = td.distribute_tensor(torch.tensor(c), tmesh, [td.Replicate()])
        (y * tc).sum().backward()
    except RuntimeError as e:
        if "unevenly sharded" in str(e):
            return None
        raise
    return [x.grad.full_tensor().numpy() for x in xs]
