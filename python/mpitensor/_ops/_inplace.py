"""Writes into DTensors: ``dt[key] = value``, ``np.copyto(dt, src, where=)``,
``dt.fill(v)``, and the rule every in-place form shares (the operators' ``out=``
is in _elementwise.py).

A write never changes the destination's placements, but for the Partials it
resolves first (below). Each rank writes the part of
the region its local box holds, so what moves is only what the value needs there:
a scalar or a plain ndarray (which every rank holds, as under implicit
replication) moves nothing; a DTensor value is redistributed to follow the
destination (a Shard of a dim the region keeps whole stays a Shard of that dim,
everything else is Replicate), so an aligned value moves nothing either. Where a
slice cuts a dim one mesh dim shards (``x[2:7] = y``, ``x`` ``Shard(0)``) and the
value is sharded along those rows there, one all-to-all of variable parts sends
each row to the rank that holds it instead: no rank receives rows it does not
write (torch makes the value Replicate there, a gather).

A Partial destination holds each element as the reduction of the ranks' locals,
so a written element must reduce to the value: for Partial(sum) the first rank of
the mesh dim writes the value and the others 0 (1 for a product); for max and min
every rank writes it; a value that is Partial with the destination's op is
written as its own locals. No locals reduce exactly to any other value written
into Partial(avg) (the mean of P copies of a float is not always that float), nor
into Partials of different ops (their order would decide the value): such a
destination is resolved first, in place (:func:`_resolve`: redistributed to
Replicate on those mesh dims, one counted redistribute, whose result becomes its
spec and fills its own memory), then written as any. A write with an operand
that requires grad in grad mode is a RuntimeError (mpitensor.autograd refuses it
before the write: the tape records no writes). Into a view that basic indexing
made, each of these writes reaches its base (_views.write).
"""

from __future__ import annotations

import operator

import numpy as np

from .. import _comm, _modes, _registry, _trace
from .._bind import core
from .._dtensor import DTensor
from .._layout import local_shape_and_global_offset
from ..placement_types import Partial, Replicate, Shard, _StridedShard
from .._algorithms import _advanced_index as A
from .._algorithms import _dispatch as D
from .._algorithms import _views
from ._indexing import WHOLE, _parse, _whole, agree_write, local_cuts, write_number

_IDENTITY = {"sum": 0, "product": 1}


def _free_partials(dst, value) -> list:
    """The destination's Partial mesh dims on which ``value`` is not the same
    Partial (a value that is writes its own locals there). Local."""
    vpl = (value._spec.placements if type(value) is DTensor
           and len(value._spec.placements) == len(dst._spec.placements) else ())
    return [m for m, p in enumerate(dst._spec.placements)
            if isinstance(p, Partial) and (m >= len(vpl) or vpl[m] != p)]


def _partial_op(dst, value=None):
    """The reduce op of the destination's Partial mesh dims that ``value`` does not
    share (None when there are none): one op, once :func:`_resolve` has run."""
    ops = {dst._spec.placements[m].reduce_op for m in _free_partials(dst, value)}
    if len(ops) > 1:  # _resolve reduces these first
        raise ValueError(f"cannot write into a DTensor with Partials of different "
                         f"reduce ops {dst._spec.placements}; redistribute it first")
    return next(iter(ops), None)


def _resolve(name, dst, value=None) -> None:
    """Makes ``dst`` writable exactly before ``value`` is written into it: where no
    locals would reduce to the value, on its Partial(avg) mesh dims (the mean of
    copies of a float is not always that float) and, where its Partials' ops
    differ, on all of them (their order would decide the value), except those
    ``value`` shares, ``dst`` is redistributed to Replicate (counted as any
    redistribute) and takes the result in place: its spec is the result's, and
    its own memory, through the one write door (``copyto``), holds the result's
    local array, so that what shares that memory (a NumPy view of it, the
    DTensor a basic index viewed) sees the write that follows. An int
    Partial(avg), which has no value to resolve to, raises redistribute's
    TypeError on every rank. Collective on the mesh when there is such a dim,
    else local.

    Example: ``_resolve("numpy.copyto", dst, src)`` before ``dst``'s write.
    """
    spec = dst._spec
    free = _free_partials(dst, value)
    ops = {spec.placements[m].reduce_op for m in free}
    bad = [m for m in free if spec.placements[m].reduce_op == "avg" or len(ops) > 1]
    if not bad:
        return
    resolved = D.relayout(name, dst, [Replicate() if m in bad else p
                                      for m, p in enumerate(spec.placements)])
    dst._spec = resolved._spec
    undo = _views.layout_changed(dst, spec)
    try:
        copyto(dst, resolved, casting="no")
    except BaseException:
        dst._spec = spec  # nothing was written: a read-only destination stays whole
        undo()
        raise


