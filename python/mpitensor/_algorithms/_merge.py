"""Reductions whose per-rank results merge, so that a sharded reduced axis costs
communication proportional to the result, not to the input: ``var`` and ``std``
(count, mean and M2 per rank, merged by Chan's parallel formula), ``argmax`` and
``argmin`` (a value and its global index per rank; ties go to the lowest index,
as NumPy), ``np.linalg.norm`` (partial norms: sums of powers or maxima,
reduced as Partials), and ``max``/``min`` over a shard left empty (each rank's
extreme, an empty one the dtype's identity, all-reduced at once).

Each rank reduces its local lanes, the per-rank results are all-gathered along
the mesh dims that shard a reduced axis (one all-gather of a few numbers per
output element per mesh dim), and every rank merges them in the same order, so
replicas are bit for bit equal. Kept dims keep their placements; a Partial input
is reduced first (these reductions are not linear), as torch does.
"""

from __future__ import annotations

import warnings

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .. import _registry
from .._bind import core
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Partial, Replicate, Shard
from . import _dispatch as D
from . import _lanes

__all__ = ["moment", "arg_extreme", "norm", "empty_shards", "extreme"]


def _unpartial(name, a):
    """``a`` with every Partial reduced (collective when there is one)."""
    return D.relayout(name, a,
                      [Replicate() if p.is_partial() else p for p in a._spec.placements])


def _out_dim(axes, keepdims):
    def out_dim(k):
        return k if keepdims else k - sum(1 for j in axes if j < k)
    return out_dim


def _out_spec(a, axes, keepdims, dtype):
    """The output's placements (Shards of kept dims follow them, the rest
    Replicate) and global shape."""
    spec = a._spec
    out_dim = _out_dim(axes, keepdims)
    placements = tuple(Shard(out_dim(p.dim)) if p.is_shard() and p.dim not in axes
                       else Replicate() for p in spec.placements)
    shape = tuple(1 if k in axes else n for k, n in enumerate(spec.shape)
                  if keepdims or k not in axes)
    return placements, shape


def _wrap(mesh, placements, shape, local, dtype):
    if mesh.get_coordinate() is None:
        local = D.outside_local(shape, dtype)
    local = np.asarray(local, dtype)
    return DTensor(local, DTensorSpec(mesh, placements, shape, np.dtype(dtype),
                                      contiguous_strides(shape)))


def _gather_rows(name, a, axes, gathered, rows):
    """All-gather ``rows`` (this rank's per-output-element record: the output's
    local shape without keepdims, plus one trailing record dim) along the mesh dims
    ``gathered``; returns the records of those ranks stacked on a leading dim
    (None on a rank outside the mesh, which takes no part)."""
    spec = a._spec
    mesh = spec.mesh
    if mesh.get_coordinate() is None:
        return None
    lead = len(gathered)
    out_dim = _out_dim(axes, False)
    kept_global = tuple(n for k, n in enumerate(spec.shape) if k not in axes)
    pls, dst = [], []
    for i, p in enumerate(spec.placements):
        if i in gathered:
            pls.append(Shard(gathered.index(i)))
            dst.append(Replicate())
        elif p.is_shard():
            pls.append(Shard(lead + out_dim(p.dim)))
            dst.append(pls[-1])
        else:
            pls.append(Replicate())
            dst.append(Replicate())
    shape = tuple(mesh.shape[i] for i in gathered) + kept_global + (rows.shape[-1],)
    local = rows.reshape((1,) * lead + rows.shape)
    parts = DTensor.from_local(np.ascontiguousarray(local), mesh, pls, shape=shape,
                               stride=contiguous_strides(shape))
    out = D.relayout(name, parts, dst, records=True).to_local()
    # The count of ranks is spelled out: with no kept elements the records are
    # empty, and NumPy cannot infer a -1 from a size of zero.
    return out.reshape((int(np.prod(out.shape[:lead])),) + out.shape[lead:])


