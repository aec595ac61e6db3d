"""Gradient clipping over DTensor gradients, as torch.nn.utils: the total norm is
one reduction of local partial norms, and the scaling is local."""

from __future__ import annotations

import math

import numpy as np

from .. import _comm
from .._dtensor import DTensor
from .._fingerprint import fingerprint
from ..placement_types import Partial, Replicate
from .module import Parameter

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _grads(parameters) -> tuple[list, list, str | None]:
    """(the gradients (DTensors) of the parameters that have one, the meshes to
    reduce over, why the gradients cannot be clipped or None). The meshes are the
    gradients' in order of first appearance, or, on a rank with no gradient, the
    first parameter's, so that such a rank still takes part in the agreement (it
    fails there unless no rank has a gradient). Nothing raises here: a problem is
    agreed on first, since it may be one rank's only."""
    if isinstance(parameters, (DTensor, Parameter, np.ndarray)):
        parameters = [parameters]
    grads, meshes, first, problem = [], [], None, None
    for p in parameters:
        if isinstance(p, Parameter):
            p = p.data
        if not isinstance(p, DTensor):
            continue
        first = p.device_mesh if first is None else first
        g = p.grad
        if g is None:
            continue
        if g.device_mesh not in meshes:
            meshes.append(g.device_mesh)
        if problem is None and any(pl.is_partial() and pl.reduce_op not in _LINEAR
                                   for pl in g.placements):
            problem = (f"cannot clip a Partial gradient ({g.placements}); "
                       f"redistribute it first")
        grads.append(g)
    return grads, meshes or ([first] if first is not None else []), problem


# Partial gradients clip by their sum (or mean): scaling each rank's addend scales it.
_LINEAR = ("sum", "avg")


def _summed(g: DTensor) -> DTensor:
    """``g`` with its Partial mesh dims reduced (Replicate there), so that its norm
    is the gradient's. Collective on ``g``'s mesh when ``g`` is Partial."""
    if not any(pl.is_partial() for pl in g.placements):
        return g
    return g.redistribute(g.device_mesh,
                          [Replicate() if pl.is_partial() else pl for pl in g.placements])


def _whole_norm_part(group: list, norm_type: float) -> float | None:
    """The total of ``group`` computed on every rank alike, when no gradient of it
    is sharded: its Partial gradients summed in one all-reduce per placement and
    dtype (their local arrays side by side), the rest read as they are; the sum
    of ``|x|**p`` or the largest ``|x|``. None when some gradient is sharded (the
    ranks then add up their shards). Collective on the group's mesh."""
    if any(pl.is_shard() for g in group for pl in g.placements):
        return None
    arrays, fused = [], {}
    for g in group:
        if any(pl.is_partial() for pl in g.placements):
            fused.setdefault((tuple(g.placements), g.dtype.str), []).append(g)
        else:
            arrays.append(g._data())
    for (pls, _), gs in fused.items():
        flat = np.concatenate([g._data().ravel() for g in gs])
        mesh = gs[0].device_mesh
        part = DTensor.from_local(flat, mesh, list(pls), shape=flat.shape, stride=(1,))
        arrays.append(_summed(part).to_local())
    if math.isinf(norm_type):
        return max((float(np.max(np.abs(a), initial=0.0)) for a in arrays), default=0.0)
    total = 0.0
    for a in arrays:
        a = np.abs(a).astype(np.float64, copy=False)
        total += float(np.sum(a * a if norm_type == 2.0 else a ** norm_type))
    return total


def _counts_here(g: DTensor) -> bool:
    """Whether this rank's shard counts in the norm, which is summed over every
    rank of the mesh: of the replicas of a shard, the one at coordinate 0 on each
    mesh dim that does not shard ``g``, so the sum counts it once."""
    coord = g.device_mesh.get_coordinate()
    return all(c == 0 for c, pl in zip(coord, g.placements) if not pl.is_shard())


def _local_part(grads: list, norm_type: float) -> float:
    """This rank's part of the total: the largest |x| for the inf-norm, else the
    sum of |x|**p over the shards it counts (float64)."""
    if math.isinf(norm_type):
        return max((float(np.max(np.abs(g._data()), initial=0.0)) for g in grads),
                   default=0.0)
    total = 0.0
    for g in grads:
        if _counts_here(g):
            a = np.abs(g._data()).astype(np.float64, copy=False)
            total += float(np.sum(a * a if norm_type == 2.0 else a ** norm_type))
    return total