def _writes_identity(dst, kept) -> bool:
    """Whether this rank writes the identity of the destination's Partial instead of
    the value: it is not the first rank of some Partial(sum|product) mesh dim on
    which the value is not itself Partial (``kept``: those mesh dims)."""
    coord = dst._spec.mesh._coordinate
    for m, p in enumerate(dst._spec.placements):
        if (isinstance(p, Partial) and p.reduce_op in _IDENTITY and m not in kept
                and coord[m] != 0):
            return True
    return False


def follow(dst_spec, dims, value):
    """The placements a DTensor ``value`` takes to be written into ``dst_spec``'s
    region: per mesh dim, a Shard of a destination dim d whose region is whole and
    that the value holds whole on its dim ``dims[d]`` (None: not held) stays a Shard
    there; a Partial of the destination's op stays; anything else is Replicate. A
    value of a strided destination's shape takes its strided placements, so that
    both local arrays hold the same elements in the same order. Local.

    Example: ``follow(a._spec, {0: 0, 1: 1}, b)`` is ``a``'s placements for a ``b``
    of ``a``'s shape.
    """
    out = []
    whole = value._spec.shape == dst_spec.shape and all(
        dims.get(d) == d for d in range(len(dst_spec.shape)))
    for p, vp in zip(dst_spec.placements, value._spec.placements):
        if type(p) is _StridedShard and whole:
            out.append(p)
        elif isinstance(p, Shard) and dims.get(p.dim) is not None:
            out.append(Shard(dims[p.dim]))
        elif isinstance(p, Partial) and vp == p:
            out.append(p)
        else:
            out.append(Replicate())
    return tuple(out)


def _value_dims(dst_shape, value_shape, region_dims):
    """Destination dim -> the value's dim that holds it whole (broadcasting aligns
    the value with the region's dims from the right); ``region_dims`` lists, per
    region dim, the destination dim it is (None for a new axis)."""
    lead = len(region_dims) - len(value_shape)
    dims = {}
    for j, d in enumerate(region_dims):
        v = j - lead
        if d is not None and v >= 0 and value_shape[v] == dst_shape[d]:
            dims[d] = v
    return dims


def _broadcast_check(what, value_shape, shape):
    try:
        ok = np.broadcast_shapes(tuple(value_shape), tuple(shape)) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{what}: could not broadcast input array from shape "
                         f"{tuple(value_shape)} into shape {tuple(shape)}")


def _as_value(name, value, mesh):
    """A DTensor value checked to live on ``mesh``, else an ndarray or scalar."""
    if type(value) is DTensor:
        if value._spec.mesh is not mesh and value._spec.mesh != mesh:
            raise ValueError(f"{name}: the value lives on another device mesh "
                             f"({value._spec.mesh} and {mesh}); redistribute it first")
        return value
    return value if D.is_scalar(value) else np.asarray(value)


