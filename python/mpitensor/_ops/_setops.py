"""The set operations of sharded DTensors without a gather: ``np.intersect1d``,
``np.setdiff1d``, ``np.setxor1d``, and ``np.isin`` with sharded test elements.

Two pieces do the work, both along the one mesh dim ``m`` that shards the sorted
array they read (``np.unique``'s values, or the sample sort's output,
``_sample_sort.sort_flat``, both in torch.chunk's blocks on ``m``):

- a lookup in a sorted table: every rank sends each of its queries to the rank
  whose block of the table could hold it (the blocks' first values, one
  all-gather of a value per rank, say which), the owner answers by a local
  ``searchsorted`` and sends the answers back; two all-to-alls of the queries'
  size, nothing of the table moves. The answer carries the table's payload at the
  match (``intersect1d``'s indices into the second array);
- the neighbours of a sorted array: each rank compares its elements with the next
  and previous ones, the ones across a block edge being the first and last
  elements of the nearest non-empty blocks (one all-gather of two values per
  rank), which is how NumPy's own set operations read their sorted
  concatenation.

What a rank keeps is then re-chunked into torch.chunk's blocks by one exchange
(``_unique._rechunk``), ``Shard(0)`` on ``m``. Equality is NumPy's ``==`` (a NaN
is never equal, as in NumPy's set operations). With ``assume_unique=True``,
``intersect1d`` and ``setxor1d`` follow NumPy's algorithm step for step, so they
give NumPy's answer even for inputs that are not unique; ``setdiff1d`` and
``isin`` give the true membership, which is NumPy's whenever the inputs are what
``assume_unique`` promises (NumPy's own answer otherwise depends on its sort).
"""

from __future__ import annotations

import numpy as np

from .. import _comm, _modes, _registry, _trace
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X
from .._algorithms import _sample_sort as S
from . import _unique as U

__all__ = ["intersect1d", "setdiff1d", "setxor1d", "isin_sharded"]


def _dtensors(name, *args):
    """The arguments as DTensors on one mesh (a plain array is every rank's: a
    Replicate DTensor made locally), Partials summed. Local unless a Partial is
    summed."""
    mesh = D.same_mesh(name, [x for x in args if type(x) is DTensor])
    out = []
    for x in args:
        if type(x) is not DTensor:
            x = np.ascontiguousarray(x)
            if x.dtype == object:
                raise _registry.NoRule(f"{name}: object arrays have no distributed rule")
            x = DTensor(x, DTensorSpec(mesh, (Replicate(),) * mesh.ndim, x.shape, x.dtype,
                                       contiguous_strides(x.shape)))
        elif any(p.is_partial() for p in x._spec.placements):
            x = D.relayout(name, x, [Replicate() if p.is_partial() else p
                                     for p in x._spec.placements])
        if x._spec.dtype.kind not in "biuf":
            raise _registry.NoRule(f"{name}: dtype {x._spec.dtype} has no distributed rule")
        out.append(x)
    if mesh.get_coordinate() is None:
        raise _registry.NoRule(f"{name}: a rank outside the mesh has no distributed rule")
    return mesh, out


def _flat_dim(name, a):
    """``(a, m)``: ``a`` as a 1-D DTensor and the mesh dim that shards it (None when
    none does), for reading it in flat order block by block. Collective on the
    mesh when ``a`` must move."""
    if a.ndim != 1:
        a = np.ravel(a)
    # A strided shard (of a flatten) becomes a plain one: blocks in flat order.
    return X.sharding_mesh_dim(name, a, 0)


def _wrap(mesh, m, local, total, dtype):
    """A 1-D DTensor of ``total`` elements: ``Shard(0)`` on ``m`` (None: Replicate)."""
    pls = tuple(Shard(0) if i == m else Replicate() for i in range(mesh.ndim))
    return DTensor(np.ascontiguousarray(local, dtype),
                   DTensorSpec(mesh, pls, (int(total),), np.dtype(dtype), (1,)))


def _compact(name, like, m, arrays, keep):
    """The elements ``keep`` selects of each local array (aligned with the 1-D
    DTensor ``like``'s block on ``m``), as 1-D DTensors in torch.chunk's blocks,
    in order. Collective along ``m`` (an all-gather of an int, an exchange per
    array); local when ``m`` is None."""
    mesh = like._spec.mesh
    if m is None:
        return [_wrap(mesh, None, a[keep], int(np.count_nonzero(keep)), a.dtype)
                for a in arrays]
    counts = _comm.allgather_int(mesh, int(np.count_nonzero(keep)), m)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(starts[-1])
    return [_wrap(mesh, m, U._rechunk(name, like._spec, m, a[keep], starts, total), total,
                  a.dtype) for a in arrays]