def _members(mesh) -> frozenset:
    return frozenset(int(r) for r in np.asarray(mesh.mesh).ravel())


# The agreement rides in the norm's all-reduce (a sum of float64): a failure flag,
# then the 64-bit fingerprint as four 16-bit pieces and their squares. Summed over
# the n ranks of the mesh, the pieces are alike everywhere exactly when
# n * sum(c * c) == sum(c) ** 2 (Cauchy-Schwarz), and every sum is an integer below
# 2**53, so exact, for meshes of up to 2**21 ranks.
_PIECES = 4


def _check_words(ok: bool, fp: int) -> list:
    u = fp % (1 << 64)
    pieces = [float((u >> (16 * i)) & 0xFFFF) for i in range(_PIECES)]
    return [0.0 if ok else 1.0] + pieces + [c * c for c in pieces]


def _check_passed(words, n: int) -> bool:
    sums = [int(w) for w in words[1:1 + _PIECES]]
    squares = [int(w) for w in words[1 + _PIECES:]]
    return words[0] == 0 and all(n * q == s * s for s, q in zip(sums, squares))


def _reduce(mesh, values: list, op: str) -> np.ndarray:
    """``values`` reduced with ``op`` over every rank of ``mesh``: Partial on each
    mesh dim redistributed to Replicate (one all-reduce per mesh dim of more than
    one rank). Collective on the mesh; a non-member gets its own values."""
    local = np.array(values, dtype=np.float64)
    part = DTensor.from_local(local, mesh, [Partial(op)] * mesh.ndim,
                              shape=local.shape, stride=(1,))
    return part.redistribute(mesh, [Replicate()] * mesh.ndim).to_local()


def _agree_on_call(mesh, part: float, ok: bool, fp: int, problem, what: str) -> float:
    """The sum of ``part`` over the mesh, in the same all-reduce as the agreement
    that every rank passed the same call (``fp``) and none failed (``problem``):
    otherwise the same exception on every rank, the first failing rank's, through
    `_comm.agree` (which only runs then). Collective on the mesh."""
    got = _reduce(mesh, [part] + _check_words(ok, fp), "sum")
    if mesh.get_coordinate() is not None and not _check_passed(got[1:], mesh.size()):
        _comm.agree(mesh, ok, fp, problem or what, ValueError)
        raise ValueError(what)  # not reached: the agreement raised on every rank
    return float(got[0])