def _cut_rows(spec, sel, region_dims, vplacements, vshape):
    """(mesh dim m, value dim j) when the rows a DTensor value writes can go straight
    to their owners: one mesh dim (of several ranks) shards the destination dim d a
    slice cuts, no other shards d, the value's dim j spans that slice's rows (not
    broadcast), and the value is ``Shard(j)`` on m: each row then moves at most
    once, fewer bytes than the all-gather of torch's layout for the slice
    (Replicate on m), which every other layout of the value gets, as before (a
    Replicate value then moves nothing). The same on every rank: only global
    shapes and placements count."""
    mesh = spec.mesh
    lead = len(region_dims) - len(vshape)
    found = None
    for m, p in enumerate(spec.placements):
        if not isinstance(p, Shard) or mesh.shape[m] == 1 or _whole(sel[p.dim],
                                                                   spec.shape[p.dim]):
            continue
        start, step, count, is_int = sel[p.dim]
        j = region_dims.index(p.dim) - lead if p.dim in region_dims else -1
        others = [q for k, q in enumerate(spec.placements) if k != m and q == p]
        if (found is not None or is_int or count == 0 or others or j < 0
                or vshape[j] != count or vplacements[m] != Shard(j)):
            return None
        found = (m, j)
    return found


def _rows_to_owners(spec, sel, value, m, j):
    """This rank's rows of the region along value dim ``j``, from a value sharded
    ``Shard(j)`` on mesh dim ``m`` (torch.chunk's pieces of the region's rows):
    one all-to-all of variable parts along ``m`` sends each row once, to the rank
    whose shard of the destination holds it. Collective on mesh dim ``m``."""
    mesh = spec.mesh
    p, c = mesh.shape[m], mesh._coordinate[m]
    d = spec.placements[m].dim
    count = sel[d][2]
    own = np.concatenate([[0], np.cumsum(core.chunk_sizes(spec.shape[d], p))])
    have = np.concatenate([[0], np.cumsum(core.chunk_sizes(count, p))])
    lo, hi = int(have[c]), int(have[c + 1])
    v = np.moveaxis(value.to_local(), j, 0)
    parts = []
    for r in range(p):
        # Rank r's rows of the region are consecutive; with a negative step the
        # later ranks hold the earlier rows, so each part is cut by its owner.
        (k0, k1), = core.selection_image((sel[d],), (int(own[r]),),
                                           (int(own[r + 1] - own[r]),))
        a, b = max(k0, lo), min(k1, hi)
        parts.append(v[a - lo:b - lo] if b > a else v[:0])
    send = np.ascontiguousarray(np.concatenate(parts))
    if _modes.tracing:
        _trace.collective("DTensor item assignment: rows to their owners", mesh,
                          spec.placements, spec.shape, spec.dtype)
    got, _ = _comm.alltoallv(mesh, send, [len(x) for x in parts], m)
    # Received by source rank: the sources' pieces are in row order, so are these.
    return np.moveaxis(got, 0, j)