def _edges(name, a, m):
    """``(previous, next)``: the element just before this rank's block of the 1-D
    DTensor ``a`` (chunked on ``m``) and the one just after, or None at the ends.
    Collective along ``m`` (one all-gather of two values per rank)."""
    mesh = a._spec.mesh
    local = a.to_local()
    p, me = mesh.shape[m], mesh.get_coordinate()[m]
    mine = np.zeros(2, local.dtype)
    if len(local):
        mine[:] = local[0], local[-1]
    pls = [Shard(0) if i == m else Replicate() for i in range(mesh.ndim)]
    rows = DTensor.from_local(mine[None], mesh, pls, shape=(p, 2), stride=(2, 1))
    every = D.relayout(name, rows, [Replicate()] * mesh.ndim, records=True).to_local()
    sizes = np.diff(X.bounds(a._spec.shape[0], p))
    before = [c for c in range(me) if sizes[c] > 0]
    after = [c for c in range(me + 1, p) if sizes[c] > 0]
    return (every[before[-1], 1] if before else None,
            every[after[0], 0] if after else None)


def _neighbours(name, a, m):
    """``(equal_previous, equal_next)``: whether each local element of the sorted
    1-D DTensor ``a`` equals (``==``) the element before it and the one after.
    Collective along ``m``; local when ``m`` is None."""
    x = a.to_local()
    prev, nxt = (None, None) if m is None else _edges(name, a, m)
    eq_prev = np.zeros(len(x), bool)
    eq_next = np.zeros(len(x), bool)
    if len(x):
        eq_prev[1:] = eq_next[:-1] = x[1:] == x[:-1]
        if prev is not None:
            eq_prev[0] = x[0] == prev
        if nxt is not None:
            eq_next[-1] = x[-1] == nxt
    return eq_prev, eq_next


def _lookup(name, queries, table, payload=None):
    """``(found, at)``: whether each of this rank's ``queries`` equals an element
    of ``table`` (a sorted 1-D DTensor without repeats, ``np.unique``'s), and
    ``payload``'s element there (a local int array aligned with ``table``'s
    block; -1 where not found). Collective along the mesh dim that shards
    ``table`` (an all-gather of a value per rank, two all-to-alls of the
    queries' size); local when none does."""
    spec = table._spec
    mesh = spec.mesh
    t = table.to_local()
    m = S.sort_mesh_dim(table)
    if m is None:
        return _answer(queries, t, payload)
    p = mesh.shape[m]
    mine = np.zeros(1, t.dtype) if not len(t) else t[:1]
    pls = [Shard(0) if i == m else Replicate() for i in range(mesh.ndim)]
    firsts = D.relayout(name, DTensor.from_local(np.ascontiguousarray(mine), mesh, pls,
                                                 shape=(p,), stride=(1,)),
                        [Replicate()] * mesh.ndim, records=True).to_local()
    full = np.flatnonzero(np.diff(X.bounds(spec.shape[0], p)) > 0)
    # The owner of a query: the last non-empty block whose first element is not
    # above it; a query below every block is found nowhere and stays here.
    dest = np.full(len(queries), p, np.int64)
    if len(full):
        slot = np.searchsorted(firsts[full], queries, side="right") - 1
        dest[slot >= 0] = full[slot[slot >= 0]]
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=p + 1)[:p]
    send = np.ascontiguousarray(queries[order][:int(counts.sum())])
    if _modes.tracing:
        _trace.collective(f"{name}: lookup exchange", mesh, spec.placements, spec.shape,
                          spec.dtype)
    got, back = _comm.alltoallv(mesh, send, counts.tolist(), m)
    hit, at = _answer(got, t, payload)
    reply = np.stack([hit.astype(np.int64), at.astype(np.int64)], axis=1)
    answered, _ = _comm.alltoallv(mesh, np.ascontiguousarray(reply), list(back), m)
    found = np.zeros(len(queries), bool)
    where = np.full(len(queries), -1, np.int64)
    sent = order[:len(answered)]
    found[sent] = answered[:, 0].astype(bool)
    where[sent] = answered[:, 1]
    return found, where


