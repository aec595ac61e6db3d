"""``np.cov`` and ``np.corrcoef`` of DTensors as DTensor operations: one mean, one
product and the reduction the product leaves, placed by the engine.

NumPy's recipe on the whole array: the variables' means (a reduction), the
deviations (elementwise), then ``X @ X.T`` over the observations: where the
observations are sharded the product is a Partial(sum) of the variables x variables
result, reduced once (before the scaling, so that it rounds as NumPy's); where the
variables are sharded the engine moves one operand, as for any product. With few
variables, not sharded, each rank forms its part of the product block by block of
its observations, so the deviations never fill an array of the data's size. No
whole array is gathered to run NumPy. ``corrcoef`` divides by the standard deviations
read off the diagonal (_diagonal.py), elementwise.

Forms with no rule here (``y=``, ``fweights=``, ``aweights=``, complex
``corrcoef``, more than two dims) go to the fallback.
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Partial, Replicate, Shard
from .._algorithms import _dispatch as D

__all__ = ["cov", "corrcoef"]


def _reduced(name, x):
    return D.relayout(name, x, [Replicate() if p.is_partial() else p
                                for p in x._spec.placements])


def _row_sums(local):
    """The sums of ``local``'s rows, as a column. A transposed block (``rowvar=False``
    of row-major data) is summed as one matrix-vector product: NumPy's sum along its
    strided axis adds one short row of the data at a time, several passes' time."""
    if local.flags.c_contiguous or local.dtype not in _BLAS or not local.size:
        return np.sum(local, axis=1, keepdims=True)
    return (local @ np.ones(local.shape[1], local.dtype))[:, None]


_BLAS = frozenset(np.dtype(t) for t in ("f4", "f8", "c8", "c16"))


def _means(name, x):
    """The means of the rows of ``x`` (no Partial), as a column laid out as ``x``'s
    rows are, so each rank subtracts its own: a sum reduced where the observations
    are sharded (np.mean's Partial(avg) would move the data of uneven shards
    instead). Collective on the mesh when the observations are sharded (the means
    only)."""
    spec = x._spec
    mesh = spec.mesh
    # Each rank's sums over its observations: a Partial(sum) over the mesh dims that
    # shard them, as np.sum's rule leaves it.
    sums_pls = tuple(Partial("sum") if p.is_shard() and p.dim == 1 else p
                     for p in spec.placements)
    shape = (spec.shape[0], 1)
    dtype = (spec.dtype if spec.dtype in _BLAS else  # np.sum widens small integers
             np.sum(np.zeros((1, 1), spec.dtype), axis=1).dtype)
    sums = DTensor(np.asarray(_row_sums(x.to_local()), dtype)
                   if mesh.get_coordinate() is not None else D.outside_local(shape, dtype),
                   DTensorSpec(mesh, sums_pls, shape, dtype, contiguous_strides(shape)))
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = _reduced(name, sums) / x.shape[1]
    rows = [Shard(0) if p == Shard(0) else Replicate() for p in spec.placements]
    return D.relayout(name, mean.astype(spec.dtype), rows, records=True)


def _deviations(name, x, mean):
    """``x`` (no Partial) less its rows' ``mean``, in ``x``'s placements: the engine
    is not asked to place the difference, which it may shard further along a mesh
    dim the product then gathers. The difference keeps the memory order of ``x``'s
    block (a transposed block stays one, which the product reads as it is). Local."""
    spec = x._spec
    if spec.mesh.get_coordinate() is None:
        return x
    with np.errstate(invalid="ignore"):
        local = x.to_local() - mean.to_local()
    return DTensor(np.asarray(local, spec.dtype), DTensorSpec(
        spec.mesh, spec.placements, spec.shape, spec.dtype, contiguous_strides(spec.shape)))


# Up to this many variables, each rank forms its part of the product from blocks of
# observations: a block's deviations are made and multiplied while in cache, and no
# deviations array of the data's size is written. Above, the product's own cost
# dwarfs that pass.
_FEW = 256
# Elements per block of deviations.
_BLOCK = 32768