@_registry.implements(operator.setitem)
def setitem(dt, key, value, *, where=None) -> None:
    """``dt[key] = value`` for a basic key (ints, slices, None, ...) or a boolean
    mask (a DTensor or ndarray of ``dt``'s shape, with a scalar value); placements
    kept. ``where`` (a DTensor ``value`` and a basic key only): a boolean array of
    the value's local shape, the elements of it to write, as a copy-view writes
    back into its base (_views.py). Into a view that basic indexing made, the
    write reaches the base. Collective on the mesh: the write is agreed first
    (_indexing.agree_write), and a DTensor value or mask moves where it must
    follow ``dt``'s layout."""
    if where is None and write_number(dt, key, value):
        return
    if where is None:  # a copy-view's write-back is made alike on every rank
        agree_write(dt, key, value)
    spec = dt._spec
    mesh = spec.mesh
    mask = key if type(key) is DTensor or (isinstance(key, np.ndarray)
                                            and key.dtype == bool and key.ndim > 0) else None
    if mask is not None:
        _mask_write(dt, mask, value)
        return
    taken = _taken_rows(key, spec)
    if taken is not None:
        _write_taken(dt, *taken, value)
        return
    sel, outdims = _parse(key, spec.shape)
    region = tuple(1 if o[0] == "new" else sel[o[1]][2] for o in outdims)
    region_dims = [None if o[0] == "new" else o[1] for o in outdims]
    value = _as_value("DTensor item assignment", value, mesh)
    vshape = value.shape if type(value) is DTensor else np.shape(value)
    _broadcast_check("DTensor item assignment", vshape, region)
    _resolve("DTensor item assignment", dt, value)
    spec = dt._spec
    op = _partial_op(dt, value)
    kept = set()
    followed = {}
    rows = None
    if type(value) is DTensor:
        dims = {d: v for d, v in _value_dims(spec.shape, vshape, region_dims).items()
                if _whole(sel[d], spec.shape[d])}
        target = follow(spec, dims, value)
        kept = {m for m, p in enumerate(target) if isinstance(p, Partial)}
        followed = {p.dim for p in target if isinstance(p, (Shard, _StridedShard))}  # the value's dims
        rows = _cut_rows(spec, sel, region_dims, value._spec.placements, vshape)
        if rows is not None:
            m, j = rows
            target = target[:m] + (value._spec.placements[m],) + target[m + 1:]
            followed.add(j)
        moved = D.relayout("DTensor item assignment", value, target)
        if where is not None and (moved is not value or rows is not None):
            raise ValueError("DTensor item assignment: where= needs a value laid out "
                             "as the destination wants it")
        value = moved
    if mesh._coordinate is None:
        return
    lshape, loff = local_shape_and_global_offset(spec.shape, mesh.shape,
                                                 mesh._coordinate, spec.placements)
    local_key, cuts = local_cuts(sel, loff, lshape)
    target_shape = tuple(k1 - k0 for k0, k1 in cuts)
    region_local = tuple(1 if d is None else cuts[d][1] - cuts[d][0] for d in region_dims)
    dest = dt.to_local()
    local_key = tuple(local_key)
    pick = None  # the elements of dest[local_key] to write, when not all
    if _writes_identity(dt, kept):
        piece = _IDENTITY[op]
    elif type(value) is DTensor:
        v = value.to_local() if rows is None else _rows_to_owners(spec, sel, value, *rows)
        lead = len(region) - len(vshape)
        piece = _fit(v, region, region_dims, cuts, followed, lead, region_local, target_shape)
        if where is not None:
            pick = _fit(where, region, region_dims, cuts, followed, lead, region_local,
                        target_shape)
    elif isinstance(value, np.ndarray) and value.ndim > 0:
        piece = _fit(value, region, region_dims, cuts, (), None, region_local, target_shape)
    else:
        piece = value
    _views.write(dt, lambda: _assign(dest, local_key, piece, pick), local_key, pick)


def _taken_rows(key, spec):
    """(dim, indices) of a key that reads rows of one dim as np.take does (one
    list or 1-D integer array, as the reads' rule finds it, with whole slices
    elsewhere: xarray's label writes give such keys), into a DTensor of Shards and
    Replicates; the indices normalised and checked as NumPy checks them. None for
    any other key. Local."""
    if A.is_advanced(key) == "take":
        at, idx = 0, key
    else:
        one = A.one_array(key, len(spec.shape))
        if one is None or one[3] is not None or not all(
                type(k) is slice and k == WHOLE for k in one[2]):
            return None
        at, idx = one[0], one[1]
    for p in spec.placements:
        if type(p) not in (Shard, Replicate):
            return None
    size = spec.shape[at]
    idx = np.asarray(idx).astype(np.intp)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise IndexError(f"index {int(idx[bad][0])} is out of bounds for axis {at} with "
                         f"size {size}")
    return at, np.where(idx < 0, idx + size, idx)


def _write_taken(dt, d, idx, value):
    """``dt[..., idx, ...] = value`` (:func:`_taken_rows`'s key) for a scalar or an
    ndarray every rank holds: each rank writes the listed rows its block holds,
    later ones last as NumPy writes repeated indices. Nothing moves; agreed by the
    caller."""
    if type(value) is DTensor:
        raise _registry.NoRule("DTensor item assignment: a DTensor value with an "
                               "integer array key")
    spec = dt._spec
    region = spec.shape[:d] + (len(idx),) + spec.shape[d + 1:]
    _broadcast_check("DTensor item assignment", np.shape(value), region)
    mesh = spec.mesh
    if mesh._coordinate is None:
        return
    lshape, loff = local_shape_and_global_offset(spec.shape, mesh.shape,
                                                 mesh._coordinate, spec.placements)
    mine = (idx >= loff[d]) & (idx < loff[d] + lshape[d])
    local_key = (slice(None),) * d + (idx[mine] - loff[d],)
    piece = value
    if np.ndim(value):
        cut = tuple(mine if e == d else slice(loff[e], loff[e] + lshape[e])
                    for e in range(len(spec.shape)))
        piece = np.broadcast_to(value, region)[cut]
    dest = dt.to_local()
    where = None
    if not dest.flags.writeable:  # a copy-view: the written elements go back to its base
        where = np.zeros(dest.shape, bool)
        where[local_key] = True
    _views.write(dt, lambda: dest.__setitem__(local_key, piece),
                 Ellipsis if where is not None else local_key, where)


