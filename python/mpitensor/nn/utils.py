"""Gradient clipping over DTensor gradients, as torch.nn.utils: the total norm is
one reduction of local partial norms, and the scaling is local."""

from __future__ import annotations

import math

import numpy as np

from .._dtensor import DTensor
from ..placement_types import Partial, Replicate
from .module import Parameter

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _grads(parameters) -> list:
    """The gradients (DTensors) of the parameters that have one."""
    if isinstance(parameters, (DTensor, Parameter, np.ndarray)):
        parameters = [parameters]
    out = []
    for p in parameters:
        if isinstance(p, Parameter):
            p = p.data
        g = getattr(p, "grad", None) if isinstance(p, DTensor) else None
        if g is not None:
            if any(pl.is_partial() for pl in g.placements):
                raise ValueError(f"cannot clip a Partial gradient ({g.placements}); "
                                 f"redistribute it first")
            out.append(g)
    return out


def _reduced_dims(grads: list) -> list:
    """The mesh dims the total is reduced over: those that shard some gradient.
    Along the others every gradient is replicated, so each rank already holds the
    same total there."""
    ndim = grads[0].device_mesh.ndim
    return [m for m in range(ndim) if any(g.placements[m].is_shard() for g in grads)]


def _counts_here(g: DTensor, dims: list) -> bool:
    """Whether this rank's shard counts in the norm: of the replicas of a shard
    along the reduced mesh dims ``dims``, the one at coordinate 0, so the sum
    counts it once."""
    coord = g.device_mesh.get_coordinate()
    return all(coord[m] == 0 for m in dims if not g.placements[m].is_shard())


def _local_part(grads: list, norm_type: float, dims: list) -> float:
    """This rank's part of the total: the largest |x| for the inf-norm, else the
    sum of |x|**p over the shards it counts (float64)."""
    if math.isinf(norm_type):
        return max((float(np.max(np.abs(g._data()), initial=0.0)) for g in grads),
                   default=0.0)
    total = 0.0
    for g in grads:
        if _counts_here(g, dims):
            a = np.abs(g._data()).astype(np.float64, copy=False)
            total += float(np.sum(a * a if norm_type == 2.0 else a ** norm_type))
    return total


def _members(mesh) -> frozenset:
    return frozenset(int(r) for r in np.asarray(mesh.mesh).ravel())


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach=None) -> DTensor:
    """Scales the gradients in place so that their total ``norm_type``-norm (all
    gradients as one vector) is at most ``max_norm``, as torch.nn.utils's, and
    returns the total norm before scaling: a 0-d Replicate DTensor, as torch's
    for DTensor gradients.

    Each rank reduces its shards to one number (the sum of ``|x|**p``, counting a
    replicated shard once, or the largest ``|x|`` for ``inf``); the numbers are
    all-reduced over the mesh dims that shard some gradient (one all-reduce of
    one number per such dim, as torch reduces its Partial norm; none when every
    gradient is replicated), and the scaling is local. Gradients on several meshes must share the same ranks
    (ValueError otherwise). With ``error_if_nonfinite`` a nan or inf total is a
    RuntimeError on every rank. ``foreach`` is accepted for torch's signature.
    Parameters without a gradient are skipped; with none at all the result is
    0.0 (a NumPy float: there is no mesh to put it on). Collective on the
    gradients' mesh.

    Example::

        >>> loss.backward()
        >>> norm = mpitensor.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        >>> float(norm)          # the norm before clipping
        3.7
    """
    grads = _grads(parameters)
    norm_type = float(norm_type)
    if not (norm_type > 0 or math.isinf(norm_type)) or norm_type == -math.inf:
        raise ValueError(f"clip_grad_norm_ takes a norm_type > 0 or inf, got {norm_type}")
    if not grads:
        return np.float64(0.0)  # torch returns tensor(0.) then; no mesh to put it on
    meshes: dict = {}
    for g in grads:
        meshes.setdefault(g.device_mesh, []).append(g)
    if len({_members(m) for m in meshes}) > 1:
        raise ValueError("clip_grad_norm_: the gradients live on meshes of different "
                         "ranks, so no rank could know the total norm; clip each "
                         "mesh's parameters separately")
    dtype = np.result_type(*(g.dtype for g in grads))
    is_inf = math.isinf(norm_type)
    total = 0.0
    out = None
    for mesh, group in meshes.items():
        dims = _reduced_dims(group)
        partial = Partial("max" if is_inf else "sum")
        part = DTensor.from_local(np.array(_local_part(group, norm_type, dims)), mesh,
                                  [partial if m in dims else Replicate()
                                   for m in range(mesh.ndim)], shape=(), stride=())
        reduced = part.redistribute(mesh, [Replicate()] * mesh.ndim)
        if mesh.get_coordinate() is None:
            return reduced.astype(dtype)  # not a member: nothing to clip here
        value = float(reduced.to_local())
        total = max(total, value) if is_inf else total + value
        if out is None:
            out = mesh
    if not is_inf:
        total = total ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"the total norm of order {norm_type} for gradients is "
                           f"non-finite, so it cannot be clipped. To disable this error "
                           f"and scale the gradients by the non-finite norm anyway, set "
                           f"error_if_nonfinite=False")
    coef = min(float(max_norm) / (total + 1e-6), 1.0)  # nan stays nan, as torch's clamp
    for g in grads:
        local = g._data()
        local *= local.dtype.type(coef)
    norm = np.array(total, dtype=dtype)
    return DTensor.from_local(norm, out, [Replicate()] * out.ndim, shape=(), stride=())


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clips every gradient in place to ``[-clip_value, clip_value]``, as
    torch.nn.utils's. Local: each rank clips its shards.

    Example: ``mpitensor.nn.utils.clip_grad_value_(model.parameters(), 0.5)``.
    """
    v = float(clip_value)
    for g in _grads(parameters):
        local = g._data()
        np.clip(local, -v, v, out=local)