def _sharded_reduced(a, axes):
    return [i for i, p in enumerate(a._spec.placements)
            if p.is_shard() and p.dim in axes]


# -- var and std ---------------------------------------------------------------------

# Elements per block when a whole real array's deviations are summed block by
# block: a block's float64 deviations stay in cache instead of becoming a temporary
# the size of the input, whose fresh pages cost as much as the arithmetic.
_BLOCK = 1 << 15


def _squared_deviations(local, mean, axes, complex_):
    """The sum over ``axes`` of |local - mean|**2, in float64 (``mean`` keeps dims)."""
    if not complex_ and len(axes) == local.ndim and local.flags.c_contiguous:
        flat, mu = local.reshape(-1), mean.reshape(())
        buf = np.empty(min(_BLOCK, flat.size), np.float64)
        m2 = 0.0
        for start in range(0, flat.size, _BLOCK):
            part = flat[start:start + _BLOCK]
            dev = buf[:part.size]
            np.subtract(part, mu, out=dev, dtype=np.float64)
            m2 += float(np.dot(dev, dev))
        return np.float64(m2)
    dev = local - mean
    if complex_:
        return np.sum(dev.real ** 2 + dev.imag ** 2, axis=axes, dtype=np.float64)
    np.multiply(dev, dev, out=dev)
    return np.sum(dev, axis=axes, dtype=np.float64)

def moment(name, a, axis, dtype, ddof, keepdims, root):
    """numpy.var (``root`` False) or numpy.std (True) of a DTensor. Local when no
    mesh dim shards a reduced axis (and no Partial), else one all-gather of
    (count, mean, M2) per output element along the mesh dims that do.

    Example: ``moment("numpy.var", dt, None, None, 0, False, False)`` is ``np.var(dt)``.
    """
    func = np.std if root else np.var
    a = _unpartial(name, a)
    spec = a._spec
    mesh = spec.mesh
    axes = tuple(range(len(spec.shape))) if axis is None else normalize_axis_tuple(
        axis, len(spec.shape))
    out_dtype = func(np.zeros((1,), spec.dtype), dtype=dtype).dtype
    placements, shape = _out_spec(a, axes, keepdims, out_dtype)
    gathered = _sharded_reduced(a, axes)
    member = mesh.get_coordinate() is not None
    if not gathered:
        local = (func(a.to_local(), axis=axes, dtype=dtype, ddof=ddof, keepdims=keepdims)
                 if member else None)
        return _wrap(mesh, placements, shape, local, out_dtype)
    local = a.to_local()
    complex_ = np.dtype(out_dtype if dtype is None else dtype).kind == "c" or \
        spec.dtype.kind == "c"
    work = np.complex128 if complex_ else np.float64
    kept_local = tuple(n for k, n in enumerate(local.shape) if k not in axes) \
        if member else ()
    count = int(np.prod([local.shape[k] for k in axes])) if member else 0
    if count:
        mean = np.mean(local, axis=axes, dtype=work, keepdims=True)
        m2 = _squared_deviations(local, mean, axes, complex_)
        mean = mean.reshape(kept_local)
    else:
        mean = np.zeros(kept_local, work)
        m2 = np.zeros(kept_local, np.float64)
    fields = [np.full(kept_local, float(count)), mean.real, m2]
    if complex_:
        fields.insert(2, mean.imag)
    rows = np.stack([np.asarray(f, np.float64) for f in fields], axis=-1)
    parts = _gather_rows(name, a, axes, gathered, rows)
    if not member:
        return _wrap(mesh, placements, shape, None, out_dtype)
    n, mu, m2 = parts[0, ..., 0], parts[0, ..., 1], parts[0, ..., -1]
    if complex_:
        mu = mu + 1j * parts[0, ..., 2]
    for r in range(1, parts.shape[0]):
        nb, m2b = parts[r, ..., 0], parts[r, ..., -1]
        mb = parts[r, ..., 1] + (1j * parts[r, ..., 2] if complex_ else 0)
        total = n + nb
        safe = np.where(total == 0, 1.0, total)
        delta = mb - mu
        mu = mu + delta * (nb / safe)
        m2 = m2 + m2b + (delta.real ** 2 + delta.imag ** 2 if complex_ else delta * delta) \
            * (n * nb / safe)
        n = total
    with np.errstate(divide="ignore", invalid="ignore"):
        result = m2 / np.maximum(n - ddof, 0)
    if np.any(n - ddof <= 0):
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
    if root:
        result = np.sqrt(result)
    if keepdims:
        result = result.reshape(tuple(1 if k in axes else n_ for k, n_ in
                                      enumerate(local.shape)))
    return _wrap(mesh, placements, shape, result.astype(out_dtype), out_dtype)