def _fit(v, region, region_dims, cuts, followed, lead, region_local, target_shape):
    """This rank's part of the value ``v`` (a local array, or a plain one every rank
    holds when ``lead`` is None) for the local region ``cuts``: the dims the value
    spans cut to this rank's rows, except those it already holds as the
    destination (``followed``) and broadcast ones, then broadcast and shaped as
    the local target."""
    v = v.reshape((1,) * (len(region) - v.ndim) + v.shape)
    idx = []
    for j, d in enumerate(region_dims):
        if v.shape[j] == 1 or d is None or (lead is not None and (j - lead) in followed):
            idx.append(slice(None))
        else:
            idx.append(slice(*cuts[d]))
    piece = v[tuple(idx)]
    if 0 in target_shape:  # an int index this rank does not hold: nothing to write
        return np.empty(target_shape, piece.dtype)
    return np.broadcast_to(piece, region_local).reshape(target_shape)


def _assign(dest, key, piece, pick) -> None:
    if pick is None:
        dest[key] = piece
    else:
        np.copyto(dest[key], piece, casting="unsafe", where=pick)


def _local_operand(name, dst, obj):
    """This rank's part of ``obj`` (scalar, ndarray or DTensor broadcastable to
    ``dst``) over ``dst``'s local box, and the Partial mesh dims it keeps.
    Collective on the mesh when a DTensor must move to follow ``dst``."""
    spec = dst._spec
    mesh = spec.mesh
    if type(obj) is not DTensor:
        obj = obj if D.is_scalar(obj) else np.asarray(obj)
    _broadcast_check(name, obj.shape if type(obj) is DTensor else np.shape(obj), spec.shape)
    kept = set()
    if type(obj) is DTensor:
        _as_value(name, obj, mesh)
        dims = _value_dims(spec.shape, obj.shape, list(range(len(spec.shape))))
        target = follow(spec, dims, obj)
        kept = {m for m, p in enumerate(target) if isinstance(p, Partial)}
        obj = D.relayout(name, obj, target)
        if mesh._coordinate is None:
            return None, kept
        v = obj.to_local()
        v = v.reshape((1,) * (len(spec.shape) - v.ndim) + v.shape)
        lshape, loff = local_shape_and_global_offset(spec.shape, mesh.shape,
                                                     mesh._coordinate, spec.placements)
        followed = {p.dim for p in target if isinstance(p, (Shard, _StridedShard))}
        lead = len(spec.shape) - obj.ndim
        idx = tuple(slice(None) if v.shape[d] == 1 or (d - lead) in followed
                    else slice(loff[d], loff[d] + lshape[d]) for d in range(v.ndim))
        return np.broadcast_to(v[idx], lshape), kept
    if mesh._coordinate is None or D.is_scalar(obj) or obj.ndim == 0:
        return obj, kept
    lshape, loff = local_shape_and_global_offset(spec.shape, mesh.shape,
                                                 mesh._coordinate, spec.placements)
    v = obj.reshape((1,) * (len(spec.shape) - obj.ndim) + obj.shape)
    idx = tuple(slice(None) if v.shape[d] == 1 else slice(loff[d], loff[d] + lshape[d])
                for d in range(v.ndim))
    return np.broadcast_to(v[idx], lshape), kept