def _call_fingerprint(meshes: list, grads: list, max_norm, norm_type,
                      error_if_nonfinite) -> int:
    """What every rank must pass alike: the gradients' meshes, global shapes,
    dtypes and placements, in order, and the arguments."""
    where = {id(m): i for i, m in enumerate(meshes)}
    return fingerprint((
        [(np.asarray(m.mesh).tolist(), m.mesh_dim_names) for m in meshes],
        [(where[id(g.device_mesh)], tuple(g.shape), g.dtype.str, tuple(g.placements))
         for g in grads],
        repr(float(max_norm)), repr(norm_type), bool(error_if_nonfinite)))


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach=None) -> DTensor:
    """Scales the gradients in place so that their total ``norm_type``-norm (all
    gradients as one vector) is at most ``max_norm``, as torch.nn.utils's, and
    returns the total norm before scaling: a 0-d Replicate DTensor, as torch's
    for DTensor gradients.

    Each rank reduces its shards to one number (the sum of ``|x|**p``, counting a
    replicated shard once, or the largest ``|x|`` for ``inf``); the numbers are
    all-reduced over the mesh (one all-reduce of a few numbers per mesh dim of
    more than one rank; the inf-norm takes a second one for the maximum), and the
    scaling is local. The same all-reduce checks that every rank passed the same
    call: the same gradients (meshes, shapes, dtypes, placements, in order) and the
    same ``max_norm``, ``norm_type`` and ``error_if_nonfinite``; otherwise every
    rank raises the same ValueError before any gradient is scaled. Gradients on
    several meshes must share the same ranks (ValueError otherwise). With
    ``error_if_nonfinite`` a nan or inf total is a RuntimeError on every rank.
    A Partial gradient (of a sum or a mean: backward leaves a Replicate weight's
    gradient Partial over the ranks that shard the batch, as torch's) counts with
    its sum, as torch's norm reduces it, and is scaled where it is: it stays
    Partial, as torch's, for the optimizer's step to reduce. The agreement then
    comes first, in its own all-reduce; where no gradient is sharded (data
    parallelism) the Partial ones are summed in one all-reduce per placement and
    dtype, side by side, and every rank has the total: two all-reduces in all
    where torch's makes one per gradient.
    ``foreach`` is accepted for torch's signature. Parameters without a gradient
    are skipped; with none at all the result is 0.0 (a NumPy float: there is no
    mesh to put it on). Collective on the parameters' mesh.

    Example::

        >>> loss.backward()
        >>> norm = mpitensor.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        >>> float(norm)          # the norm before clipping
        3.7
    """
    grads, meshes, problem = _grads(parameters)
    try:
        norm_type = float(norm_type)
        bad_type = not (norm_type > 0 or math.isinf(norm_type)) or norm_type == -math.inf
        float(max_norm)
    except (TypeError, ValueError) as e:
        norm_type, bad_type, problem = 2.0, False, problem or f"clip_grad_norm_: {e}"
    if bad_type and problem is None:
        problem = f"clip_grad_norm_ takes a norm_type > 0 or inf, got {norm_type}"
    if not meshes:  # nothing distributed: no rank to agree with, as before
        if problem is not None:
            raise ValueError(problem)
        return np.float64(0.0)  # torch returns tensor(0.) then; no mesh to put it on
    if len({_members(m) for m in meshes}) > 1:
        raise ValueError("clip_grad_norm_: the gradients live on meshes of different "
                         "ranks, so no rank could know the total norm; clip each "
                         "mesh's parameters separately")
    fp = _call_fingerprint(meshes, grads, max_norm if problem is None else 0.0,
                           norm_type, error_if_nonfinite)
    is_inf = math.isinf(norm_type)
    mismatch = ("clip_grad_norm_: the ranks passed different gradients (their meshes, "
                "shapes, dtypes or placements, in order) or a different max_norm, "
                "norm_type or error_if_nonfinite; every rank must clip the same "
                "parameters alike")
    total = 0.0
    for mesh in meshes:
        group = [g for g in grads if g.device_mesh == mesh]
        if problem is None and any(pl.is_partial() for g in group for pl in g.placements):
            # Summing a Partial gradient moves it: the ranks agree on the call first
            # (one more all-reduce of a few numbers), so that they move the same.
            _agree_on_call(mesh, 0.0, True, fp, None, mismatch)
            if mesh.get_coordinate() is not None:
                whole = _whole_norm_part(group, norm_type)
                if whole is not None:
                    # every rank holds the whole total: no reduction of it is left
                    total = max(total, whole) if is_inf else total + whole
                    continue
            group = [_summed(g) for g in group]
        part = _local_part(group, norm_type) if problem is None else 0.0
        value = _agree_on_call(mesh, 0.0 if is_inf else part, problem is None, fp,
                               problem, mismatch)
        if mesh.get_coordinate() is None:
            # Not a member: nothing to clip here.
            return DTensor.from_local(np.array(0.0), mesh, [Replicate()] * mesh.ndim,
                                      shape=(), stride=())
        if is_inf:
            value = float(_reduce(mesh, [part], "max")[0])
        total = max(total, value) if is_inf else total + value
    if not grads:
        return np.float64(0.0)
    dtype = np.result_type(*(g.dtype for g in grads))
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
    out = grads[0].device_mesh
    return DTensor.from_local(norm, out, [Replicate()] * out.ndim, shape=(), stride=())


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    """Clips every gradient in place to ``[-clip_value, clip_value]``, as
    torch.nn.utils's. Local: each rank clips its shards.

    Example: ``mpitensor.nn.utils.clip_grad_value_(model.parameters(), 0.5)``.
    """
    v = float(clip_value)
    grads, _, problem = _grads(parameters)
    if problem is not None:
        raise ValueError(problem)
    for g in grads:
        local = g._data()
        np.clip(local, -v, v, out=local)