def _answer(queries, t, payload):
    """The local half of :func:`_lookup`: ``queries`` found in the sorted block
    ``t``, with ``payload`` there (-1 elsewhere)."""
    pos = np.searchsorted(t, queries, side="left")
    inside = pos < len(t)
    hit = np.zeros(len(queries), bool)
    hit[inside] = t[pos[inside]] == queries[inside]
    at = np.full(len(queries), -1, np.int64)
    if payload is not None:
        at[hit] = payload[pos[hit]]
    return hit, at


def _cast(a, dtype):
    """``a`` in ``dtype``. Local."""
    return a if a._spec.dtype == dtype else a.astype(dtype)


def _unique_of(name, a, with_index):
    """``np.unique`` of a DTensor (values, and first indices when asked), as a
    tuple."""
    mesh = a._spec.mesh
    cuts = [m for m, p in enumerate(a._spec.placements) if p.is_shard() and mesh.shape[m] > 1]
    if len(cuts) > 1:  # unique's sample sort runs along one mesh dim: keep the first
        a = D.relayout(name, a, [p if m == cuts[0] or not p.is_shard() else Replicate()
                                 for m, p in enumerate(a._spec.placements)])
    got = np.unique(a, return_index=with_index)
    return got if isinstance(got, tuple) else (got,)


@_registry.implements(np.intersect1d)
def intersect1d(ar1, ar2, assume_unique=False, return_indices=False):
    """``np.intersect1d`` with a DTensor: the sorted values of both, and with
    ``return_indices`` the first index of each in either array. The unique
    values of the first (``np.unique``, the sample sort) are looked up in those
    of the second where they lie (two all-to-alls of the first's unique values,
    no gather); with ``assume_unique`` the two are joined, sorted and compared
    with their neighbours, as NumPy does. Results ``Shard(0)`` along the mesh dim
    that shards the first's values. Collective on the mesh.

    Example: ``np.intersect1d(dt, [2, 3, 4])`` of a ``[Shard(0)]`` DTensor.
    """
    name = "numpy.intersect1d"
    mesh, (a, b) = _dtensors(name, ar1, ar2)
    dtype = np.result_type(a._spec.dtype, b._spec.dtype)
    if assume_unique:
        return _intersect_sorted(name, a, b, dtype, return_indices)
    ua = _unique_of(name, a, return_indices)
    ub = _unique_of(name, b, return_indices)
    if any(S.sort_mesh_dim(u) is None and u._spec.placements != (Replicate(),) * mesh.ndim
           for u in (ua[0], ub[0])):
        raise _registry.NoRule(f"{name}: unique values sharded along two mesh dims")
    vals = ua[0].to_local().astype(dtype)
    found, at = _lookup(name, vals, _cast(ub[0], dtype),
                        ub[1].to_local() if return_indices else None)
    arrays = [vals] + ([ua[1].to_local(), at.astype(np.intp)] if return_indices else [])
    got = _compact(name, ua[0], S.sort_mesh_dim(ua[0]), arrays, found)
    return tuple(got) if return_indices else got[0]


def _sorted_concat(name, a, b, dtype, indices):
    """The sorted flattened join of ``a`` and ``b`` in ``dtype`` (and its stable
    argsort when ``indices``), 1-D DTensors in the same blocks, with the mesh dim
    that shards them (None: every rank holds them whole). Collective on the
    mesh."""
    aux = np.append(_cast(a, dtype), _cast(b, dtype))
    m = S.sort_mesh_dim(aux)
    if m is None:
        if any(p.is_shard() and aux._spec.mesh.shape[i] > 1
               for i, p in enumerate(aux._spec.placements)):
            raise _registry.NoRule(f"{name}: an array sharded along two mesh dims has no "
                                   f"distributed rule")
        whole = aux.to_local()
        order = np.argsort(whole, kind="stable")
        mesh = aux._spec.mesh
        n = len(whole)
        return (_wrap(mesh, None, whole[order], n, dtype),
                _wrap(mesh, None, order, n, np.intp) if indices else None, None)
    vals = S.sort_flat(name, aux, False)
    order = S.sort_flat(name, aux, True) if indices else None
    return vals, order, m