# -- argmax and argmin -----------------------------------------------------------------

def arg_extreme(name, a, axis, keepdims, largest):
    """numpy.argmax (``largest``) or numpy.argmin of a DTensor: local when the axis
    is not sharded, else one all-gather of (value, global index) per output
    element along the mesh dims that shard it; ties and NaNs go to the lowest
    index, as NumPy.

    Example: ``arg_extreme("numpy.argmax", dt, 0, False, True)`` is ``np.argmax(dt, 0)``.
    """
    func = np.argmax if largest else np.argmin
    if axis is not None and not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{name}: axis must be an int or None, got {axis!r}")
    a = _unpartial(name, a)
    spec = a._spec
    mesh = spec.mesh
    ndim = len(spec.shape)
    axes = tuple(range(ndim)) if axis is None else normalize_axis_tuple(int(axis), ndim)
    if int(np.prod([spec.shape[k] for k in axes])) == 0:
        raise ValueError(f"attempt to get {name[6:]} of an empty sequence")
    placements, shape = _out_spec(a, axes, keepdims, np.intp)
    gathered = _sharded_reduced(a, axes)
    member = mesh.get_coordinate() is not None
    if not gathered:
        local = None
        if member and axis is None:
            local = func(a.to_local(), keepdims=keepdims)
        elif member:
            local = _lanes.arg_extreme(a.to_local(), axes[0], largest)[0]
            local = local if keepdims else np.squeeze(local, axes[0])
        return _wrap(mesh, placements, shape, local, np.intp)
    local = a.to_local()
    if member:
        _, offset = compute_local_shape_and_global_offset(spec.shape, mesh,
                                                          spec.placements)
        flat = local.reshape(-1) if axis is None else local
        lanes = flat.shape[0 if axis is None else axes[0]]
        if lanes:
            idx, value = _lanes.arg_extreme(flat, 0 if axis is None else axes[0], largest)
            if axis is None:
                where = np.unravel_index(int(idx[0]), local.shape)
                gidx = np.ravel_multi_index(tuple(int(w) + o for w, o in
                                                  zip(where, offset)), spec.shape)
                gidx = np.array([gidx], np.int64)
                value = value.reshape(())
                gidx = gidx.reshape(())
            else:
                gidx = (idx + offset[axes[0]]).astype(np.int64)
                value = np.squeeze(value, axes[0])
                gidx = np.squeeze(gidx, axes[0])
        else:
            kept = tuple(n for k, n in enumerate(local.shape) if k not in axes)
            value = np.zeros(kept, spec.dtype)
            gidx = np.full(kept, -1, np.int64)
    else:
        value = np.zeros((), spec.dtype)
        gidx = np.full((), -1, np.int64)
    isz = spec.dtype.itemsize
    rows = np.concatenate([
        np.ascontiguousarray(value).view(np.uint8).reshape(value.shape + (isz,)),
        np.ascontiguousarray(gidx).view(np.uint8).reshape(gidx.shape + (8,))], axis=-1)
    parts = _gather_rows(name, a, axes, gathered, rows)
    if not member:
        return _wrap(mesh, placements, shape, None, np.intp)
    values = np.ascontiguousarray(parts[..., :isz]).view(spec.dtype)[..., 0]
    index = np.ascontiguousarray(parts[..., isz:]).view(np.int64)[..., 0]
    # Candidates in global-index order (ranks whose lanes are empty last, given the
    # first candidate's value so that they never win): the first extreme wins.
    key = np.where(index < 0, np.iinfo(np.int64).max, index)
    order = np.argsort(key, axis=0, kind="stable")
    index = np.take_along_axis(index, order, 0)
    values = np.take_along_axis(values, order, 0)
    values = np.where(index < 0, values[:1], values)
    pick = func(values, axis=0, keepdims=True)
    result = np.take_along_axis(index, pick, 0)[0].astype(np.intp)
    if keepdims:
        result = result.reshape(tuple(1 if k in axes else n for k, n in
                                      enumerate(local.shape)))
    return _wrap(mesh, placements, shape, result, np.intp)