def _mask_write(dt, mask, value):
    name = "DTensor item assignment with a boolean mask"
    if type(value) is DTensor and value.ndim == 0:
        # A 0-d array is a scalar (the array API standard writes scalars so); a
        # Partial one is reduced, as every rank needs its value.
        value = value.full_tensor()[()]
    if np.dtype(mask.dtype) != np.bool_:
        raise IndexError(f"{name}: the mask must be a boolean array of the DTensor's "
                         f"shape {dt.shape}, not {mask.dtype} of shape {mask.shape}")
    scalar = type(value) is not DTensor and D.is_scalar(value)
    if mask.shape != dt.shape:
        if mask.shape != dt.shape[:mask.ndim]:
            # NumPy's IndexError, on the gathered arrays
            raise _registry.NoRule(f"{name}: a mask of shape {mask.shape} into "
                                   f"{dt.shape} has no distributed rule")
        if not scalar:
            value = _mask_rows(dt, mask, value)
            if value is None:
                return
            scalar = D.is_scalar(value)
        # A mask of the leading dims selects whole rows: the same mask, widened.
        mask = np.broadcast_to(mask.reshape(mask.shape + (1,) * (dt.ndim - mask.ndim)),
                               dt.shape)
        if not scalar:
            np.copyto(dt, value, casting="unsafe", where=mask)
            return
    if not scalar:
        value = _mask_values(name, dt, mask, value)
        if value is None:
            return
    local_mask, _ = _local_operand(name, dt, mask)
    _resolve(name, dt)
    op = _partial_op(dt)
    if dt._spec.mesh._coordinate is None:
        return
    dest = dt.to_local()
    value = _IDENTITY[op] if _writes_identity(dt, set()) else value
    _views.write(dt, lambda: dest.__setitem__(local_mask, value), where=local_mask)


def _mask_rows(dt, mask, values):
    """``dt[mask] = values`` for a mask of ``dt``'s leading dims, which picks whole
    rows: what to write under the widened mask. Values of one row per True go to
    the Trues in C order, as NumPy's assignment puts them (each True's position is
    a scan of the mask, and np.take brings its row: an array of ``dt``'s leading
    shape and the row's); values that broadcast to every row are written as they
    are. None when there is nothing to write. NumPy's ValueError for values of
    another shape. Collective on the mesh."""
    mesh = dt.device_mesh
    if type(values) is not DTensor:
        values = np.asarray(values)  # a list of rows, as NumPy takes it
    rest = tuple(dt.shape[mask.ndim:])
    count = int(np.count_nonzero(mask))
    vshape = tuple(np.shape(values))
    picked = (count,) + rest
    ones = 0  # NumPy drops the value's extra leading dims of one
    while len(vshape) - ones > len(picked) and vshape[ones] == 1:
        ones += 1
    try:
        fits = np.broadcast_shapes(vshape[ones:], picked) == picked
    except ValueError:
        fits = False
    if not fits:
        def text(shape):
            return "(" + ",".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"shape mismatch: value array of shape {text(vshape)} could not "
                         f"be broadcast to indexing result of shape {text(picked)}")
    if count == 0:
        return None
    if ones:
        values = values.reshape(vshape[ones:])
        vshape = vshape[ones:]
    if len(vshape) <= len(rest) or vshape[0] == 1:
        # the same row for every True
        return values.reshape(vshape[1:]) if len(vshape) > len(rest) else values
    if type(values) is not DTensor:
        values = DTensor.from_local(values, mesh, [Replicate()] * mesh.ndim)
    if type(mask) is not DTensor:
        mask = DTensor.from_local(np.asarray(mask), mesh, [Replicate()] * mesh.ndim)
    positions = np.cumsum(mask.reshape(-1), dtype=np.intp) - 1
    positions = np.clip(positions, 0, count - 1).reshape(mask.shape)
    return np.take(values, positions, axis=0)