def _intersect_sorted(name, a, b, dtype, return_indices):
    """intersect1d with assume_unique: NumPy's own steps (a stable sort of the
    join, equal neighbours), distributed."""
    n1 = int(np.prod(a._spec.shape))
    vals, order, m = _sorted_concat(name, a, b, dtype, return_indices)
    _, eq_next = _neighbours(name, vals, m)
    arrays = [vals.to_local()]
    if return_indices:
        idx = order.to_local()
        nxt = None if m is None else _edges(name, order, m)[1]
        after = np.append(idx[1:], [-1 if nxt is None else nxt]).astype(np.intp)
        arrays += [idx, after - n1]
    got = _compact(name, vals, m, arrays, eq_next)
    return tuple(got) if return_indices else got[0]


@_registry.implements(np.setdiff1d)
def setdiff1d(ar1, ar2, assume_unique=False):
    """``np.setdiff1d`` with a DTensor: the values of the first that are not in the
    second, sorted and unique (in the first's order with ``assume_unique``). The
    first's values are looked up in the second's unique values where they lie
    (two all-to-alls of the first's size, no gather). Result ``Shard(0)`` along
    the mesh dim that shards the first. Collective on the mesh.

    Example: ``np.setdiff1d(dt, [0, 1])`` of a ``[Shard(0)]`` DTensor.
    """
    name = "numpy.setdiff1d"
    mesh, (a, b) = _dtensors(name, ar1, ar2)
    if assume_unique:
        a, m = _flat_dim(name, a)
    else:
        a = _unique_of(name, a, False)[0]
        m = S.sort_mesh_dim(a)
    table = _unique_of(name, b, False)[0]
    if S.sort_mesh_dim(table) is None and table._spec.placements != (Replicate(),) * mesh.ndim:
        raise _registry.NoRule(f"{name}: unique values sharded along two mesh dims")
    local = a.to_local()
    # Compared as NumPy compares them: both in their common dtype.
    dtype = np.result_type(a._spec.dtype, table._spec.dtype)
    found, _ = _lookup(name, local.astype(dtype, copy=False), _cast(table, dtype))
    return _compact(name, a, m, [local], ~found)[0]


@_registry.implements(np.setxor1d)
def setxor1d(ar1, ar2, assume_unique=False):
    """``np.setxor1d`` with a DTensor: the sorted values in exactly one of the two.
    The unique values of both (``np.unique``) are joined, sorted by the sample
    sort and each kept when it equals neither neighbour, NumPy's steps, with no
    gather. Result ``Shard(0)`` along the mesh dim that shards the sorted join.
    Collective on the mesh.

    Example: ``np.setxor1d(dt, [0, 1])`` of a ``[Shard(0)]`` DTensor.
    """
    name = "numpy.setxor1d"
    mesh, (a, b) = _dtensors(name, ar1, ar2)
    dtype = np.result_type(a._spec.dtype, b._spec.dtype)
    if not assume_unique:
        a, b = _unique_of(name, a, False)[0], _unique_of(name, b, False)[0]
    vals, _, m = _sorted_concat(name, a, b, dtype, False)
    eq_prev, eq_next = _neighbours(name, vals, m)
    return _compact(name, vals, m, [vals.to_local()], ~(eq_prev | eq_next))[0]


def isin_sharded(name, element, test_elements, invert, kind):
    """``np.isin(element, test_elements)`` where ``test_elements`` is a DTensor that
    a mesh dim shards: each rank's elements are looked up in the test elements'
    unique values (``np.unique``, the sample sort) where they lie, two
    all-to-alls of the elements' size, no gather. The result has ``element``'s
    placements (Replicate for a plain array). Collective on the mesh.

    Example: ``isin_sharded("numpy.isin", dt, other, False, None)``.
    """
    mesh, (x, t) = _dtensors(name, element, test_elements)
    # NumPy's checks of kind=, on every rank alike before anything moves.
    np.isin(np.zeros(0, x._spec.dtype), np.zeros(0, t._spec.dtype), kind=kind)
    table = _unique_of(name, t, False)[0]
    if S.sort_mesh_dim(table) is None and table._spec.placements != (Replicate(),) * mesh.ndim:
        raise _registry.NoRule(f"{name}: unique values sharded along two mesh dims")
    local = x.to_local()
    dtype = np.result_type(x._spec.dtype, t._spec.dtype)
    found, _ = _lookup(name, local.reshape(-1).astype(dtype, copy=False), _cast(table, dtype))
    out = (found != bool(invert)).reshape(local.shape)
    spec = x._spec
    return DTensor(np.ascontiguousarray(out), DTensorSpec(
        mesh, spec.placements, spec.shape, np.dtype(bool), contiguous_strides(spec.shape)))