# -- norm ----------------------------------------------------------------------------

def norm(x, ord=None, axis=None, keepdims=False):
    """numpy.linalg.norm of a DTensor by partial norms: a sharded reduced axis gives
    a Partial (a sum of powers, or a maximum) that is reduced at the size of the
    result. Vector norms (ord None, inf, -inf, 0, 1, any p) and the matrix norms
    'fro', 1, -1, inf, -inf; 'nuc', 2 and -2 need singular values and are a
    TypeError. Collective on the mesh when a reduced axis is sharded.

    Example: ``np.linalg.norm(dt)`` of a ``[Shard(0)]`` DTensor all-reduces one number.
    """
    name = "numpy.linalg.norm"
    if type(x) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(x).__name__}")
    if x.dtype.kind not in "fc":
        x = x.astype(np.float64)
    nd = x.ndim
    if axis is None:
        if ord is None or (ord in ("fro", "f") and nd == 2):
            axes = tuple(range(nd))
            return np.sqrt(np.sum(_abs2(x), axis=axes, keepdims=keepdims))
        if nd == 1:
            axes = (0,)
        elif nd == 2:
            axes = (0, 1)
        else:
            raise ValueError("Improper number of dimensions to norm.")
    else:
        axes = normalize_axis_tuple(axis, nd)
    if len(axes) == 1:
        ax = axes[0]
        if ord is None or ord == 2:
            return np.sqrt(np.sum(_abs2(x), axis=ax, keepdims=keepdims))
        if isinstance(ord, str):
            raise ValueError(f"Invalid norm order '{ord}' for vectors")
        if ord == np.inf:
            return _max_from_zero(np.abs(x), ax, keepdims)
        if ord == -np.inf:
            return np.min(np.abs(x), axis=ax, keepdims=keepdims)
        if ord == 0:
            return np.sum((x != 0).astype(x.real.dtype if x.dtype.kind == "c"
                                           else x.dtype), axis=ax, keepdims=keepdims)
        if ord == 1:
            return np.sum(np.abs(x), axis=ax, keepdims=keepdims)
        p = float(ord)
        return np.sum(np.abs(x) ** p, axis=ax, keepdims=keepdims) ** (1.0 / p)
    if len(axes) != 2:
        raise ValueError("Improper number of dimensions to norm.")
    row, col = axes
    if ord is None or ord in ("fro", "f"):
        return np.sqrt(np.sum(_abs2(x), axis=axes, keepdims=keepdims))
    if ord in (1, -1, np.inf, -np.inf):
        inner, outer = (row, col) if ord in (1, -1) else (col, row)
        sums = np.sum(np.abs(x), axis=inner, keepdims=True)
        out = (_max_from_zero(sums, outer, True) if ord > 0
               else np.min(sums, axis=outer, keepdims=True))
        if not keepdims:
            out = out.reshape(tuple(n for k, n in enumerate(out.shape) if k not in axes))
        return out
    if ord not in (2, -2, "nuc"):
        raise ValueError("Invalid norm order for matrices.")
    raise _registry.NoRule(f"{name}: ord={ord!r} needs singular values and has no sharding "
                           f"rule for DTensors; call .full_tensor() and numpy.linalg.norm")