def _mask_values(name, dt, mask, values):
    """``dt[mask] = values`` for an array of values: the values go to the Trues in
    C order across every rank's block, as NumPy's assignment puts them. Each True's
    position among them is a scan of the flattened mask; each rank takes the values
    at its positions where they lie (np.take by a DTensor of indices) and copies
    them in under the mask. Returns the scalar to write instead (values of one
    element), or None once written. Collective on the mesh."""
    mesh = dt.device_mesh
    if type(mask) is not DTensor:
        mask = DTensor.from_local(np.asarray(mask), mesh, [Replicate()] * mesh.ndim)
    if type(values) is not DTensor:
        values = np.asarray(values)
    if values.ndim > 1:
        raise TypeError(f"NumPy boolean array indexing assignment requires a 0 or "
                        f"1-dimensional input, input has {values.ndim} dimensions")
    count = int(np.count_nonzero(mask))
    if values.size not in (1, count):
        raise ValueError(f"NumPy boolean array indexing assignment cannot assign "
                         f"{values.size} input values to the {count} output values "
                         f"where the mask is true")
    if values.size == 1:
        one = values.full_tensor() if type(values) is DTensor else values
        return one.reshape(())[()]
    if count == 0:
        return None
    if type(values) is not DTensor:
        values = DTensor.from_local(values, mesh, [Replicate()] * mesh.ndim)
    positions = np.cumsum(mask.reshape(-1), dtype=np.intp) - 1
    positions = np.clip(positions, 0, count - 1).reshape(dt.shape)
    np.copyto(dt, np.take(values, positions), casting="unsafe", where=mask)
    return None


@_registry.implements(np.copyto)
def copyto(dst, src, casting="same_kind", where=True) -> None:
    """``numpy.copyto`` into a DTensor: ``src`` and ``where`` (scalars, ndarrays
    every rank holds, or DTensors) broadcast to ``dst``; placements kept. Collective
    on the mesh when a DTensor operand must move to follow ``dst``, else local."""
    name = "numpy.copyto"
    if type(dst) is not DTensor:
        # An ndarray destination takes the whole source, as NumPy writes it: gathered
        # as np.asarray gathers (warned, counted; strict() refuses).
        return _registry.gather_call(np.copyto, (dst, src),
                                     {"casting": casting, "where": where}, name)
    if type(where) is DTensor and np.dtype(where.dtype) != np.bool_:
        raise TypeError(f"{name}: where= must be boolean, not {where.dtype}")
    s, kept = _local_operand(name, dst, src)
    w, _ = _local_operand(name, dst, where) if where is not True else (True, set())
    # src moved to follow dst's placements; the Partials resolved below become
    # Replicate, which it followed there already (it shares no such Partial).
    _resolve(name, dst, src)
    op = _partial_op(dst, src)
    if dst._spec.mesh._coordinate is None:
        return
    if _writes_identity(dst, kept):
        # This rank writes the identity, yet a value NumPy would not cast is every
        # rank's error: checked on an empty slice of it.
        probe = s if np.ndim(s) == 0 else np.asarray(s)[(slice(0, 0),) * np.ndim(s)]
        np.copyto(np.empty(np.shape(probe), dst.dtype), probe, casting=casting)
        s = np.array(_IDENTITY[op], dst.dtype)
    local = dst.to_local()
    _views.write(dst, lambda: np.copyto(local, s, casting=casting, where=w),
                 where=None if w is True else w)


def write_result(name, out, result) -> None:
    """Writes the DTensor ``result`` into ``out`` (the ``out=`` of an operation that
    computed it elsewhere): redistributed to ``out``'s placements first, which may
    not create a Partial. Collective on the mesh when it moves.

    Example: ``write_result("numpy.clip", out, np.clip(a, 0, 1))``.
    """
    if out.shape != result.shape:
        raise ValueError(f"{name}: out= has shape {out.shape}, the result has shape "
                         f"{result.shape}")
    _views.write(out, lambda: _write_result(name, out, result))


def _write_result(name, out, result) -> None:
    if any(isinstance(p, Partial) and p != q
           for p, q in zip(out.placements, result.placements)):
        # out keeps its placements: the value is written as copyto writes into a
        # Partial (once per reduction, the identity elsewhere).
        copyto(out, result)
        return
    result = D.relayout(name, result, out.placements)
    if out._spec.mesh._coordinate is not None:
        np.copyto(out.to_local(), result.to_local(), casting="same_kind")