def _product_by_blocks(name, x, mean):
    """The deviations' product over the observations of ``x`` (no Partial, the
    variables not sharded): each rank's sum over its observations, reduced where
    they are sharded. Collective on the mesh when they are (one all-reduce of the
    product)."""
    spec = x._spec
    mesh = spec.mesh
    v = spec.shape[0]
    pls = tuple(Partial("sum") if p.is_shard() and p.dim == 1 else p
                for p in spec.placements)
    dtype = spec.dtype
    if mesh.get_coordinate() is None:
        c = D.outside_local((v, v), dtype)
    else:
        local, mu = x.to_local(), mean.to_local()
        c = np.zeros((v, v), dtype)
        step = max(1, _BLOCK // max(v, 1))
        with np.errstate(invalid="ignore"):
            for j in range(0, local.shape[1], step):
                dev = local[:, j:j + step] - mu
                # dev @ dev.T of one buffer is one symmetric rank-k update in BLAS.
                c += dev @ (np.conj(dev) if dtype.kind == "c" else dev).T
    return _reduced(name, DTensor(c, DTensorSpec(mesh, pls, (v, v), dtype,
                                                 contiguous_strides((v, v)))))


def _cov(name, m, rowvar, bias, ddof, dtype):
    if type(m) is not DTensor or m.ndim > 2:
        raise _registry.NoRule(f"{name}: the data must be a DTensor of at most two dims")
    if ddof is not None and ddof != int(ddof):
        raise ValueError("ddof must be integer")
    dtype = np.result_type(m.dtype, np.float64) if dtype is None else np.dtype(dtype)
    x = m.astype(dtype) if m.dtype != dtype else m
    if x.ndim < 2:
        x = x.reshape(1, -1)
    elif not rowvar:
        x = np.transpose(x)
    if x.shape[0] == 0:
        return None  # NumPy's array([]).reshape(0, 0): left to the fallback
    ddof = (0 if bias else 1) if ddof is None else int(ddof)
    fact = x.shape[1] - ddof
    if fact <= 0:
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
        fact = 0.0
    # A mean subtracted from each part of a Partial would be subtracted many times.
    x = _reduced(name, x)
    mean = _means(name, x)
    if (x.shape[0] <= _FEW and dtype in _BLAS
            and not any(p.is_shard() and p.dim == 0 for p in x._spec.placements)):
        c = _product_by_blocks(name, x, mean)
    else:
        dev = _deviations(name, x, mean)
        other = np.conj(dev) if dtype.kind == "c" else dev
        c = _reduced(name, np.matmul(dev, np.transpose(other)))
    with np.errstate(divide="ignore", invalid="ignore"):
        # NumPy scales in place: in float64, kept in the data's dtype.
        c = (c * np.true_divide(1, fact)).astype(c.dtype)
    return np.squeeze(c)


@_registry.implements(np.cov)
def cov(m, y=None, rowvar=True, bias=False, ddof=None, fweights=None, aweights=None, *,
        dtype=None):
    """``np.cov`` of a DTensor (rows the variables, unless ``rowvar=False``): the
    deviations' product over the observations, as DTensor operations. Collective on
    the mesh when the data is sharded: one all-reduce of the means and one of the
    variables x variables product where the observations are sharded.

    Example: ``np.cov(dt)`` of a (3, 1000) ``[Shard(1)]`` DTensor is a (3, 3)
    Replicate DTensor after two small all-reduces.
    """
    name = "numpy.cov"
    if y is not None or fweights is not None or aweights is not None:
        raise _registry.NoRule(f"{name}: y=, fweights= and aweights= have no distributed "
                               f"rule")
    c = _cov(name, m, rowvar, bias, ddof, dtype)
    if c is None:
        raise _registry.NoRule(f"{name}: no variables")
    return c


@_registry.implements(np.corrcoef)
def corrcoef(x, y=None, rowvar=True, *, dtype=None):
    """``np.corrcoef`` of a DTensor: ``np.cov`` divided by the standard deviations on
    its diagonal, clipped to [-1, 1]. Collective on the mesh as ``np.cov``, plus an
    all-reduce of the diagonal where the covariance is sharded.

    Example: ``np.corrcoef(dt)``.
    """
    name = "numpy.corrcoef"
    if y is not None:
        raise _registry.NoRule(f"{name}: y= has no distributed rule")
    if type(x) is DTensor and (x.dtype.kind == "c" or (dtype is not None and
                                                       np.dtype(dtype).kind == "c")):
        raise _registry.NoRule(f"{name}: complex data has no distributed rule")
    c = _cov(name, x, rowvar, False, None, dtype)
    if c is None:
        raise _registry.NoRule(f"{name}: no variables")
    if c.ndim == 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            return c / c
    std = _reduced(name, np.sqrt(np.diagonal(c)))
    with np.errstate(divide="ignore", invalid="ignore"):
        c = c / std.reshape(-1, 1)
        c = c / std.reshape(1, -1)
    return np.clip(c, -1, 1)