def _norms_start_from_zero() -> bool:
    """Whether this NumPy's norms take their maxima from zero, so that an empty
    axis gives zeros (recent NumPy), rather than raising its zero-size error."""
    try:
        np.linalg.norm(np.zeros(0), np.inf)
    except ValueError:
        return False
    return True


_FROM_ZERO = _norms_start_from_zero()


def _max_from_zero(x, axis, keepdims):
    """The maximum of the non-negative ``x`` along ``axis``, starting from zero
    where NumPy's norms do: an empty axis gives zeros, which is then its sum."""
    if _FROM_ZERO and x.shape[axis] == 0:
        return np.sum(x, axis=axis, keepdims=keepdims)
    return np.max(x, axis=axis, keepdims=keepdims)


def _abs2(x):
    if x.dtype.kind == "c":
        x = np.abs(x)
    return x * x


# -- max and min over empty shards ---------------------------------------------------

def empty_shards(spec, axes) -> list:
    """The mesh dims whose Shard of a reduced axis leaves some rank's shard empty
    (torch.chunk's rule: 2 over 3 ranks is 1, 1, 0; nested shards cut each piece
    again). The same on every rank: only the global shape counts.

    Example: ``empty_shards(spec_of_2_rows_over_3_ranks, (0,)) == [0]``.
    """
    sizes = {d: {n} for d, n in enumerate(spec.shape)}
    found = []
    for m, p in enumerate(spec.placements):
        if not p.is_shard():
            continue
        cut = set()
        for n in sizes[p.dim]:
            cut.update(core.chunk_sizes(n, spec.mesh.shape[m]))
        sizes[p.dim] = cut
        if p.dim in axes and 0 in cut:
            found.append(m)
    return found


def extreme(name, a, axes, keepdims, largest):
    """numpy.max (``largest``) or numpy.min of a Shard/Replicate DTensor whose
    reduced axis leaves a shard empty: each rank reduces its lanes, an empty one
    giving the dtype's identity (-inf or the lowest int for max), and the mesh dims
    that shard a reduced axis all-reduce the output at once (one all-reduce of the
    output's size), so that the identity, which later arithmetic on a kept Partial
    could turn into a value (``-inf + inf``, an int that wraps), never leaves the
    call. A reduced axis of size 0 raises NumPy's ValueError on every rank.

    Example: ``extreme("numpy.max", dt, (0,), False, True)`` is ``np.max(dt, axis=0)``.
    """
    spec = a._spec
    mesh = spec.mesh
    ufunc = np.maximum if largest else np.minimum
    if any(spec.shape[k] == 0 for k in axes):
        raise ValueError(f"zero-size array to reduction operation {ufunc.__name__} which "
                         f"has no identity")
    dtype = spec.dtype
    placements, shape = _out_spec(a, axes, keepdims, dtype)
    reduced = _sharded_reduced(a, axes)
    partial = Partial("max" if largest else "min")
    pending = tuple(partial if i in reduced else p for i, p in enumerate(placements))
    local = None
    if mesh.get_coordinate() is not None:
        x = a.to_local()
        if any(x.shape[k] == 0 for k in axes):
            info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
            ident = (-np.inf if largest else np.inf) if dtype.kind == "f" else (
                info.min if largest else info.max)
            local = ufunc.reduce(x, axis=axes, keepdims=keepdims, initial=ident)
        else:
            local = ufunc.reduce(x, axis=axes, keepdims=keepdims)
    return D.relayout(name, _wrap(mesh, pending, shape, local, dtype), placements)
